"""Wire the simulated pipeline together and run it.

```
 SimBuffer.admit ──groups──► SimEngine × E ──complete groups──► SimBuffer ──B groups──► SimTrainer
      ▲  (staleness budget)       ▲                                                     │
      │                           └───── weights (send S_t, then each engine swaps S_e) ◄┘
      └──── budget grows when every engine has swapped in the new version
```
A prompt group goes whole to the engine with the fewest running + waiting rollouts, so its G
samples share one prefill.
"""

from __future__ import annotations

import logging

import simpy

from tokenflow.config.sim import SimConfig
from tokenflow.sim.buffer import SimBuffer
from tokenflow.sim.costs import Costs
from tokenflow.sim.engine import SimEngine
from tokenflow.sim.metrics import SimResult, summarise
from tokenflow.sim.recorder import Recorder
from tokenflow.sim.rollouts import SimGroup
from tokenflow.sim.trainer import SimTrainer, TrainerState
from tokenflow.sim.workload import LengthSampler

log = logging.getLogger(__name__)

# Prompt groups admitted beyond what the simulated steps consume, in steps' worth: enough to
# keep the engines as busy at the end as in the middle of the run.
_EXTRA_STEPS_ADMITTED = 2


def simulate(cfg: SimConfig) -> SimResult:
    """Run the discrete-event simulation of ``cfg`` and summarise it."""
    env = simpy.Environment()
    costs = Costs.from_config(cfg)
    w, p, hw = cfg.workload, cfg.pipeline, cfg.hardware
    recorder = Recorder(hw.engines)
    state = TrainerState()
    engines: list[SimEngine] = []

    def dispatch(group: SimGroup) -> None:
        min(engines, key=lambda e: e.load).submit(group)

    def swapped() -> None:
        buffer.set_engine_version(min(e.version for e in engines))

    buffer = SimBuffer(
        env,
        rollouts_per_step=w.rollouts_per_step,
        max_staleness=p.max_staleness,
        group_size=w.group_size,
        max_groups=(cfg.sim.steps + _EXTRA_STEPS_ADMITTED) * w.prompts_per_step,
        sampler=LengthSampler(w, cfg.sim.seed),
        dispatch=dispatch,
        batch_order=p.batch_order,
    )
    for i in range(hw.engines):
        engines.append(SimEngine(env, i, costs=costs, update_mode=p.update_mode,
                                 max_running=hw.max_running_seqs, prefix_sharing=hw.prefix_sharing,
                                 trainer=state, recorder=recorder, on_group_done=buffer.group_done,
                                 on_swapped=swapped))
    trainer = SimTrainer(env, costs=costs, buffer=buffer, engines=engines, state=state,
                         recorder=recorder, steps=cfg.sim.steps, prompts_per_step=w.prompts_per_step,
                         sync_every=p.sync_every, max_token_age=p.max_token_age,
                         transport=p.transport,
                         notify_engines=p.update_mode == "blocking" or costs.engine_slowdown > 0)
    buffer.admit()
    env.run(until=trainer.process)
    log.debug("simulated %d steps in %.1f simulated s", cfg.sim.steps, env.now)
    return summarise(cfg, costs, recorder)

"""Component timings of a run, written to ``calibration.json`` for ``tokenflow simulate --calibrate``.

Only component measurements go in (decode steps, prefills, trainer steps, syncs, lengths); the
wall time and idle fractions sit under ``measured`` so a calibration can be checked against them,
never fitted to them.
"""

from __future__ import annotations

import random
from pathlib import Path

from tokenflow.metrics.sinks import dumps_strict
from tokenflow.metrics.safe_files import write_atomic

MAX_SAMPLES = 20_000  # per series; reservoir-sampled beyond this


class _Reservoir(list):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seen = 0
        self.rng = random.Random(seed)

    def add(self, item) -> None:
        self.seen += 1
        if len(self) < MAX_SAMPLES:
            self.append(item)
        else:
            j = self.rng.randrange(self.seen)
            if j < MAX_SAMPLES:
                self[j] = item


class CalibrationLog:
    def __init__(self) -> None:
        self.decode = _Reservoir(1)
        self.prefill = _Reservoir(2)
        self.completion_lengths = _Reservoir(3)
        self.prompt_lengths = _Reservoir(4)
        self.trainer_steps: list[list[float]] = []
        self.sync_updates: list[list[float]] = []
        self.engine_pauses: list[float] = []

    def engine_status(self, status) -> None:
        for n, s in status.decode_samples:
            self.decode.add([int(n), float(s)])
        for n, s in status.prefill_samples:
            self.prefill.add([int(n), float(s)])

    def rollouts(self, rollouts) -> None:
        for r in rollouts:
            self.completion_lengths.add(int(r.num_tokens))
        if rollouts:
            self.prompt_lengths.add(len(rollouts[0].prompt_ids))

    def trainer_step(self, msg) -> None:
        self.trainer_steps.append([msg.num_tokens, msg.train_s])
        if "sync/bytes" in msg.metrics:  # the trainer's side of a sync: it blocks the trainer
            self.sync_updates.append([msg.metrics["sync/bytes"], msg.sync_s])

    def sync(self, timings: list[dict]) -> None:
        for t in timings:
            self.engine_pauses.append(t.get("sync/engine_pause_s", 0.0))

    def write(self, path: str | Path, cfg, summary: dict) -> None:
        data = {
            "run": {"mode": summary["mode"], "prompts_per_step": cfg.rollout.prompts_per_step,
                    "group_size": cfg.rollout.group_size, "max_staleness": cfg.rollout.max_staleness,
                    "steps": summary["steps"], "update_mode": cfg.engine.update_mode,
                    "sync_every": cfg.sync.every, "wall_s": summary["train_wall_s"],
                    "engine_threads": cfg.engine.threads, "trainer_threads": cfg.trainer.threads},
            "engine": {"decode_steps": list(self.decode), "prefill": list(self.prefill)},
            "completion_lengths": list(self.completion_lengths),
            "prompt_lengths": list(self.prompt_lengths),
            "trainer": {"steps": self.trainer_steps},
            "sync": {"updates": self.sync_updates, "engine_pauses": self.engine_pauses},
            "measured": {"wall_s": summary["train_wall_s"], "steps": summary["steps"],
                         "trainer_idle_frac": summary["trainer_idle_frac"],
                         "engine_idle_frac": summary["engine_idle_frac"]},
        }
        write_atomic(path, dumps_strict(data))

"""What the orchestrator sends the engines: groups to generate (to the least loaded engine that
takes work), groups again after a restart or a removal, the weight-sync spec after a restart,
and the blocking mode's pause and resume.

A restarted engine (Ray backend), shared memory: the new process attaches to the same slots and
loads the newest one. Broadcast: a gloo/NCCL group cannot take in a new member, so the trainer
builds a new group (``ReformSync``), every engine gets its spec (``attach_reformed``), and the
trainer pushes the current weights through it; no engine generates before it holds at least those.

Every function takes the run's `RunState` and the `Backend`.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator.run_state import RunState
from tokenflow.runtime.orchestrator.seeds import request_seed
from tokenflow.runtime.workers import messages as M

log = logging.getLogger("tokenflow.runtime.orchestrator.orchestrator")


def episode_spec(cfg, prompt):
    """An environment task's episode for ``prompt`` (None for single-turn tasks)."""
    if not getattr(cfg.task, "env", None):
        return None
    from tokenflow.runtime.drivers.episodes import EpisodeSpec

    e = cfg.episode
    return EpisodeSpec(cfg.task.env, prompt.example, e.max_turns, e.max_total_tokens, e.step_timeout_s,
                       agent=cfg.task.agent, agent_timeout_s=e.agent_timeout_s, options=dict(cfg.task.options))


def send_generate(state: RunState, backend: Backend, gid: int, prompt, kind: str, params, kept: tuple = ()) -> None:
    """Group ``gid`` to the least loaded engine that takes work."""
    episode = episode_spec(state.cfg, prompt)
    ids = [] if episode is not None else state.encode(prompt.text)  # an episode's reset gives its prompt
    # An engine that is joining takes no work before it holds the current weights.
    engine = min((h for h in backend.engines if h.accepting), key=lambda h: h.load)
    engine.load += params.n
    state.group_engine[gid] = (engine, params.n)
    engine.send(M.Generate(gid, prompt.id, ids, params, kind, episode=episode, kept=kept))


def train_params_for(state: RunState, prompt):
    """A training group's sampling parameters: the prompt's own seed (the same samples on resume
    and after a restart)."""
    return dataclasses.replace(state.train_params, seed=request_seed(state.cfg.run.seed, prompt.id))


def readmit(state: RunState, backend: Backend, heldout, gids) -> None:
    """Send ``gids`` again (to the engines that take work), each with its original seed: the same
    prompt, the same samples. After a restart, and for an engine removed from the run."""
    for gid in gids:
        del state.group_engine[gid]
        if gid < 0:
            prompt, kind, params = heldout.prompt(gid), "eval", heldout.params
        else:
            prompt, kind = state.prompts[gid], "train"
            params = train_params_for(state, prompt)
        send_generate(state, backend, gid, prompt, kind, params)


def maybe_unpause(state: RunState, backend: Backend) -> None:
    """Blocking mode: resume generation once the trainer is idle and the engines hold the latest
    weights. Checked when a load lands and when a step or a save ends, since either may come
    first; never while a step runs (a load landing after the next dispatch would otherwise let
    the engine generate during training)."""
    if state.blocking and not state.trainer_busy and min(state.engine_versions.values()) >= state.step:
        backend.broadcast(M.SetPaused(False))


def resend_after_restart(state: RunState, backend: Backend, heldout, msg: M.WorkerRestarted) -> None:
    """A replacement engine process is up; what the dead one held is gone. Re-send the sync spec
    (it attaches and loads the newest weights before generating) and its in-flight groups, with
    their original seeds. ``engine_versions`` keeps the dead engine's version until the new one
    reports a load: it cannot load anything older."""
    index, engine = next((i, h) for i, h in enumerate(backend.engines) if h.name == msg.worker)
    lost = sorted(gid for gid, (h, _) in state.group_engine.items() if h is engine)
    log.warning("%s restarted (restart %d); re-sending its in-flight groups %s", msg.worker, msg.restarts, lost)
    state.last_msg_from[msg.worker] = time.monotonic()
    engine.load = 0
    # The new process counts from zero: keep the dead one's totals (not its gauges).
    last = state.engine_totals.per_engine.pop(msg.worker, None)
    if last is not None:
        state.engine_totals.per_engine[f"{msg.worker}#{msg.restarts}"] = dataclasses.replace(
            last, running=0, waiting=0)
    if state.sync_spec is not None:
        if state.cfg.sync.transport == "broadcast":  # AttachSync follows, with the new group's spec
            backend.trainer.send(M.ReformSync(msg.worker))
        else:
            # Not a version older than any engine holds: the slots hold at least that one.
            engine.send(M.AttachSync(state.sync_spec, receiver_index=index,
                                     min_version=max(state.engine_versions.values())))
    if state.blocking and state.trainer_busy:
        engine.send(M.SetPaused(True))
    readmit(state, backend, heldout, lost)


def attach_reformed(state: RunState, backend: Backend, msg: M.SyncReformed) -> None:
    """The trainer's new broadcast group waits for every engine; it pushes ``msg.version`` next."""
    log.warning("weight-sync group re-formed; the engines join it and load version %d", msg.version)
    state.sync_broken = None
    state.sync_spec = msg.sync_spec
    for i, engine in enumerate(backend.engines):
        engine.send(M.AttachSync(msg.sync_spec, receiver_index=i, min_version=msg.version))

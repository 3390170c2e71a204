"""What the orchestrator does when the backend reports a restarted engine (Ray backend).

Shared memory: the new process attaches to the same slots and loads the newest one. Broadcast: a
gloo/NCCL group cannot take in a new member, so the trainer builds a new group (``ReformSync``),
the orchestrator hands its spec to every engine (``attach_reformed``), and the trainer pushes the
current weights through it; no engine generates before it holds at least those."""

from __future__ import annotations

import dataclasses
import logging
import time

from tokenflow.runtime.workers import messages as M
from tokenflow.runtime.orchestrator.seeds import request_seed

log = logging.getLogger("tokenflow.runtime.orchestrator.orchestrator")


def resend_after_restart(orch, msg: M.WorkerRestarted) -> None:
    """A replacement engine process is up (Ray backend); what the dead one held is gone.
    Re-send the sync spec (it attaches and loads the newest weights before generating) and
    its in-flight groups, with their original seeds. ``engine_versions`` keeps the dead
    engine's version until the new one reports a load: it cannot load anything older."""
    index, engine = next((i, h) for i, h in enumerate(orch.backend.engines) if h.name == msg.worker)
    lost = sorted(gid for gid, (h, _) in orch.group_engine.items() if h is engine)
    log.warning("%s restarted (restart %d); re-sending its in-flight groups %s", msg.worker, msg.restarts, lost)
    orch.last_msg_from[msg.worker] = time.monotonic()
    engine.load = 0
    # The new process counts from zero: keep the dead one's totals (not its gauges).
    last = orch.engine_totals.per_engine.pop(msg.worker, None)
    if last is not None:
        orch.engine_totals.per_engine[f"{msg.worker}#{msg.restarts}"] = dataclasses.replace(
            last, running=0, waiting=0)
    if orch.sync_spec is not None:
        if orch.cfg.sync.transport == "broadcast":  # AttachSync follows, with the new group's spec
            orch.backend.trainer.send(M.ReformSync(msg.worker))
        else:
            # Not a version older than any engine holds: the slots hold at least that one.
            engine.send(M.AttachSync(orch.sync_spec, receiver_index=index,
                                     min_version=max(orch.engine_versions.values())))
    if orch.blocking and orch.trainer_busy:
        engine.send(M.SetPaused(True))
    readmit(orch, lost)


def readmit(orch, gids) -> None:
    """Send ``gids`` again (to the engines that take work), each with its original seed: the same
    prompt, the same samples. After a restart, and for an engine removed from the run."""
    for gid in gids:
        del orch.group_engine[gid]
        if gid < 0:
            prompt, kind, params = orch.heldout.prompt(gid), "eval", orch.heldout.params
        else:
            prompt, kind = orch.prompts[gid], "train"
            params = dataclasses.replace(orch.train_params, seed=request_seed(orch.cfg.run.seed, prompt.id))
        orch._send_generate(gid, prompt, kind, params)


def attach_reformed(orch, msg: M.SyncReformed) -> None:
    """The trainer's new broadcast group waits for every engine; it pushes ``msg.version`` next."""
    log.warning("weight-sync group re-formed; the engines join it and load version %d", msg.version)
    orch.sync_broken = None
    orch.sync_spec = msg.sync_spec
    for i, engine in enumerate(orch.backend.engines):
        engine.send(M.AttachSync(msg.sync_spec, receiver_index=i, min_version=msg.version))

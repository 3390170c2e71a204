"""Checkpoints from the orchestrator's side: taken as a step ends, closed in the background,
with the rollouts in flight kept.

    step N ends ─► begin: staging folder, the orchestrator's and the buffer's state, the groups
                   being scored; Save ─► trainer, ReportInFlight ─► every engine
    Saved ─────► the trainer holds a copy of its state and trains on: the stall ends here
                 (``time/checkpoint_stall_s`` in the next step's row)
    SaveWritten (the trainer's files) + every engine's InFlight ─► the commit thread writes
                 orchestrator.json, buffer.*, inflight.*, the manifest, and renames
                 (``RunDir.commit_checkpoint``) ─► `poll` sees it done

With ``run.checkpoint_background = false`` the same steps run one after the other before the
trainer gets its next batch: the trainer writes before it answers, the commit runs in the loop.

In flight at a checkpoint are the admitted groups not yet scored: being generated (the engines
report finished samples and the running ones' tokens so far), or being scored (whole, kept
here). Tokens from weights newer than the checkpoint (an engine may load step N+1's weights
before it answers) are cut off: the resumed trainer is at version N. A resume hands each kept
group back to an engine (`Generate.kept`), which continues it; `resume_counts` says how much
was kept and how much is generated again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tokenflow.errors import CheckpointError
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator import run_state
from tokenflow.runtime.orchestrator.routing import maybe_unpause
from tokenflow.runtime.orchestrator.run_state import RunFailed, RunState
from tokenflow.runtime.run.inflight_files import encode_inflight, trim_to_version
from tokenflow.runtime.workers import messages as M

log = logging.getLogger(__name__)


@dataclass
class PendingCheckpoint:
    """One checkpoint from ``begin`` to its commit."""

    step: int
    staging: Path
    state: dict
    buffer_state: dict
    t0: float
    awaiting: set[str]  # engines that have not answered ReportInFlight yet
    in_flight: set[int]  # group ids admitted and not scored when it was taken
    kept: dict[int, list] = field(default_factory=dict)
    unkeepable: set[int] = field(default_factory=set)
    trainer_free: bool = False
    written: M.SaveWritten | None = None
    future: Future | None = None


class Checkpointer:
    def __init__(self, state: RunState, backend: Backend) -> None:
        self.state, self.backend = state, backend
        self.background = state.cfg.run.checkpoint_background
        self.pending: list[PendingCheckpoint] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenflow-checkpoint")
        self.stalls: list[float] = []
        self.totals: list[float] = []  # begin to committed
        self._row: dict[str, float] = {}  # figures for the next metrics row

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    # ---- taking one ------------------------------------------------------------------------
    def begin(self) -> None:
        state, backend = self.state, self.backend
        t0 = time.monotonic()
        staging = state.run_dir.staging_dir(state.step)
        state.trainer_busy = True
        state.last_msg_from[backend.trainer.name] = time.monotonic()
        backend.trainer.send(M.Save(str(staging), background=self.background))
        in_flight = set(state.buffer.in_flight) - set(state.buffer.ready)
        episodes = bool(getattr(state.cfg.task, "env", None))  # an episode's state lives in objects
        p = PendingCheckpoint(state.step, staging, run_state.state_of(state), state.buffer.state_dict(), t0,
                              set() if episodes else {h.name for h in backend.engines}, in_flight,
                              unkeepable=set(in_flight) if episodes else set())
        if not episodes:
            p.kept = {gid: list(rs) for gid, rs in state.scoring.items() if gid in in_flight}
            for h in backend.engines:
                h.send(M.ReportInFlight(state.step))
        self.pending.append(p)

    def on_saved(self, msg: M.Saved) -> None:
        p = next((p for p in self.pending if not p.trainer_free), None)
        if p is None:  # written inline (not in the background): committed already
            return
        p.trainer_free = True
        if self.background:
            self._row["time/checkpoint_write_wait_s"] = msg.waited_s
            self._free_trainer(p)

    def on_written(self, msg: M.SaveWritten) -> None:
        p = next(p for p in self.pending if str(p.staging) == msg.directory)
        if msg.error:
            self.state.run_dir.discard_staging(p.staging)
            raise RunFailed(self.state.run_dir.write_failure(p.step, msg.error, msg.errno))
        p.written = msg
        p.trainer_free = True  # the files are written from its copy (or, inline, before it answered)
        self._maybe_commit(p)

    def on_inflight(self, worker: str, msg: M.InFlight) -> None:
        p = next((p for p in self.pending if p.step == msg.step and worker in p.awaiting), None)
        if p is None:
            return
        p.awaiting.discard(worker)
        for gid, rollouts in msg.groups.items():
            if gid in p.in_flight and gid not in p.kept:  # one being scored is whole already
                p.kept[gid] = rollouts
        p.unkeepable |= set(msg.unkeepable) & p.in_flight
        self._maybe_commit(p)

    def engine_gone(self, name: str) -> None:
        """An engine was replaced: what it held is gone, and it will not answer."""
        for p in self.pending:
            if name in p.awaiting:
                p.awaiting.discard(name)
                self._maybe_commit(p)

    def _maybe_commit(self, p: PendingCheckpoint) -> None:
        if p.written is None or p.awaiting or p.future is not None:
            return
        if self.background:
            p.future = self._pool.submit(self._commit, p)
            return
        p.future = Future()
        try:
            p.future.set_result(self._commit(p))
        except CheckpointError as e:
            p.future.set_exception(e)
        self.poll()

    def _commit(self, p: PendingCheckpoint) -> Path:
        kept = {}
        for gid, rollouts in p.kept.items():
            trimmed = [trim_to_version(r, p.step) for r in rollouts]
            trimmed = [r for r in trimmed if r.num_tokens > 0]
            if trimmed:
                kept[gid] = trimmed
        files = encode_inflight(p.step, kept, sorted(p.unkeepable))
        return self.state.run_dir.commit_checkpoint(p.staging, p.step, p.state, p.buffer_state,
                                                    self.state.cfg.run.keep_checkpoints, files)

    def poll(self) -> None:
        """Finish the checkpoints whose commit is done (a failed one stops the run), and stop the
        run when one waits past ``runtime.worker_timeout_s``, naming what it waits for."""
        limit = self.state.cfg.runtime.worker_timeout_s
        for p in self.pending:
            if p.future is None and time.monotonic() - p.t0 > limit:
                waits = ([] if p.written is not None else ["the trainer's write (SaveWritten)"]) + \
                    ([f"the in-flight report of {', '.join(sorted(p.awaiting))}"] if p.awaiting else [])
                raise RunFailed(f"checkpoint step_{p.step:06d} was not finished within {limit:g}s "
                                f"(runtime.worker_timeout_s): still waiting for {' and '.join(waits)}")
        for p in [p for p in self.pending if p.future is not None and p.future.done()]:
            try:
                path = p.future.result()
            except CheckpointError as e:
                raise RunFailed(str(e)) from None
            log.debug("checkpoint %s", path)
            self.pending.remove(p)
            total = time.monotonic() - p.t0
            self.totals.append(total)
            self._row["time/checkpoint_total_s"] = total
            if not self.background:
                self._free_trainer(p)

    def _free_trainer(self, p: PendingCheckpoint) -> None:
        stall = time.monotonic() - p.t0
        self.stalls.append(stall)
        self._row["time/checkpoint_stall_s"] = stall
        if self.state.pending_batch is None:  # a healed trainer may have a replayed step queued after the save
            self.state.trainer_busy = False
        maybe_unpause(self.state, self.backend)  # blocking mode: a load that landed during the save unpauses nothing

    # ---- reporting, closing ----------------------------------------------------------------
    def take_metrics(self) -> dict[str, float]:
        """The figures of checkpoints finished since the last call (for a step's metrics row)."""
        row, self._row = self._row, {}
        return row

    def summary(self) -> dict:
        s = self.stalls
        return {"checkpoints": len(self.totals), "background": self.background,
                "stall_s_mean": sum(s) / len(s) if s else None, "stall_s_max": max(s) if s else None,
                "total_s_mean": sum(self.totals) / len(self.totals) if self.totals else None}

    def close(self) -> None:
        """Let a commit under way finish (so the last checkpoint named is whole); the staging
        folders of checkpoints that never got that far go."""
        self._pool.shutdown(wait=True)
        for p in self.pending:
            if p.future is None:
                self.state.run_dir.discard_staging(p.staging)


def resume_kept(state: RunState, kept: dict, unkeepable: list[int], source: str) -> dict[int, tuple]:
    """The kept rollouts of each in-flight group a resume regenerates (checked against its
    prompt), and ``state.resume_counts``: rollouts kept (finished or partial) and their tokens,
    rollouts generated again, rollouts whose state could not be kept."""
    n, max_tokens = state.cfg.rollout.group_size, state.cfg.sampling.max_tokens
    counts: Counter = Counter()
    out = {}
    pending = {gid for gid in state.buffer.in_flight if gid not in state.buffer.ready}
    stray = sorted(set(kept) - pending)
    if stray:
        raise CheckpointError(f"{source} holds groups {stray[:5]} that the buffer does not list as in flight; the "
                              "checkpoint is damaged or not tokenflow's: delete it to resume from the one before")
    for gid in sorted(pending):
        if gid in unkeepable:
            counts["unkeepable_rollouts"] += n
            continue
        rollouts = kept.get(gid, [])
        prompt_ids = state.encode(state.prompts[gid].text) if rollouts else []
        good = {}
        for r in rollouts:
            if r.sample_index >= n or r.sample_index in good or r.prompt_ids.tolist() != prompt_ids:
                raise CheckpointError(f"{source} holds a rollout of group {gid} that is not one of its prompt's "
                                      f"{n} samples; the checkpoint is damaged or not tokenflow's: delete it to "
                                      "resume from the one before")
            if r.finish_reason == "abort" and r.num_tokens >= max_tokens:
                continue  # sampling.max_tokens was lowered: nothing left to continue
            good[r.sample_index] = r
        counts["kept_rollouts"] += len(good)
        counts["kept_tokens"] += sum(r.num_tokens for r in good.values())
        counts["kept_finished_rollouts"] += sum(r.finish_reason != "abort" for r in good.values())
        counts["regenerated_rollouts"] += n - len(good)
        if good:
            out[gid] = tuple(good[i] for i in sorted(good))
    state.resume_counts = {k: counts[k] for k in ("kept_rollouts", "kept_finished_rollouts", "kept_tokens",
                                                 "regenerated_rollouts", "unkeepable_rollouts")}
    if pending:
        log.info("resuming %d in-flight groups: %d rollouts kept (%d of them finished; %d tokens), %d generated again, "
                 "%d not keepable (environment state)", len(pending), *state.resume_counts.values())
    return out

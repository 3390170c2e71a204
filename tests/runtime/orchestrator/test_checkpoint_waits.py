"""No checkpoint waits for ever: one not finished within ``runtime.worker_timeout_s`` stops the
run, naming what it still waits for (the review's hang: a healed trainer that never re-sent the
save left the run looping after its last step)."""

from __future__ import annotations

import time

import pytest

from tests.runtime.runtime_testlib import small_config
from tokenflow.buffer import RolloutBuffer
from tokenflow.runtime.orchestrator.checkpoints import Checkpointer, PendingCheckpoint
from tokenflow.runtime.orchestrator.run_state import RunFailed, RunState
from tokenflow.runtime.run.run_dir import RunDir


def _checkpointer(tmp_path, timeout_s: float) -> Checkpointer:
    cfg = small_config("--runtime.worker_timeout_s", str(timeout_s))
    r = cfg.rollout
    state = RunState(cfg=cfg, run_dir=RunDir(tmp_path / "run").create(), task=None,
                     buffer=RolloutBuffer(r.prompts_per_step, r.group_size, r.max_staleness),
                     encode=lambda text: [], train_params=None, blocking=False)
    return Checkpointer(state, backend=None)


def _pending(step: int, age_s: float, awaiting: set[str]) -> PendingCheckpoint:
    return PendingCheckpoint(step, staging=None, state={}, buffer_state={}, t0=time.monotonic() - age_s,
                             awaiting=awaiting, in_flight=set())


def test_a_checkpoint_past_the_worker_timeout_stops_the_run_naming_what_it_waits_for(tmp_path):
    c = _checkpointer(tmp_path, timeout_s=5)
    c.pending.append(_pending(3, age_s=1, awaiting={"engine"}))
    c.poll()  # young: it waits
    c.pending.append(_pending(4, age_s=6, awaiting={"engine1", "engine0"}))
    with pytest.raises(RunFailed) as e:
        c.poll()
    assert str(e.value) == ("checkpoint step_000004 was not finished within 5s (runtime.worker_timeout_s): still "
                            "waiting for the trainer's write (SaveWritten) and the in-flight report of engine0, engine1")
    c.close()

"""Checkpoints: one whose write was interrupted or damaged is never loaded; a full disk while
writing one leaves the previous one intact; what a killed run left in /dev/shm is removed."""

from __future__ import annotations

import errno
import os
import multiprocessing as mp
from multiprocessing import resource_tracker, shared_memory, synchronize

import pytest

from tokenflow.runtime.run import run_dir
from tokenflow.runtime.run.run_dir import CheckpointError, RunDir, verify_checkpoint
from tokenflow.runtime.run.resources import RunInUse, leftovers, run_resources, run_tag


def write_checkpoint(rd: RunDir, step: int, keep: int = 3):
    staging = rd.staging_dir(step)
    (staging / "model").mkdir()
    (staging / "model" / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (staging / "trainer_state.pt").write_bytes(b"state %d" % step)
    return rd.commit_checkpoint(staging, step, {"step": step, "cursor": step, "next_group_id": step},
                                EMPTY_BUFFER, keep)


EMPTY_BUFFER = {"engine_version": 0, "rollouts_admitted": 0, "in_flight": [], "ready": {}, "age_histogram": {},
                "groups_dropped": 0, "flat_groups_kept": 0}


def test_a_damaged_or_unfinished_checkpoint_is_never_loaded(tmp_path):
    rd = RunDir(tmp_path).create()
    write_checkpoint(rd, 2)
    four = write_checkpoint(rd, 4)
    assert rd.latest_checkpoint() == four and verify_checkpoint(four) is None
    # A torn file (same name, fewer bytes) in the newest checkpoint:
    weights = four / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert "model/model.safetensors has 1000 bytes" in verify_checkpoint(four)
    # ... and a step folder whose manifest was never written (killed between files):
    six = rd.checkpoint_dir(6)
    six.mkdir()
    (six / "orchestrator.json").write_text('{"step": 6}')
    latest = rd.latest_checkpoint()
    assert latest == rd.checkpoint_dir(2)
    assert RunDir.load_checkpoint(latest)[0]["step"] == 2
    assert not four.exists() and (rd.checkpoints / ".bad-step_000004").is_dir()
    # Same size, flipped content: the checksum catches it.
    two_state = latest / "trainer_state.pt"
    two_state.write_bytes(b"state 9")
    assert "does not match its checksum" in verify_checkpoint(latest)


def test_a_full_disk_while_checkpointing_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    rd = RunDir(tmp_path).create()
    two = write_checkpoint(rd, 2, keep=1)
    real_write = run_dir.write_buffer_state

    def full_disk(folder, state):
        (folder / "buffer.json").write_text("{")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_dir, "write_buffer_state", full_disk)
    with pytest.raises(CheckpointError, match=r"step 4 failed .*No space left.*step_000002\) is intact; free disk space"):
        write_checkpoint(rd, 4, keep=1)
    monkeypatch.setattr(run_dir, "write_buffer_state", real_write)
    assert not list(rd.checkpoints.glob(".tmp-*"))  # the half-written one is gone
    assert rd.complete_checkpoints() == [two] and rd.latest_checkpoint() == two
    assert verify_checkpoint(two) is None


def _foreign_semaphore_name():
    # what joblib's loky backend installs process-wide when it is imported: a name without semprefix
    return f"/loky-{os.getpid()}-{next(synchronize.SemLock._rand)}"  # noqa: SLF001


def test_start_up_removes_what_a_killed_run_left_in_dev_shm_and_names_its_own(tmp_path, monkeypatch):
    # a library imported before the run (loky, by scikit-learn or nltk in a reward function) has
    # replaced multiprocessing's semaphore naming; the run's queues carry its tag all the same
    monkeypatch.setattr(synchronize.SemLock, "_make_name", staticmethod(_foreign_semaphore_name))
    tag = run_tag(tmp_path)
    # What a SIGKILLed run leaves: a weight slot nobody unlinks.
    leaked = shared_memory.SharedMemory(name=f"{tag}_deadbeef_0", create=True, size=4096)
    resource_tracker.unregister(leaked._name, "shared_memory")  # noqa: SLF001 - as if its tracker died too
    leaked.close()
    assert [p.name for p in leftovers(tag)] == [f"{tag}_deadbeef_0"]
    with run_resources(tmp_path) as held:
        assert held == tag and leftovers(tag) == []
        q = mp.get_context("spawn").Queue()  # its semaphores carry the run's tag
        names = [lock._semlock.name for lock in (q._rlock, q._wlock, q._sem) if lock is not None]  # noqa: SLF001
        assert names and all(n.startswith(f"/{tag}-") for n in names), names
        assert {f"sem.{n[1:]}" for n in names} <= {p.name for p in leftovers(tag)}
        with pytest.raises(RunInUse, match="in use by another tokenflow process"):
            with run_resources(tmp_path):
                pass
        q.close()
        del q
    with run_resources(tmp_path):  # the lock is free again once the holder is done
        pass
    assert synchronize.SemLock._make_name().startswith("/loky-")  # noqa: SLF001 - and the naming it found is back

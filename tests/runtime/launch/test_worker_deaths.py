"""With healing off (runtime.max_worker_restarts = 0), a worker of any kind that dies ends the run
within runtime.worker_timeout_s, naming it, with a resume command that works; /dev/shm holds nothing of the run afterwards; a finished run resumed
says so and changes nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.runtime.runtime_testlib import SMALL, ledger, start_cli, step_rows, wait_until, workers
from tokenflow.cli.train import _reusable
from tokenflow.runtime.run.resources import leftovers, run_tag

TIMEOUT_S = 60  # runtime.worker_timeout_s for these runs: the bound on noticing a death and exiting
pytestmark = pytest.mark.slow  # a real run (or several processes) per test


@pytest.mark.parametrize("kind, named", [("engine", "the engine process"), ("trainer", "the trainer process"),
                                         ("scorer0", "the scorer worker process")])
def test_a_killed_worker_ends_the_run_in_time_with_a_resume_command_that_works(tmp_path, kind, named):
    run = tmp_path / "run"
    args = [*SMALL, "--output-dir", str(run), "--run.steps", "40", "--run.checkpoint_every", "1",
            "--rollout.max_staleness", "1", "--runtime.worker_timeout_s", str(TIMEOUT_S),
            "--runtime.max_worker_restarts", "0"]
    log = tmp_path / "first.log"
    proc = start_cli(args, log)
    try:
        wait_until(lambda: (run / "checkpoints").is_dir() and any(
            p.name.startswith("step_") for p in (run / "checkpoints").iterdir()), 300, "a checkpoint", proc)
        t0 = time.monotonic()
        os.kill(workers(run)[kind], signal.SIGKILL)
        code = proc.wait(timeout=TIMEOUT_S)  # a hang (the queue-feeder join) fails here
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert code == 1, out[-3000:]
    assert named in out and "died" in out, out[-3000:]
    if kind != "scorer0":  # how it died, its peak memory and what bounds it (memory_watch)
        assert "killed by SIGKILL (maybe the out-of-memory killer" in out or "out-of-memory killer (" in out, out[-3000:]
        assert "its peak resident memory was " in out and ("trainer.micro_batch_tokens = " in out
                                                         or "engine.max_num_seqs = " in out), out[-3000:]
    assert "Traceback" not in out.split("error:")[-1], out[-3000:]
    advice = next(line for line in out.splitlines() if line.startswith("The last checkpoint"))
    assert "leaked shared_memory" not in out  # the dead trainer's weight slots were released, not leaked
    assert advice.startswith("The last checkpoint (step_") and advice.endswith(f"tokenflow train --resume {run}")
    assert took < TIMEOUT_S
    # The advice works (shortened to one more step so the test stays small).
    done = len(ledger(run))
    proc = start_cli(["--resume", str(run), "--run.steps", str(done + 1)], tmp_path / "second.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    assert [r["step"] for r in step_rows(run)] == list(range(1, done + 2))
    assert leftovers(run_tag(run)) == []


def test_a_crash_before_the_first_checkpoint_advises_a_resume_that_works(tmp_path):
    run = tmp_path / "run"
    args = [*SMALL, "--output-dir", str(run), "--run.steps", "40", "--run.checkpoint_every", "0",
            "--runtime.max_worker_restarts", "0"]
    log = tmp_path / "first.log"
    proc = start_cli(args, log)
    try:
        wait_until(lambda: (run / "metrics.jsonl").exists() and len(step_rows(run)) >= 1, 300, "a step", proc)
        os.kill(workers(run)["engine"], signal.SIGKILL)
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    advice = next(line for line in log.read_text().splitlines() if line.startswith("No checkpoint"))
    assert advice.startswith("No checkpoint was written yet") and f"tokenflow train --resume {run}" in advice
    assert _reusable(run)  # a new run under the same --output-dir is not blocked by it either
    proc = start_cli(["--resume", str(run), "--run.steps", "1"], tmp_path / "again.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "again.log").read_text()[-3000:]
    assert [r["step"] for r in step_rows(run)] == [1]
    # ... and resuming a finished run says so and changes nothing.
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    proc = start_cli(["--resume", str(run)], tmp_path / "finished.log")
    assert proc.wait(timeout=120) == 0
    assert "already finished (1 steps); nothing to do" in (tmp_path / "finished.log").read_text()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before


EXIT_AFTER_DEAD_READER = """
import os, signal, sys, time
from types import SimpleNamespace
from tokenflow.runtime.backends.local.backend import LocalBackend
from tokenflow.runtime.workers.process import WorkerHandle

w = WorkerHandle("trainer", time.sleep, (60,)).start()
os.kill(w.pid, signal.SIGKILL)
w.process.join()
w.send(b"x" * (4 << 20))  # a batch bigger than the pipe holds: the queue's feeder blocks on it
time.sleep(0.5)
LocalBackend.shutdown(SimpleNamespace(engines=[], trainer_ranks=[w], all_workers=[w], _out={},
                                     logs=SimpleNamespace(stop=lambda: None)))  # no log forwarding here
print("exiting", flush=True)
"""


def test_a_batch_stuck_in_a_dead_workers_pipe_does_not_hang_the_exit(tmp_path):
    """The hang seen when the trainer was killed: the interpreter joins the queue's feeder thread
    at exit, and that thread is blocked writing into a pipe nobody will read again."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", EXIT_AFTER_DEAD_READER], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "exiting" in r.stdout, r.stderr


def test_killing_only_the_orchestrator_ends_every_worker_and_the_fork_server(tmp_path):
    """SIGKILL of the main process alone (not its group): the workers, forked from the fork
    server, must notice and exit, and the server with them, rather than wait on each other."""
    import psutil

    run = tmp_path / "run"
    proc = start_cli([*SMALL, "--output-dir", str(run), "--run.steps", "200", "--runtime.start_method", "forkserver"],
                     tmp_path / "log")
    try:
        wait_until(lambda: len(step_rows(run)) >= 1 if (run / "metrics.jsonl").exists() else False, 240,
                   "a first step", proc)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3, [p.cmdline()[-1][:60] for p in tree]  # fork server, engine, trainer...
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, [(p.pid, p.cmdline()[-1][:60]) for p in alive]
    finally:
        for p in tree if "tree" in locals() else []:  # nothing of this run outlives the test
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        if proc.poll() is None:
            proc.kill()

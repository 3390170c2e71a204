"""Start-up and the end of a run (docs/architecture.md, "Start-up and the end of a run"): the
fork server, the torch-free orchestrator, engines that start before the trainer, and the order
the baseline evaluation and step 1 keep."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from tests.runtime.runtime_testlib import SMALL, small_config
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.backends.local import start as worker_start
from tokenflow.runtime.launch import train
from tokenflow.runtime.workers.os_environ import environment as worker_environment
from tokenflow.runtime.workers.process import WorkerHandle


@pytest.mark.slow
def test_the_orchestrators_process_never_imports_torch(tmp_path):
    code = ("import sys, json\n"
            "from tokenflow.cli.main import main\n"
            f"rc = main(['train', '--output-dir', {str(tmp_path / 'run')!r}, '--json', *{SMALL!r},"
            " '--run.steps', '2', '--metrics.sinks', '[\"jsonl\", \"tensorboard\"]'])\n"
            "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules,"
            " 'transformers_models': 'transformers.modeling_utils' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "torch": False, "transformers_models": False}, out.stderr[-2000:]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def _env_of(q, name):
    q.put(os.environ.get(name))


@pytest.mark.slow
def test_a_forked_worker_takes_on_the_orchestrators_environment_of_now():
    worker_start.warm("forkserver")  # started before the variable is set, as a run's server is
    os.environ["TOKENFLOW_TEST_LATE_VAR"] = "set after the server started"
    try:
        ctx = worker_start.context("forkserver")
        q = ctx.Queue()
        h = WorkerHandle("probe", _env_of, (q, "TOKENFLOW_TEST_LATE_VAR"), ctx, env=worker_environment())
        h.start()
        assert q.get(timeout=120) == "set after the server started"
        h.stop(30)
        assert h.process.exitcode == 0
    finally:
        del os.environ["TOKENFLOW_TEST_LATE_VAR"]


@pytest.mark.slow
def test_the_baseline_is_logged_before_step_one_and_every_phase_is_recorded(tmp_path):
    summary = train(small_config("--run.steps", "3"), tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert "eval/accuracy" in rows[0] and rows[0]["step"] == 0  # step 0's evaluation comes first
    assert [r["step"] for r in rows if "loss/total" in r] == [1, 2, 3]
    marks = summary["phases"]["marks"]
    for name in ("preflight_end", "workers_spawned", "engine/loaded", "trainer/loaded", "window_start",
                 "baseline_eval_end", "step1_dispatched", "window_end", "final_eval_end",
                 "final_checkpoint_end", "shutdown_end"):
        assert name in marks, name
    # The window opens once the engine is loaded; step 1 waits for the trainer and the baseline.
    assert marks["engine/loaded"] <= marks["window_start"] <= marks["step1_dispatched"]
    assert max(marks["trainer_ready"], marks["baseline_eval_end"]) <= marks["step1_dispatched"]
    assert summary["baseline_accuracy"] is not None and summary["steps"] == 3


@pytest.mark.slow
def test_without_the_baseline_evaluation_step_one_waits_only_for_its_batch(tmp_path):
    """``run.baseline_eval = false``: no step-0 evaluation (none logged, none in the summary),
    the final one still runs, and the summary says why the starting accuracy is missing."""
    from tokenflow.runtime.view.summary import summary_rows

    summary = train(small_config("--run.steps", "2", "--run.baseline_eval", "false"), tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [2]
    assert "baseline_eval_start" not in summary["phases"]["marks"]
    assert summary["baseline_accuracy"] is None and summary["final_accuracy"] is not None
    accuracy = dict(summary_rows(summary))["held-out accuracy"]
    assert accuracy.startswith(f"{summary['final_accuracy']:.3f}") and "run.baseline_eval = false" in accuracy


def _threads_and_steps(run):
    """The thread counts the orchestrator sent and the engine took, each (time, threads) in
    order, and the trainer's steps (start, end)."""
    events = [e for f in (run / "trace").glob("*.jsonl") for e in read_jsonl(f)]

    def changes(name):
        return sorted((e["ts"], e["args"]["threads"]) for e in events if e.get("name") == name)

    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "trainer/step")
    return changes("orchestrator/engine_threads"), changes("engine/threads"), steps


@pytest.mark.slow
def test_the_final_evaluation_gets_the_trainers_threads(tmp_path):
    """Engine and trainer pinned to a thread each, no lending during the run: after the last step
    the engine takes the trainer's thread for the final evaluation, and not before."""
    run = tmp_path / "run"
    summary = train(small_config("--run.steps", "2", "--metrics.trace", "true",
                                 "--runtime.lend_trainer_threads", "false"), run)
    sent, handed, steps = _threads_and_steps(run)
    assert [threads for _, threads in handed] == [threads for _, threads in sent] == [2]
    assert handed[0][0] >= steps[-1][1]
    assert summary["final_accuracy"] is not None


@pytest.mark.slow
def test_the_engine_takes_the_trainers_threads_while_it_waits(tmp_path):
    """``runtime.lend_trainer_threads`` (the default): the engine runs on the trainer's thread too
    while the trainer waits for a batch. The orchestrator takes it back before it sends a batch
    and lends it only once the step's result is in, so no step starts or runs while it is lent (the
    engine takes each message at its next decode step, which under load may come after a short
    step ended); a message goes out only when the count changes, and each reaches the engine."""
    run = tmp_path / "run"
    summary = train(small_config("--run.steps", "4", "--metrics.trace", "true"), run)
    sent, handed, steps = _threads_and_steps(run)
    counts = [threads for _, threads in sent]
    assert [threads for _, threads in handed] == counts
    assert set(counts) == {1, 2} and counts[-1] == 2  # lent, given back, and lent for the final evaluation
    assert all(a != b for a, b in zip(counts, counts[1:]))
    assert any(threads == 2 and ts < steps[-1][0] for ts, threads in sent)  # lent before the last step
    for start, end in steps:
        before = [threads for ts, threads in sent if ts <= start]
        assert not before or before[-1] == 1, (start, sent)
        assert not [ts for ts, _ in sent if start < ts < end], (start, end, sent)
    assert summary["final_accuracy"] is not None


def _record_worker_starts(monkeypatch) -> dict[str, tuple[int, str]]:
    """name → (parent pid, command line) of each worker process, read from /proc as it starts:
    what actually started, whatever the code meant to start."""
    from pathlib import Path

    started: dict[str, tuple[int, str]] = {}
    real = WorkerHandle.start

    def start(self):
        out = real(self)
        pid = self.process.pid
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        # Between fork and exec (spawn) the child's cmdline is empty or its parent's: wait for it.
        own = Path("/proc/self/cmdline").read_bytes()
        deadline = time.monotonic() + 10
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        while (not raw or raw == own) and time.monotonic() < deadline:
            time.sleep(0.005)
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmdline = raw.replace(b"\0", b" ").decode()
        started[self.name] = (ppid, cmdline)
        return out

    monkeypatch.setattr(WorkerHandle, "start", start)
    return started


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads worker processes from /proc")


@pytest.mark.slow
@needs_proc
def test_spawned_workers_still_train(tmp_path, monkeypatch):
    """start_method = "spawn": each worker is a fresh interpreter (multiprocessing's spawn_main)
    whose parent is this process, not a fork server's child."""
    started = _record_worker_starts(monkeypatch)
    summary = train(small_config("--run.steps", "2", "--runtime.start_method", "spawn"), tmp_path / "run")
    assert summary["steps"] == 2 and summary["baseline_accuracy"] is not None
    assert {"engine", "trainer"} <= set(started), started
    for name, (ppid, cmdline) in started.items():
        assert ppid == os.getpid(), (name, ppid, cmdline)
        assert "spawn_main" in cmdline and "forkserver" not in cmdline, (name, cmdline)


@pytest.mark.slow
@needs_proc
@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="no fork server here")
def test_forkserver_workers_are_forked_by_the_server(tmp_path, monkeypatch):
    """The default, "forkserver": every worker's parent is the one fork server (not this process),
    and a worker runs the server's image (no new interpreter: no spawn_main)."""
    started = _record_worker_starts(monkeypatch)
    summary = train(small_config("--run.steps", "2", "--runtime.start_method", "forkserver"), tmp_path / "run")
    assert summary["steps"] == 2
    assert {"engine", "trainer"} <= set(started), started
    parents = {ppid for ppid, _ in started.values()}
    assert len(parents) == 1 and os.getpid() not in parents, started
    assert all("forkserver" in cmd and "spawn_main" not in cmd for _, cmd in started.values()), started


def test_context_falls_back_to_spawn():
    assert worker_start.context("spawn").get_start_method() == "spawn"
    if "forkserver" in mp.get_all_start_methods():
        assert worker_start.context("forkserver").get_start_method() == "forkserver"

"""A dead worker is replaced while the run goes on (runtime.max_worker_restarts, local backend):
a real worker SIGKILLed mid-run, and the run finishes by itself with every prompt consumed once,
one metric row per step, and (synchronous, so comparable) the same per-step losses and rewards as
the same run never killed, which shows that a new trainer replayed the steps since its checkpoint, a new
engine regenerated its groups and a new scorer pool rescored its samples. Past the limit, the run
stops naming the worker, with the resume command."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import torch

from tests.runtime.runtime_testlib import SMALL, ledger, start_cli, step_rows, wait_until, workers
from tokenflow.bench.chaos_checks import metric_rows, prompt_accounting
from tokenflow.errors import WorkerDied
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.orchestrator.healing import RestartPolicy
from tokenflow.runtime.run.resources import leftovers, run_tag

STEPS = 8
# An evaluation every 2 steps keeps the engine busy right after steps 2 and 4 are logged: a kill
# then lands on groups in flight (held-out and training ones).
# One group decoded at a time (max_num_seqs = group size): generation and evaluation take long
# enough that the engine kill lands on work in flight on a fast machine too (with 256 slots it
# once found the engine idle: nothing to re-send).
HEALED = ["--run.steps", str(STEPS), "--run.checkpoint_every", "3", "--rollout.max_staleness", "0",
          "--run.eval_every", "2", "--runtime.restart_window_s", "0", "--runtime.worker_timeout_s", "60",
          "--engine.max_num_seqs", "4"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The per-step rows of the same run, never killed. (Not the plain loop: its log-probs round
    differently, and over 8 steps that flips a sample or two.)"""
    run = tmp_path_factory.mktemp("unkilled") / "run"
    proc = start_cli([*SMALL, *HEALED, "--output-dir", str(run)], run.with_suffix(".log"))
    assert proc.wait(timeout=300) == 0, run.with_suffix(".log").read_text()[-3000:]
    return {"rows": step_rows(run), "evals": _evals(run)}


def _evals(run) -> list[float]:
    return [r["eval/accuracy"] for r in read_jsonl(run / "metrics.jsonl") if "eval/accuracy" in r]


def _heal_rows(run) -> list[dict]:
    path = run / "heal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
# One weight-sync slot (sync.slots = 1, the laptop example's): the trainer writes a version only
# after every engine acknowledged the last, so a dead engine or trainer must not leave the other
# waiting on that slot, nor the slot in /dev/shm.
@pytest.mark.parametrize("victim, after_step, slots", [("trainer", 4, 2), ("engine", 2, 2), ("scorer0", 2, 2),
                                                       ("trainer", 4, 1), ("engine", 2, 1)])
def test_a_killed_worker_is_replaced_and_the_run_finishes_as_if_it_had_not_died(tmp_path, reference, victim,
                                                                                after_step, slots):
    run, log = tmp_path / "run", tmp_path / "log"
    proc = start_cli([*SMALL, *HEALED, "--sync.slots", str(slots), "--output-dir", str(run)], log)
    try:
        wait_until(lambda: (run / "prompts.jsonl").exists() and len(ledger(run)) >= after_step, 240,
                   f"step {after_step}", proc)
        os.kill(workers(run)[victim], signal.SIGKILL)
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert code == 0, out[-3000:]
    heal = [r for r in _heal_rows(run) if r["event"] == "replaced"]
    assert [r["worker"] for r in heal] == [victim.rstrip("0")], heal
    if victim != "scorer0":  # how it died and its peak memory (memory_watch)
        assert heal[0]["cause"] == "sigkill" and heal[0]["peak_rss_gb"] > 0.1, heal
        assert "killed by SIGKILL" in heal[0]["error"], heal
        peaks = json.loads((run / "summary.json").read_text())["peak_rss_gb"]
        assert set(peaks) == {"engine", "trainer"} and min(peaks.values()) > 0.1, peaks
        assert step_rows(run)[-1]["perf/peak_rss_gb/trainer"] > 0.1
    if victim == "trainer":  # restored from step 3's checkpoint, then step 4 (at least) replayed
        assert heal[0]["restored_step"] == 3 and heal[0]["replay_steps"] >= 1, heal
    if victim == "engine":  # its groups in flight were sent to the new engine
        assert heal[0]["resent_groups"] >= 1, heal
    accounting = prompt_accounting(run)
    assert accounting["prompts_lost"] == accounting["prompts_repeated"] == 0, accounting
    assert accounting["prompts_consumed"] == STEPS * 4 and accounting["ledger_steps_repeated"] == 0
    assert metric_rows(run, STEPS) == {"metric_rows_duplicated": 0, "metric_steps_missing": 0}
    assert _evals(run) == reference["evals"] and len(reference["evals"]) == 2 + STEPS // 2 - 1
    rows = step_rows(run)
    assert len(rows) == len(reference["rows"]) == STEPS
    for step, (got, want) in enumerate(zip(rows, reference["rows"]), 1):
        assert got["reward/mean"] == pytest.approx(want["reward/mean"], abs=1e-6), step
        assert got["loss/total"] == pytest.approx(want["loss/total"], abs=1e-6), step
    assert leftovers(run_tag(run)) == []  # the dead trainer's weight slots too


@pytest.mark.slow
def test_past_max_worker_restarts_the_run_stops_naming_the_worker(tmp_path):
    run, log = tmp_path / "run", tmp_path / "log"
    proc = start_cli([*SMALL, "--output-dir", str(run), "--run.steps", "60", "--run.checkpoint_every", "2",
                      "--runtime.max_worker_restarts", "1", "--runtime.restart_window_s", "0"], log)
    try:
        wait_until(lambda: (run / "prompts.jsonl").exists() and len(ledger(run)) >= 1, 240, "a step", proc)
        first = workers(run)["engine"]
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: workers(run)["engine"] != first and any(r["worker"] == "engine" for r in _heal_rows(run)),
                   120, "the engine's replacement", proc)
        os.kill(workers(run)["engine"], signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert code == 1, out[-3000:]
    assert "the engine process" in out and "not replaced: it was replaced 1 time already" in out, out[-3000:]
    assert "(runtime.max_worker_restarts = 1)" in out
    assert f"tokenflow train --resume {run}" in out.splitlines()[-1]


SLOW_REWARD = """
import time

def reward(prompt, completion, example):
    time.sleep(0.5)  # long enough to be killed in the middle of
    return float(len(completion))
"""


def test_a_new_scorer_pool_scores_again_the_groups_the_dead_one_held(tmp_path):
    """What the run-level test cannot aim at (its scorer is busy for milliseconds a step): a
    worker SIGKILLed in the middle of a group; the new pool scores that group again."""
    import time

    from tokenflow.rollout import Rollout
    from tokenflow.scoring.pool import ScorerDied, ScorerPool

    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    pool = ScorerPool(f"{tmp_path / 'slow.py'}:reward", workers=1, timeout_s=30)
    try:
        group = [Rollout(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], text="x" * (i + 1),
                         sample_index=i) for i in range(3)]
        pool.submit(group, "p", {}, group_id=7)
        time.sleep(0.8)  # the worker is in the group's second sample
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        with pytest.raises(ScorerDied, match="died"):
            while time.monotonic() < deadline:
                assert pool.poll() == []
                time.sleep(0.05)
        pool.restart()
        done = []
        while not done and time.monotonic() < deadline:
            done = pool.poll()
            time.sleep(0.05)
        assert [(g is group, meta) for g, meta in done] == [(True, {"group_id": 7})]
        assert [r.reward for r in group] == [1.0, 2.0, 3.0] and not any(r.failed for r in group)
    finally:
        pool.close()


def _put_one(q) -> None:
    q.put("reached")


def test_a_replaced_workers_old_queue_stays_openable_for_a_worker_still_starting():
    """Found by `bench chaos --heal`: an engine killed while the trainer was still starting (it
    unpickles the engines' queues) was replaced, its old queue collected, its semaphores unlinked,
    and the trainer died opening them."""
    import gc
    import multiprocessing as mp
    import time

    from tokenflow.runtime.workers.process import WorkerHandle

    ctx = mp.get_context("spawn")  # a fresh interpreter: it unpickles its arguments late
    engine = WorkerHandle("engine", time.sleep, (30,), ctx).start()
    starting = WorkerHandle("trainer", _put_one, (engine.cmd_q,), ctx).start()
    old = engine.cmd_q
    engine.renew((30,), ctx.Queue())  # kills the old process; the new one is not started here
    del old
    gc.collect()
    starting.process.join(60)
    assert starting.process.exitcode == 0


def test_the_restart_policy_counts_each_worker_and_refuses_a_crash_loop():
    now = [100.0]
    policy = RestartPolicy(max_restarts=2, window_s=30.0, clock=lambda: now[0])
    died = WorkerDied("the engine0 process (pid 7) died with exit code -9", worker="engine0")
    assert policy.admit("engine0", died) == 1
    assert policy.admit("trainer", died) == 1  # counted per worker
    now[0] += 10.0
    with pytest.raises(WorkerDied, match=r"died again 10.0s after it was replaced \(runtime.restart_window_s = 30\)"):
        policy.admit("engine0", died)
    now[0] += 30.0
    assert policy.admit("engine0", died) == 2
    now[0] += 100.0
    with pytest.raises(WorkerDied, match=r"replaced 2 times already \(runtime.max_worker_restarts = 2\)") as e:
        policy.admit("engine0", died)
    assert e.value.worker == "engine0" and str(e.value).startswith("the engine0 process (pid 7) died")
    with pytest.raises(WorkerDied, match=r"not replaced: runtime.max_worker_restarts = 0"):
        RestartPolicy(max_restarts=0, window_s=0).admit("scorer", died)


def _hold_a_checkpoint_write(run, held: dict, stop: threading.Event) -> None:
    """Hold the trainer's background write of a checkpoint (step ≥ 2): a FIFO where it writes
    ``trainer_state.pt`` blocks that write until someone reads it (nobody does). Then SIGKILL
    the trainer while its write hangs, and take the FIFO away so the new trainer's write goes
    through. A FIFO that comes too late (the file is written already) fails with EEXIST: the
    next checkpoint is tried."""
    seen: set[str] = set()
    while not stop.is_set():
        for staging in sorted((run / "checkpoints").glob(".tmp-step_*")) if (run / "checkpoints").exists() else []:
            if staging.name in seen or int(staging.name.rsplit("_", 1)[-1]) < 2:
                continue
            seen.add(staging.name)
            fifo = staging / "trainer_state.pt"
            try:
                os.mkfifo(fifo)
            except OSError:
                continue  # written already, or the staging folder went: try the next checkpoint
            time.sleep(held["delay_s"])  # the trainer trains on meanwhile (a step in flight, or its next save waiting)
            held["step"] = int(staging.name.rsplit("_", 1)[-1])
            os.kill(workers(run)["trainer"], signal.SIGKILL)
            os.unlink(fifo)
            return
        time.sleep(0.001)


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.05, 1.5], ids=["short-hold", "long-hold"])
def test_a_trainer_killed_while_a_background_checkpoint_is_written_is_replaced_and_every_checkpoint_holds_its_step(
        tmp_path, delay_s):
    """The review's hang: the dead trainer's unwritten checkpoint was re-sent after the whole
    replay (checkpoint N got version S > N weights) or, with a step in flight, never (the run
    hung after its last step, with no summary). Each unwritten checkpoint is saved again right
    after its own step is replayed."""
    run, log = tmp_path / "run", tmp_path / "log"
    steps = 8
    proc = start_cli([*SMALL, "--output-dir", str(run), "--run.steps", str(steps), "--run.checkpoint_every", "1",
                      "--run.keep_checkpoints", "100", "--runtime.restart_window_s", "0",
                      "--runtime.worker_timeout_s", "60"], log)
    held, stop = {"delay_s": delay_s}, threading.Event()
    holder = threading.Thread(target=_hold_a_checkpoint_write, args=(run, held, stop), daemon=True)
    holder.start()
    try:
        code = proc.wait(timeout=240)
    finally:
        stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert "step" in held, f"no checkpoint write was held: {out[-2000:]}"
    assert code == 0 and (run / "summary.json").exists(), out[-3000:]
    assert [r["worker"] for r in _heal_rows(run) if r["event"] == "replaced"] == ["trainer"]
    checkpoints = sorted((run / "checkpoints").glob("step_*"))
    assert [int(c.name.split("_")[-1]) for c in checkpoints] == list(range(1, steps + 1))
    for c in checkpoints:
        step = int(c.name.split("_")[-1])
        assert json.loads((c / "orchestrator.json").read_text())["step"] == step
        assert torch.load(c / "trainer_state.pt", weights_only=True)["version"] == step, c.name
    accounting = prompt_accounting(run)
    assert accounting["prompts_lost"] == accounting["prompts_repeated"] == 0, accounting
    assert metric_rows(run, steps) == {"metric_rows_duplicated": 0, "metric_steps_missing": 0}

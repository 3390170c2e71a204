"""Timeline traces: the tracer's file format, flushing, and the trace of a real run."""

from __future__ import annotations

import json
import textwrap
import time

import numpy as np
import pytest

from tests.metrics.conftest import EVAL, GROUP, PROMPTS, STEPS
from tokenflow.metrics import trace
from tokenflow.report.timeline import (
    TRAINER_BUSY,
    Timeline,
    busy_in_bins,
    merge_intervals,
)


@pytest.fixture()
def tracing(tmp_path):
    d = tmp_path / "trace"
    trace.configure(d, "tester")
    yield d
    trace.configure(None, "tester")


def events_in(path) -> list[dict]:
    return json.loads(path.read_text())["traceEvents"]


def test_off_by_default_and_spans_are_a_shared_no_op(tmp_path):
    trace.configure(None, "x")
    assert not trace.enabled() and trace.trace_dir() is None
    assert trace.span("a/b", n=1) is trace.span("c/d")
    with trace.span("a/b"):
        pass
    trace.record("a/b", time.time(), 0.1)
    trace.counter("buffer/fill", fill=0.5)
    assert not list(tmp_path.rglob("*.jsonl"))


def test_spans_counters_and_other_tracks_merge_into_trace_event_json(tracing, tmp_path):
    t0 = time.time()
    with trace.span("trainer/forward", tokens=12):
        time.sleep(0.01)
    spent_us = (time.time() - t0) * 1e6  # the span's upper bound, however loaded the machine
    trace.record("engine/decode", t0, 0.002, seqs=3)
    trace.counter("buffer/fill", fill=0.25, ready_groups=2)
    trace.name_thread(4242, 1, "idle")
    trace.record_on("trainer/idle", t0, 0.5, pid=4242, tid=1, step=3)
    trace.flush()
    assert trace.trace_dir() == tracing
    n = trace.merge(tracing, tmp_path / "trace.json")
    events = events_in(tmp_path / "trace.json")
    assert n == len(events) == 7
    by_name = {e["name"]: e for e in events}
    # each flush states the tracer's own cost so far in this process
    own = by_name["trace/self_s"]
    assert own["ph"] == "C" and own["args"]["events"] == 6 and 0 < own["args"]["self_s"] < time.time() - t0
    assert by_name["process_name"]["args"] == {"name": "tester"}
    fwd = by_name["trainer/forward"]
    assert fwd["ph"] == "X" and fwd["cat"] == "trainer" and fwd["args"] == {"tokens": 12}
    # sleep lasts at least 10 ms; times are whole microseconds (one of rounding either way)
    assert 9_999 <= fwd["dur"] <= spent_us + 1 and t0 - 1e-6 <= fwd["ts"] / 1e6 <= t0 + spent_us / 1e6
    assert by_name["engine/decode"]["dur"] == pytest.approx(2000)
    assert by_name["buffer/fill"]["ph"] == "C" and by_name["buffer/fill"]["args"]["fill"] == 0.25
    idle = by_name["trainer/idle"]
    assert (idle["pid"], idle["tid"], idle["dur"]) == (4242, 1, pytest.approx(5e5))
    assert by_name["thread_name"]["pid"] == 4242


def test_events_wait_in_memory_until_a_batch_or_an_interval_is_full(tmp_path):
    d = tmp_path / "t"
    trace.configure(d, "p", flush_every=5, flush_interval_s=3600)
    try:
        assert not list(d.glob("*.jsonl"))  # nothing written yet: the metadata event is buffered
        for i in range(3):
            trace.record("x/y", time.time(), 0.0, i=i)
        assert not list(d.glob("*.jsonl"))
        trace.record("x/y", time.time(), 0.0, i=3)  # 5th event: flush
        (f,) = d.glob("p-*.jsonl")

        def written() -> list[str]:
            return [json.loads(x)["name"] for x in f.read_text().splitlines()
                    if json.loads(x)["name"] != "trace/self_s"]

        assert len(written()) == 5
        trace.configure(d, "p", flush_every=10_000, flush_interval_s=0.0)
        trace.record("x/y", time.time(), 0.0)
        assert len(written()) == 7  # flushed by time: the new metadata event, then this one
    finally:
        trace.configure(None, "p")


def test_merge_tolerates_a_torn_last_line(tmp_path):
    (tmp_path / "a-1.jsonl").write_text('{"name":"a/b","ph":"X","ts":1,"dur":2,"pid":1,"tid":1}\n{"name":"a/')
    assert trace.merge(tmp_path, tmp_path / "trace.json") == 1


@pytest.mark.slow
def test_scorer_workers_trace_their_calls_and_flush_when_stopped(tracing, tmp_path):
    """pebble stops workers with SIGTERM; the buffered events must still reach the file."""
    from tokenflow.rollout import Rollout
    from tests.scoring.scoring_testlib import wait_scored
    from tokenflow.scoring.pool import ScorerPool

    mod = tmp_path / "rewards_trace.py"
    mod.write_text(textwrap.dedent("""
        def exact(prompt, completion, example):
            return float(completion == example["want"])
    """))
    pool = ScorerPool(f"{mod}:exact", workers=2, timeout_s=10)
    try:
        group = [Rollout(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], text=t,
                         sample_index=i) for i, t in enumerate(["a", "b", "a"])]
        pool.submit(group, "p", {"want": "a"}, group_id=1)
        done = wait_scored(pool)
        assert [r.reward for r in done[0][0]] == [1.0, 0.0, 1.0]
    finally:
        pool.close()
    trace.flush()
    scorer_files = list(tracing.glob("scorer-*.jsonl"))
    assert scorer_files, list(tracing.iterdir())
    lines = [json.loads(x) for f in scorer_files for x in f.read_text().splitlines()]
    assert sum(e["name"] == "scorer/score" for e in lines) == 3
    own = [json.loads(x) for f in tracing.glob("tester-*.jsonl") for x in f.read_text().splitlines()]
    assert [e["args"]["n"] for e in own if e["name"] == "scorer/group"] == [3]


def test_busy_fraction_of_overlapping_intervals():
    iv = np.array([[0.5, 1.5], [1.2, 2.0], [3.0, 3.25]])
    assert merge_intervals(iv).tolist() == [[0.5, 2.0], [3.0, 3.25]]
    assert busy_in_bins(iv, np.array([0.0, 1.0, 2.0, 3.0, 4.0])).tolist() == [0.5, 1.0, 0.0, 0.25]


# ---- a real run ---------------------------------------------------------------------------------
EXPECTED_SPANS = {
    "engine/prefill", "engine/decode", "engine/weight_swap", "scorer/score", "scorer/group",
    "trainer/step", "trainer/forward", "trainer/backward", "trainer/optimizer", "sync/send",
    "sync/pack", "orchestrator/eval", "trainer/idle",
}


@pytest.mark.slow
def test_trace_of_a_real_run_has_spans_from_every_process(traced_run):
    doc = json.loads((traced_run / "trace.json").read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in {"X", "C", "M"} and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] > 1.5e15  # wall-clock microseconds
    tl = Timeline.from_events(events)
    assert tl.process_kinds() == {"orchestrator", "engine", "trainer", "scorer"}
    assert EXPECTED_SPANS <= set(tl.spans)
    assert tl.spans.keys() & {"buffer/batch_wait", "buffer/admission_blocked"}
    assert {"buffer/fill", "perf/tokens_per_s"} <= set(tl.counters)
    # every sample scored in a worker is in the trace (the workers' last events included)
    assert len(tl.spans["scorer/score"]) == STEPS * PROMPTS * GROUP + 2 * EVAL
    assert len(tl.spans["trainer/step"]) == STEPS
    rates = [a for _, a in tl.counters["perf/tokens_per_s"]]
    assert len(rates) >= STEPS  # a trainer rate at every step (engine rates need ≥ 2 status reports)
    assert min(r["engine"] for r in rates) >= 0 and max(r["trainer"] for r in rates) > 0


# One message's transit between processes: a turn of the orchestrator's loop (20 ms) plus up to
# 30 ms of scheduling latency on a loaded machine.
TRANSIT_S = 0.05


@pytest.mark.slow
def test_trace_agrees_with_the_runtimes_idle_clock(traced_run):
    """Trainer busy = its step and weight-push spans, the same time the runtime's idle clock sums."""
    summary = json.loads((traced_run / "summary.json").read_text())
    tl = Timeline.load(traced_run / "trace.json")
    window = summary["train_wall_s"]
    # What separates the two clocks is the messages' transit: each step's batch out and its result
    # back, each waiting at most one turn of the orchestrator's loop (pump(0.02)) plus the
    # scheduler's latency, which a loaded 2-core machine stretches to tens of ms. The allowance
    # is that, per message; the window itself may be any length (a slow machine's is longer).
    transit = 2 * STEPS * TRANSIT_S
    steps = tl.intervals(("trainer/step",))
    assert 0.0 <= steps[:, 0].min() < window and abs(steps[:, 1].max() - window) < max(0.25, 2 * TRANSIT_S)
    busy = busy_in_bins(tl.intervals(TRAINER_BUSY), np.array([0.0, window]))[0]
    assert 1.0 - busy == pytest.approx(summary["trainer_idle_frac"], abs=max(0.02, transit / window))
    # the orchestrator's trainer/idle spans miss only the messages' transit time
    idle = tl.intervals(("trainer/idle",))
    idle_s = merge_intervals(idle[idle[:, 0] < window])
    assert (idle_s[:, 1] - idle_s[:, 0]).sum() == pytest.approx(summary["trainer_idle_frac"] * window,
                                                               abs=max(0.1, transit))


@pytest.mark.slow
def test_the_trace_states_its_own_cost_and_it_is_small(traced_run):
    summary = json.loads((traced_run / "summary.json").read_text())
    cost = Timeline.load(traced_run / "trace.json").tracer_cost()
    assert set(cost) == {"orchestrator", "engine", "trainer", "scorer"}
    for kind, seconds in cost.items():
        assert 0 < seconds < 0.01 * summary["wall_s"], (kind, seconds)

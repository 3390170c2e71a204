"""Reading a trace back: the training window's zero, busy and idle per bin, process kinds."""

from __future__ import annotations

import numpy as np
import pytest

from tokenflow.report.timeline import Timeline


def x(name, pid, start_s, dur_s):
    return {"name": name, "ph": "X", "pid": pid, "tid": 1, "ts": start_s * 1e6, "dur": dur_s * 1e6}


def meta(pid, name):
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}


EVENTS = [
    meta(1, "orchestrator"), meta(2, "engine"), meta(3, "trainer"), meta(4, "scorer"),
    x("orchestrator/eval", 1, 100.0, 2.0),          # baseline evaluation ends at 102: t = 0
    x("engine/decode", 2, 102.0, 1.0), x("engine/decode", 2, 103.5, 0.5),
    x("trainer/step", 3, 103.0, 1.5), x("sync/send", 3, 104.5, 0.25),
    x("scorer/score", 4, 103.1, 0.01),
    x("orchestrator/eval", 1, 110.0, 2.0),          # the final evaluation does not move zero
    {"name": "buffer/fill", "ph": "C", "pid": 1, "tid": 0, "ts": 102.5e6, "args": {"fill": 0.5}},
]


def test_zero_is_the_end_of_the_baseline_evaluation():
    tl = Timeline.from_events(EVENTS)
    assert tl.t0_wall == pytest.approx(102.0)
    assert tl.intervals(("trainer/step",)).tolist() == [[1.0, 2.5]]
    assert tl.window_end() == pytest.approx(2.5)
    assert tl.counters["buffer/fill"] == [(pytest.approx(0.5), {"fill": 0.5})]
    assert tl.process_kinds() == {"orchestrator", "engine", "trainer", "scorer"}


def test_idle_per_bin():
    tl = Timeline.from_events(EVENTS)
    idle = tl.idle_in_bins(np.array([0.0, 1.0, 2.0, 3.0]))
    assert idle["engine"].tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert idle["trainer"].tolist() == pytest.approx([1.0, 0.0, 0.25])  # step 1–2.5, push 2.5–2.75


def test_process_filter():
    tl = Timeline.from_events(EVENTS)
    assert len(tl.intervals(("engine/decode",), process="engine")) == 2
    assert len(tl.intervals(("engine/decode",), process="trainer")) == 0

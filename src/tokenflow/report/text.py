"""The text summary: one column per run, the numbers ``summary.json`` holds plus derived rates.

Idle fractions, wall times and accuracies are read from ``summary.json`` and printed in the same
format as ``tokenflow bench pipeline``, so the two can be compared digit for digit; when the runs
sit in a bench folder, the summary says whether ``bench.json`` agrees.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tokenflow.report.run_data import RunData


def run_numbers(run: RunData) -> dict:
    s = run.summary
    _, _, pauses = run.series("sync/engine_pause_s_mean")
    return {
        "name": run.name, "run_dir": str(run.root),
        "mode": s.get("mode", "?"), "max_staleness": s.get("max_staleness"),
        "steps": s.get("steps", len(run.steps)),
        "train_wall_s": run.train_wall_s, "wall_s": s.get("wall_s"),
        "baseline_accuracy": s.get("baseline_accuracy"), "final_accuracy": s.get("final_accuracy"),
        "trainer_idle_frac": s.get("trainer_idle_frac", run.last("perf/trainer_idle_frac")),
        "engine_idle_frac": s.get("engine_idle_frac", run.last("perf/engine_idle_frac")),
        "token_age_mean": run.mean_token_age(), "token_age_max": run.max_token_age(),
        "engine_tokens_per_s": run.engine_tokens_per_s(),
        "trainer_tokens_per_s": run.trainer_tokens_per_s(),
        "tokens_generated": s.get("tokens_generated"),
        "batch_wait_s": run.last("buffer/batch_wait_s", 0.0),
        "admission_wait_s": run.last("buffer/admission_wait_s", 0.0),
        "engine_pause_ms_mean": float(np.mean(pauses)) * 1e3 if len(pauses) else None,
        "last_reward_mean": s.get("last_reward_mean", run.last("reward/mean")),
        "trace": run.trace_path is not None,
        # the tracer's own time per process kind, as a fraction of the run's wall time
        "trace_cost_frac": ({k: v / s["wall_s"] for k, v in run.timeline.tracer_cost().items()}
                            if run.timeline is not None and s.get("wall_s") else {}),
    }


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _num(fmt: str):
    return lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


ROWS = [
    ("mode", lambda n: f"{n['mode']} (K={n['max_staleness']})"),
    ("optimizer steps", lambda n: str(n["steps"])),
    ("training window", lambda n: f"{n['train_wall_s']:.1f} s"),
    ("total wall", lambda n: _num(".1f")(n["wall_s"]) + " s"),
    ("held-out accuracy", lambda n: f"{_num('.3f')(n['baseline_accuracy'])} → {_num('.3f')(n['final_accuracy'])}"),
    ("last reward mean", lambda n: _num(".3f")(n["last_reward_mean"])),
    ("trainer idle", lambda n: _pct(n["trainer_idle_frac"])),
    ("engine idle", lambda n: _pct(n["engine_idle_frac"])),
    ("token age", lambda n: f"mean {n['token_age_mean']:.2f}, max {n['token_age_max']:.0f}"),
    ("engine tokens/s", lambda n: f"{n['engine_tokens_per_s']:,.0f}"),
    ("trainer tokens/s", lambda n: f"{n['trainer_tokens_per_s']:,.0f}"),
    ("trainer waited for batches", lambda n: f"{n['batch_wait_s']:.1f} s"),
    ("admission blocked", lambda n: f"{n['admission_wait_s']:.1f} s"),
    ("engine pause per sync", lambda n: _num(".2f")(n["engine_pause_ms_mean"]) + " ms"),
    ("trace", lambda n: "yes" if n["trace"] else "no (--metrics.trace true)"),
    ("tracer's own time", lambda n: _trace_cost(n["trace_cost_frac"])),
]


def _trace_cost(cost: dict[str, float]) -> str:
    """The busiest process's tracer time as a share of the run (the trace's overhead)."""
    if not cost:
        return "-"
    kind = max(cost, key=cost.get)
    return f"{cost[kind]:.2%} ({kind})"


def bench_check(numbers: list[dict]) -> list[str]:
    """Compare with the bench.json beside the runs (``tokenflow bench pipeline`` output)."""
    parents = {Path(n["run_dir"]).resolve().parent for n in numbers}
    if len(parents) != 1:
        return []
    path = parents.pop() / "bench.json"
    if not path.is_file():
        return []
    bench = json.loads(path.read_text())
    lines, agree = [], True
    for n in numbers:
        side = Path(n["run_dir"]).resolve().name
        for key in ("trainer_idle_frac", "engine_idle_frac"):
            b = bench.get(f"{side}_{key}")
            if b is None:
                continue
            same = _pct(b) == _pct(n[key])
            agree &= same
            lines.append(f"  {side:>5} {key.replace('_frac', '').replace('_', ' ')}: bench {_pct(b)}, "
                         f"report {_pct(n[key])}{'' if same else '  (DIFFERENT)'}")
    head = f"bench pipeline ({path}): idle fractions {'agree' if agree else 'DIFFER'}"
    return [head, *lines] if lines else []


def summary_text(numbers: list[dict]) -> str:
    table = [[n["name"] for n in numbers]] + [[fmt(n) for n in numbers] for _, fmt in ROWS]
    width = max(len(c) for row in table for c in row) + 3
    label_w = max(len(r[0]) for r in ROWS) + 2
    lines = []
    for label, cells in zip(["", *(r[0] for r in ROWS)], table):
        lines.append(f"{label:<{label_w}}" + "".join(f"{c:>{width}}" for c in cells))
    if len(numbers) == 2 and numbers[0]["train_wall_s"] > 0:
        a, b = numbers
        lines.append(f"\n{b['name']} / {a['name']} training-window wall time = "
                     f"{b['train_wall_s'] / a['train_wall_s']:.3f}")
    check = bench_check(numbers)
    if check:
        lines += ["", *check]
    return "\n".join(lines) + "\n"

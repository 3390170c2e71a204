"""Tables (rich) and the sweep figure (matplotlib, Agg) for ``tokenflow simulate``."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from tokenflow.sim.calibration.calibrate import CalibrationReport
from tokenflow.sim.metrics import SimResult
from tokenflow.sim.sweep import SweepResult


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _dur(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.2f} s"


def result_tables(r: SimResult) -> list[Table]:
    """Summary, step-time breakdown and staleness tables of one simulation."""
    s = r.setup
    top = Table(title=f"{s['inference_gpus']}+{s['training_gpus']} GPUs, K={s['max_staleness']}, "
                      f"{s['update_mode']}", show_header=False, min_width=44)
    top.add_column("metric")
    top.add_column("value", justify="right")
    for name, value in [
        ("throughput (trained tokens/s)", f"{r.tokens_per_s:,.0f}"),
        ("generated tokens/s", f"{r.generated_tokens_per_s:,.0f}"),
        ("optimizer steps/hour", f"{r.steps_per_hour:,.1f}"),
        ("step time", _dur(r.step_time_s)),
        ("trainer idle", _pct(r.trainer_idle_frac)),
        ("inference idle", _pct(r.inference_idle_frac)),
        ("mean running seqs per engine", f"{r.inference_mean_batch:,.1f}"),
        ("tokens rejected (too old)", f"{r.tokens_rejected:,}"),
        ("tokens re-prefilled (abort)", f"{r.tokens_reprefilled:,}"),
        ("wasted / consumed", _pct(r.wasted_frac)),
        ("simulated wall time", _dur(r.wall_s)),
    ]:
        top.add_row(name, value)

    steps = Table(title="mean step time breakdown")
    for col in ("wait for data", "train", "wait to send", "send weights", "total"):
        steps.add_column(col, justify="right")
    b = r.step_breakdown_s
    steps.add_row(*(_dur(b[k]) for k in ("wait_data", "train", "sync_wait", "sync")), _dur(r.step_time_s))

    pool = Table(title="inference time")
    for k in r.inference_breakdown:
        pool.add_column(k, justify="right")
    pool.add_row(*(_pct(v) for v in r.inference_breakdown.values()))

    st = r.staleness
    ages = Table(title=f"token age at consumption (mean {st['mean']:.2f}, p90 {st['p90']}, max {st['max']})")
    ages.add_column("age (steps)", justify="right")
    ages.add_column("tokens", justify="right")
    for age, frac in st["histogram"].items():
        ages.add_row(str(age), _pct(frac))
    return [top, steps, pool, ages]


def sweep_table(sw: SweepResult) -> Table:
    keys = [a.key for a in sw.axes]
    best = sw.best
    t = Table(title=f"sweep over {' x '.join(keys)} (best by {sw.objective})")
    for k in keys:
        t.add_column(k.split(".", 1)[1], justify="right")
    for col in ("tokens/s", "steps/h", "trainer idle", "infer. idle", "mean age", "wasted", ""):
        t.add_column(col, justify="right")
    for p in sw.points:
        if p.result is None:
            t.add_row(*(str(v) for v in p.values), "invalid", "", "", "", "", "", "")
            continue
        r = p.result
        t.add_row(*(str(v) for v in p.values), f"{r.tokens_per_s:,.0f}", f"{r.steps_per_hour:,.1f}",
                  _pct(r.trainer_idle_frac), _pct(r.inference_idle_frac),
                  f"{r.staleness['mean']:.2f}", _pct(r.wasted_frac), "best" if p is best else "",
                  style="bold" if p is best else None)
    return t


def best_line(sw: SweepResult) -> str:
    best = sw.best
    if best is None:
        return "no valid configuration in the sweep"
    setting = ", ".join(f"{a.key} = {v}" for a, v in zip(sw.axes, best.values))
    r = best.result
    return (f"best: {setting}: {r.tokens_per_s:,.0f} tokens/s, {r.steps_per_hour:,.1f} steps/h, "
            f"trainer idle {_pct(r.trainer_idle_frac)}, inference idle {_pct(r.inference_idle_frac)}")


def calibration_table(rep: CalibrationReport) -> Table:
    t = Table(title=f"calibrated from {rep.source}")
    for col in ("run", "predicted wall", "measured wall", "error", "trainer idle (pred / meas)",
                "engine idle (pred / meas)"):
        t.add_column(col, justify="right")
    for mode, p in rep.runs.items():
        meas = lambda x: "-" if x is None else _pct(x)
        t.add_row(mode, _dur(p.predicted_wall_s), "-" if p.measured_wall_s is None else _dur(p.measured_wall_s),
                  "-" if p.error is None else f"{100 * p.error:+.1f}%",
                  f"{_pct(p.predicted_trainer_idle_frac)} / {meas(p.measured_trainer_idle_frac)}",
                  f"{_pct(p.predicted_engine_idle_frac)} / {meas(p.measured_engine_idle_frac)}")
    pr, mr = rep.ratio("predicted"), rep.ratio("measured")
    if pr is not None:
        t.caption = f"async / sync wall time: predicted {pr:.3f}" + (f", measured {mr:.3f}" if mr else "")
    return t


def print_tables(tables: list[Table], console: Console | None = None) -> None:
    console = console or Console()
    for t in tables:
        console.print(t)


def sweep_figure(sw: SweepResult, out_dir: str | Path) -> Path:
    """Write ``sweep.png``: a line plot for one axis, a heat map for two. Returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.png"
    value = lambda p: getattr(p.result, sw.objective) if p.result else float("nan")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if len(sw.axes) == 1:
        xs = range(len(sw.axes[0].values))  # positions, so text values plot too
        ax.set_xticks(xs, [str(v) for v in sw.axes[0].values])
        ax.plot(xs, [value(p) for p in sw.points], "o-", color="tab:blue", label=sw.objective)
        ax.set_xlabel(sw.axes[0].key)
        ax.set_ylabel(sw.objective)
        idle = ax.twinx()
        for attr, color in (("trainer_idle_frac", "tab:red"), ("inference_idle_frac", "tab:green")):
            idle.plot(xs, [getattr(p.result, attr) if p.result else float("nan") for p in sw.points],
                      "--", color=color, label=attr.replace("_frac", ""))
        idle.set_ylabel("idle fraction")
        idle.set_ylim(0, 1)
        fig.legend(loc="upper left", bbox_to_anchor=(0.1, 0.9))
    else:
        a, b = sw.axes
        grid = [[value(sw.points[i * len(b.values) + j]) for j in range(len(b.values))]
                for i in range(len(a.values))]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(b.values)), [str(v) for v in b.values])
        ax.set_yticks(range(len(a.values)), [str(v) for v in a.values])
        ax.set_xlabel(b.key)
        ax.set_ylabel(a.key)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:,.0f}", ha="center", va="center", color="white", fontsize=8)
        fig.colorbar(im, ax=ax, label=sw.objective)
    best = sw.best
    if best is not None:
        ax.set_title("best: " + ", ".join(f"{k.key}={v}" for k, v in zip(sw.axes, best.values)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""`tokenflow bench pipeline --staleness 0,1,2,4,8 --seeds 3 [--timings 2]`: accuracy against
admitted staleness, over seeds and timings.

One run per (K, seed), K = 0 being the synchronous reference, and for every K > 0 the same run
again with the behaviour correction off (``algorithm.behaviour_logprobs = false``: the loss treats
every token as if the policy that trains it had sampled it, so stale tokens get no importance
weight; the trust region is then anchored at π_prox only). Each run goes to
``<out>/<corrections>/K<k>/seed<s>`` (``.../seed<s>/t<i>`` with ``--timings``).

**Timings.** A synchronous run is deterministic; an asynchronous one is not: which policy version
generates which tokens, and which groups a batch takes, move with the workers' speeds, so the
same seed can learn in one invocation and collapse in the next. ``--timings N`` runs every
asynchronous (K, seed) N times (the synchronous run once); each repeat meets the machine as it
is then. Per K and setting the bench prints the mean, the minimum and the number of **collapsed**
runs (held-out accuracy below the synchronous runs' minimum − ``COLLAPSE_MARGIN``) beside the
spread, the gap to K = 0, the consumed token-age histogram (summed over runs), the behaviour
weight's statistics from the trainer's metrics (mean over steps of its mean, the largest seen,
the share of tokens TIS truncated) and the training window; for each collapsed run, its policy
entropy at the start and at its lowest (and the step), and the largest weight and mean token age
over the five steps up to that low.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

SETTINGS = {"on": {}, "off": {"behaviour_logprobs": False, "tis_cap": 0.0}}
COLLAPSE_MARGIN = 0.1
"""A run collapsed when its accuracy is below the synchronous runs' minimum minus this."""


def parse_staleness(text: str) -> list[int]:
    """``"0,1,2,4,8"`` -> [0, 1, 2, 4, 8]; 0 (the synchronous reference) is always included."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--staleness takes comma-separated integers such as 0,1,2,4,8, not {text!r}") from None
    if not ks or ks[0] < 0:
        raise ValueError(f"--staleness values must be ≥ 0 (got {text!r})")
    return ks if ks[0] == 0 else [0, *ks]


def curve(run_dir: Path) -> dict:
    """What the trainer reported over the run (``metrics.jsonl``): the behaviour weight, and what
    a collapse looks like: policy entropy at the first step and at its lowest (and that step),
    the largest weight and the mean token age over the five steps up to the low."""
    from tokenflow.metrics.sinks import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss/total" in r]
    mean = [r["offpolicy/is_ratio_mean"] for r in rows if "offpolicy/is_ratio_mean" in r]
    ent = [r.get("policy/entropy", 0.0) for r in rows]
    low = min(range(len(rows)), key=ent.__getitem__) if rows else 0
    before = rows[max(0, low - 4): low + 1]
    return {
        "weight_mean": sum(mean) / len(mean) if mean else 1.0,
        "weight_max": max((r.get("offpolicy/is_ratio_max", 1.0) for r in rows), default=1.0),
        "weight_min": min((r.get("offpolicy/is_ratio_min", 1.0) for r in rows), default=1.0),
        "tis_clipped_frac": sum(r.get("offpolicy/tis_clipped_frac", 0.0) for r in rows) / max(len(rows), 1),
        "entropy_first": ent[0] if ent else 0.0,
        "entropy_min": ent[low] if ent else 0.0,
        "entropy_min_step": rows[low]["step"] if rows else 0,
        "weight_max_at_low": max((r.get("offpolicy/is_ratio_max", 1.0) for r in before), default=1.0),
        "token_age_at_low": (statistics.fmean([r.get("offpolicy/token_age_mean", 0.0) for r in before])
                             if before else 0.0),
    }


def _one_run(base, folder: Path, k: int, seed: int, setting: str, timing: int) -> dict:
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import train

    cfg = base.model_copy(deep=True)
    cfg.rollout.max_staleness = k
    cfg.run.seed = seed
    for key, value in SETTINGS[setting].items():
        setattr(cfg.algorithm, key, value)
    cfg = TrainConfig.model_validate(cfg.model_dump())
    logger.info("bench pipeline: K=%d seed %d corrections %s timing %d → %s", k, seed, setting, timing, folder)
    summary = train(cfg, folder)
    return {"k": k, "seed": seed, "timing": timing, "corrections": setting, "accuracy": summary["final_accuracy"],
            "baseline_accuracy": summary["baseline_accuracy"], "train_wall_s": summary["train_wall_s"],
            "token_age_histogram": summary["token_age_histogram"], **curve(folder),
            "output_dir": str(folder)}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _aggregate(runs: list[dict], collapse_below: float | None) -> dict:
    accs = [r["accuracy"] for r in runs]
    acc_mean, acc_sd = _mean_sd(accs)
    wall_mean, wall_sd = _mean_sd([r["train_wall_s"] for r in runs])
    hist: dict[str, int] = {}
    for r in runs:
        for age, count in r["token_age_histogram"].items():
            hist[age] = hist.get(age, 0) + count
    total = sum(hist.values()) or 1
    collapsed = [r for r in runs if collapse_below is not None and r["accuracy"] < collapse_below]
    return {
        "runs": len(runs), "accuracy_mean": acc_mean, "accuracy_sd": acc_sd, "accuracy_min": min(accs),
        "accuracies": accs, "collapsed": len(collapsed),
        "at_collapse": [{key: r[key] for key in ("seed", "timing", "accuracy", "entropy_first", "entropy_min",
                                                 "entropy_min_step", "weight_max_at_low", "token_age_at_low")}
                        for r in collapsed],
        "train_wall_mean_s": wall_mean, "train_wall_sd_s": wall_sd,
        "token_age_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "token_age_mean": sum(int(a) * c for a, c in hist.items()) / total,
        "token_age_max": max((int(a) for a, c in hist.items() if c), default=0),
        "weight_mean": sum(r["weight_mean"] for r in runs) / len(runs),
        "weight_max": max(r["weight_max"] for r in runs),
        "weight_min": min(r["weight_min"] for r in runs),
        "tis_clipped_frac": sum(r["tis_clipped_frac"] for r in runs) / len(runs),
    }


def sweep(base, out: Path, ks: list[int], seeds: list[int], settings: list[str], timings: int = 1) -> dict:
    """Every run of the sweep (asynchronous ones ``timings`` times each), then one row per
    (K, setting) with its gap to K = 0 and its collapsed runs."""
    runs = []
    for k in ks:
        for setting in (["on"] if k == 0 else settings):
            for seed in seeds:
                for t in range(1 if k == 0 else timings):
                    folder = out / setting / f"K{k}" / f"seed{seed}"
                    runs.append(_one_run(base, folder / f"t{t}" if timings > 1 and k else folder, k, seed, setting, t))
    sync_min = min(r["accuracy"] for r in runs if r["k"] == 0)
    collapse_below = sync_min - COLLAPSE_MARGIN
    rows = []
    for k in ks:
        for setting in (["on"] if k == 0 else settings):
            mine = [r for r in runs if r["k"] == k and r["corrections"] == setting]
            row = _aggregate(mine, collapse_below if k else None)
            rows.append({"k": k, "corrections": setting if k else "-", **row})
    sync = rows[0]["accuracy_mean"]
    for row in rows:
        row["gap"] = row["accuracy_mean"] - sync
        row["min_gap"] = row["accuracy_min"] - sync_min
    result = {"seeds": seeds, "staleness": ks, "corrections": settings, "timings": timings, "steps": base.run.steps,
              "collapse_below": collapse_below, "rows": rows, "runs": runs, "output_dir": str(out)}
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    return result


def _age(hist: dict) -> str:
    total = sum(hist.values()) or 1
    return " ".join(f"{a}:{c / total:.0%}" for a, c in hist.items() if c / total >= 0.005)


def print_table(result: dict, console=None) -> None:
    """The sweep as a table on ``console`` (default: a rich console on stdout), then one line per
    collapsed run with the statistics at its low point."""
    from rich.console import Console
    from rich.table import Table

    # Piped to a file the table keeps its rows whole (rich would squeeze it into 80 columns).
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    t = result.get("timings", 1)
    table = Table(title=f"{len(result['seeds'])} seeds ({', '.join(map(str, result['seeds']))}) × {t} "
                        f"timing{'s' * (t > 1)} (asynchronous runs), {result['steps']} steps each; collapsed: "
                        f"accuracy < {result['collapse_below']:.3f} (synchronous min − {COLLAPSE_MARGIN})")
    for name in ("K", "corr", "accuracy", "min", "gap", "collapsed", "age mean/max", "w mean", "w max",
                 "TIS cut", "window s", "token ages"):
        table.add_column(name, justify="left" if name in ("corr", "token ages") else "right")
    for r in result["rows"]:
        table.add_row(str(r["k"]), r["corrections"], f"{r['accuracy_mean']:.3f} ± {r['accuracy_sd']:.3f}",
                      f"{r['accuracy_min']:.3f}", f"{r['gap']:+.3f}", f"{r['collapsed']} / {r['runs']}",
                      f"{r['token_age_mean']:.2f} / {r['token_age_max']}", f"{r['weight_mean']:.3f}",
                      f"{r['weight_max']:.2f}", f"{r['tis_clipped_frac']:.2%}", f"{r['train_wall_mean_s']:.1f}",
                      _age(r["token_age_histogram"]))
    console.print(table)
    for r in result["rows"]:
        for c in r["at_collapse"]:
            console.print(f"collapsed: K={r['k']} {r['corrections']} seed {c['seed']} timing {c['timing']}: "
                          f"accuracy {c['accuracy']:.3f}; entropy {c['entropy_first']:.3f} at step 1 → "
                          f"{c['entropy_min']:.3f} at step {c['entropy_min_step']}; over the 5 steps to it w max "
                          f"{c['weight_max_at_low']:.1f}, token age {c['token_age_at_low']:.2f}", highlight=False)

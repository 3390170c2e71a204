"""`tokenflow bench pipeline --staleness 0,1,2,4,8 --seeds 3`: accuracy against admitted staleness.

One run per (K, seed), K = 0 being the synchronous reference, and for every K > 0 the same run
again with the behaviour correction off (``algorithm.behaviour_logprobs = false``: the loss treats
every token as if the policy that trains it had sampled it, so stale tokens get no importance
weight; the trust region is then anchored at π_prox only). Each run goes to
``<out>/<corrections>/K<k>/seed<s>``. Per K and setting the bench prints the mean and spread of
held-out accuracy over seeds, its gap to K = 0, the consumed token-age histogram (summed over
seeds), the behaviour weight's statistics from the trainer's metrics (mean over steps of its mean,
the largest seen, the share of tokens TIS truncated) and the training-window wall time.

On the default workload generation is the bottleneck, so the engine keeps K + 1 batches decoding
and the admitted staleness is reached: at K = 8 tokens up to 8 versions old are trained (the
histogram says how many).
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

logger = logging.getLogger(__name__)

SETTINGS = {"on": {}, "off": {"behaviour_logprobs": False, "tis_cap": 0.0}}


def parse_staleness(text: str) -> list[int]:
    """``"0,1,2,4,8"`` -> [0, 1, 2, 4, 8]; 0 (the synchronous reference) is always included."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--staleness takes comma-separated integers such as 0,1,2,4,8, not {text!r}") from None
    if not ks or ks[0] < 0:
        raise ValueError(f"--staleness values must be ≥ 0 (got {text!r})")
    return ks if ks[0] == 0 else [0, *ks]


def _weight_stats(run_dir: Path) -> dict:
    """The behaviour weight as the trainer reported it, over the run's optimizer steps."""
    from tokenflow.metrics.sinks import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss/total" in r]
    mean = [r["offpolicy/is_ratio_mean"] for r in rows if "offpolicy/is_ratio_mean" in r]
    return {
        "weight_mean": sum(mean) / len(mean) if mean else 1.0,
        "weight_max": max((r.get("offpolicy/is_ratio_max", 1.0) for r in rows), default=1.0),
        "weight_min": min((r.get("offpolicy/is_ratio_min", 1.0) for r in rows), default=1.0),
        "tis_clipped_frac": sum(r.get("offpolicy/tis_clipped_frac", 0.0) for r in rows) / max(len(rows), 1),
    }


def _one_run(base, folder: Path, k: int, seed: int, setting: str) -> dict:
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import train

    cfg = base.model_copy(deep=True)
    cfg.rollout.max_staleness = k
    cfg.run.seed = seed
    for key, value in SETTINGS[setting].items():
        setattr(cfg.algorithm, key, value)
    cfg = TrainConfig.model_validate(cfg.model_dump())
    logger.info("bench pipeline: K=%d seed %d corrections %s → %s", k, seed, setting, folder)
    summary = train(cfg, folder)
    return {"k": k, "seed": seed, "corrections": setting, "accuracy": summary["final_accuracy"],
            "baseline_accuracy": summary["baseline_accuracy"], "train_wall_s": summary["train_wall_s"],
            "token_age_histogram": summary["token_age_histogram"], **_weight_stats(folder),
            "output_dir": str(folder)}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _aggregate(runs: list[dict]) -> dict:
    acc_mean, acc_sd = _mean_sd([r["accuracy"] for r in runs])
    wall_mean, wall_sd = _mean_sd([r["train_wall_s"] for r in runs])
    hist: dict[str, int] = {}
    for r in runs:
        for age, count in r["token_age_histogram"].items():
            hist[age] = hist.get(age, 0) + count
    total = sum(hist.values()) or 1
    return {
        "accuracy_mean": acc_mean, "accuracy_sd": acc_sd, "accuracies": [r["accuracy"] for r in runs],
        "train_wall_mean_s": wall_mean, "train_wall_sd_s": wall_sd,
        "token_age_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "token_age_mean": sum(int(a) * c for a, c in hist.items()) / total,
        "token_age_max": max((int(a) for a, c in hist.items() if c), default=0),
        "weight_mean": sum(r["weight_mean"] for r in runs) / len(runs),
        "weight_max": max(r["weight_max"] for r in runs),
        "weight_min": min(r["weight_min"] for r in runs),
        "tis_clipped_frac": sum(r["tis_clipped_frac"] for r in runs) / len(runs),
    }


def sweep(base, out: Path, ks: list[int], seeds: list[int], settings: list[str]) -> dict:
    """Every run of the sweep, then one row per (K, setting) with its gap to K = 0."""
    runs = []
    for k in ks:
        for setting in (["on"] if k == 0 else settings):
            for seed in seeds:
                runs.append(_one_run(base, out / setting / f"K{k}" / f"seed{seed}", k, seed, setting))
    rows = []
    for k in ks:
        for setting in (["on"] if k == 0 else settings):
            row = {"k": k, "corrections": setting if k else "-",
                   **_aggregate([r for r in runs if r["k"] == k and r["corrections"] == setting])}
            rows.append(row)
    sync = rows[0]["accuracy_mean"]
    for row in rows:
        row["gap"] = row["accuracy_mean"] - sync
    result = {"seeds": seeds, "staleness": ks, "corrections": settings, "steps": base.run.steps,
              "rows": rows, "runs": runs, "output_dir": str(out)}
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    return result


def _age(hist: dict) -> str:
    total = sum(hist.values()) or 1
    return " ".join(f"{a}:{c / total:.0%}" for a, c in hist.items() if c / total >= 0.005)


def print_table(result: dict) -> None:
    print(f"{len(result['seeds'])} seeds ({', '.join(map(str, result['seeds']))}), {result['steps']} steps each; "
          "accuracy mean ± sd over seeds, gap against K = 0")
    print(f"{'K':>3} {'corr':>4}  {'accuracy':>15} {'gap':>7}  {'age mean/max':>12}  {'w mean':>6} {'w max':>7} "
          f"{'TIS cut':>7}  {'window s':>8}  token ages")
    for r in result["rows"]:
        print(f"{r['k']:>3} {r['corrections']:>4}  {r['accuracy_mean']:.3f} ± {r['accuracy_sd']:.3f}   "
              f"{r['gap']:+.3f}  {r['token_age_mean']:5.2f} / {r['token_age_max']:<4}  {r['weight_mean']:6.3f} "
              f"{r['weight_max']:7.2f} {r['tis_clipped_frac']:7.2%}  {r['train_wall_mean_s']:8.1f}  "
              f"{_age(r['token_age_histogram'])}")

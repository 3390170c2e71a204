"""`tokenflow bench pipeline`: the same run synchronous and asynchronous, side by side.

Both runs use the same config, seed and number of optimizer steps; only
``rollout.max_staleness`` differs (0 for the synchronous run). The wall times compared are the
training windows (first admission to last optimizer step), which is what asynchrony changes;
start-up and the two evaluations are reported separately. The ideal async/sync ratio
max(G, T) / (G + T) uses the per-step generation time G and training time T measured by the
synchronous run, so the async result can be read against its limit.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("pipeline", help="synchronous vs asynchronous training, same seed and steps")
    p.add_argument("config", nargs="?", help="TOML config (default: the embedded arithmetic run)")
    p.add_argument("--output-dir", help="where the two run folders go (default runs/bench-pipeline-<time>)")
    p.add_argument("--async-staleness", type=int, default=None,
                   help="max_staleness of the async run (default: the config's)")
    p.add_argument("--teacher", default=None,
                   help="compare two async runs instead, without and with this teacher scorer "
                        "(scorer.teacher.model; docs/scorers.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, _allow_overrides=True)


def _steps_and_times(run_dir: Path) -> tuple[float, float]:
    """Mean generation time G and training time T per step of a synchronous run."""
    from tokenflow.metrics.sinks import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss/total" in r]
    steps = [r["time/step_s"] for r in rows]
    train = [r["time/train_s"] + r.get("sync/trainer_s", 0.0) for r in rows]
    t = sum(train) / len(train)
    g = sum(steps) / len(steps) - t
    return g, t


def run(args, overrides: list[str] | None = None) -> int:
    from tokenflow.config.loading import ConfigError, load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import default_config_path, train

    try:
        base = load_config(TrainConfig, args.config or default_config_path(), overrides or [])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.output_dir or f"runs/bench-pipeline-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists; choose another --output-dir", file=sys.stderr)
        return 2
    k = base.rollout.max_staleness if args.async_staleness is None else args.async_staleness
    if k == 0:
        print("error: the async run needs max_staleness ≥ 1 (--async-staleness)", file=sys.stderr)
        return 2
    if args.teacher:
        from tokenflow.bench.pipeline_teacher import run_with_teacher

        return run_with_teacher(base, out, k, args.teacher, args.json)
    runs = {}
    for name, staleness in (("sync", 0), ("async", k)):
        cfg = base.model_copy(deep=True)
        cfg.rollout.max_staleness = staleness
        cfg = TrainConfig.model_validate(cfg.model_dump())
        logger.info("bench pipeline: %s run (max_staleness %d) → %s", name, staleness, out / name)
        runs[name] = train(cfg, out / name)
    g, t = _steps_and_times(out / "sync")
    s, a = runs["sync"], runs["async"]
    result = {
        "steps": s["steps"], "async_max_staleness": k,
        "sync_wall_s": s["train_wall_s"], "async_wall_s": a["train_wall_s"],
        "async_over_sync": a["train_wall_s"] / s["train_wall_s"],
        "sync_total_wall_s": s["wall_s"], "async_total_wall_s": a["wall_s"],
        "ideal_async_over_sync": max(g, t) / (g + t), "sync_gen_s_per_step": g, "sync_train_s_per_step": t,
        "sync_trainer_idle_frac": s["trainer_idle_frac"], "async_trainer_idle_frac": a["trainer_idle_frac"],
        "sync_engine_idle_frac": s["engine_idle_frac"], "async_engine_idle_frac": a["engine_idle_frac"],
        "baseline_accuracy": s["baseline_accuracy"],
        "sync_accuracy": s["final_accuracy"], "async_accuracy": a["final_accuracy"],
        "output_dir": str(out),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"steps {result['steps']} (same seed), training-window wall time:")
    print(f"  sync  (K=0)  {s['train_wall_s']:8.1f} s   trainer idle {s['trainer_idle_frac']:.1%}   "
          f"engine idle {s['engine_idle_frac']:.1%}   accuracy {s['baseline_accuracy']:.3f} → {s['final_accuracy']:.3f}")
    print(f"  async (K={k})  {a['train_wall_s']:8.1f} s   trainer idle {a['trainer_idle_frac']:.1%}   "
          f"engine idle {a['engine_idle_frac']:.1%}   accuracy {a['baseline_accuracy']:.3f} → {a['final_accuracy']:.3f}")
    print(f"  async / sync = {result['async_over_sync']:.3f}   ideal max(G,T)/(G+T) = "
          f"{result['ideal_async_over_sync']:.3f}  (G = {g:.3f} s, T = {t:.3f} s per step, from the sync run)")
    print(f"  total wall incl. start-up and evaluations: sync {s['wall_s']:.1f} s, async {a['wall_s']:.1f} s")
    return 0

"""`tokenflow bench pipeline`: the same run synchronous and asynchronous, side by side.

Both runs use the same config, seed and number of optimizer steps; only
``rollout.max_staleness`` differs (0 for the synchronous run). The wall times compared are the
training windows (first admission to last optimizer step), which is what asynchrony changes;
start-up and the two evaluations are reported separately. The ideal async/sync ratio
max(G, T) / (G + T) uses the per-step generation time G and training time T measured by the
synchronous run, so the async result can be read against its limit. That limit assumes each side
runs as fast in both modes, so both runs keep their own threads (``runtime.lend_trainer_threads``
off, unless the config or an override sets it): lent, the synchronous run's engine would generate
on the trainer's threads too, since its trainer waits through every generation, which an
asynchronous engine cannot.

``--seeds N`` repeats the pair for seeds run.seed … run.seed + N − 1 (each pair in
``seed<S>/sync`` and ``seed<S>/async`` with its own ``bench.json``) and prints the mean and
spread of both accuracies and of the wall ratio, since on a small task one seed's accuracy moves
by a point or two: compare modes over seeds, not on one.
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
    p.add_argument("--seeds", type=int, default=1,
                   help="repeat the comparison for this many seeds (run.seed, run.seed + 1, ...) and print "
                        "the mean and spread; each seed's runs go to seed<N>/ under the output folder")
    p.add_argument("--staleness", default=None,
                   help="sweep max_staleness instead: comma-separated K values (e.g. 0,1,2,4,8; K = 0, the "
                        "synchronous reference, is always run), each for --seeds seeds, printing accuracy, "
                        "token ages, behaviour-weight statistics and wall per K")
    p.add_argument("--corrections", default="on,off",
                   help="with --staleness: 'on' (the config's corrections), 'off' (algorithm.behaviour_logprobs "
                        "= false: no behaviour weight) or both, comma-separated (default on,off)")
    p.add_argument("--timings", type=int, default=1,
                   help="with --staleness: run every asynchronous (K ≥ 1) run this many times (a run's accuracy "
                        "moves with timing) and report per K the mean, the minimum and the collapsed runs")
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
    from tokenflow.config.presets import default_config_path

    try:
        base = load_config(TrainConfig, args.config or default_config_path(), overrides or [])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "lend_trainer_threads" not in base.runtime.model_fields_set:
        base.runtime.lend_trainer_threads = False  # the ideal assumes G and T the same in both modes
        logger.info("bench pipeline: each side on its own threads in both runs (runtime.lend_trainer_threads "
                    "off; set it to compare with it)")
    out = Path(args.output_dir or f"runs/bench-pipeline-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists; choose another --output-dir", file=sys.stderr)
        return 2
    if args.staleness is not None:
        return _run_sweep(base, out, args)
    k = base.rollout.max_staleness if args.async_staleness is None else args.async_staleness
    if k == 0:
        print("error: the async run needs max_staleness ≥ 1 (--async-staleness)", file=sys.stderr)
        return 2
    if args.teacher:
        if args.seeds != 1:
            print("error: --teacher compares one seed; drop --seeds", file=sys.stderr)
            return 2
        from tokenflow.bench.pipeline_teacher import run_with_teacher

        return run_with_teacher(base, out, k, args.teacher, args.json)
    if args.seeds < 1:
        print("error: --seeds needs at least 1", file=sys.stderr)
        return 2
    seeds = [base.run.seed + i for i in range(args.seeds)]
    results = []
    for seed in seeds:
        folder = out if len(seeds) == 1 else out / f"seed{seed}"
        results.append(_one_seed(base, folder, k, seed))
        if len(seeds) > 1 and not args.json:
            _print_one(results[-1], heading=f"seed {seed}: ")
    if len(seeds) == 1:
        result = results[0]
        if args.json:
            print(json.dumps(result))
        else:
            _print_one(result)
        return 0
    summary = summarize(results, k)
    summary["output_dir"] = str(out)
    (out / "bench.json").write_text(json.dumps(summary, indent=2))
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    return 0


def _run_sweep(base, out: Path, args) -> int:
    from tokenflow.bench.pipeline_staleness import SETTINGS, parse_staleness, print_table, sweep

    try:
        ks = parse_staleness(args.staleness)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = [s.strip() for s in args.corrections.split(",") if s.strip()]
    bad = [s for s in settings if s not in SETTINGS]
    if bad or not settings:
        print(f"error: --corrections takes on, off or on,off (got {args.corrections!r})", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.teacher or args.timings < 1:
        print("error: --staleness needs --seeds ≥ 1, --timings ≥ 1 and no --teacher", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    result = sweep(base, out, ks, [base.run.seed + i for i in range(args.seeds)], settings, args.timings)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def _one_seed(base, out: Path, k: int, seed: int) -> dict:
    """The synchronous and the asynchronous run of one seed, into ``out/sync`` and ``out/async``;
    the comparison is written to ``out/bench.json`` and returned."""
    from tokenflow.config.root import TrainConfig
    from tokenflow.runtime.launch import train

    runs = {}
    for name, staleness in (("sync", 0), ("async", k)):
        cfg = base.model_copy(deep=True)
        cfg.rollout.max_staleness = staleness
        cfg.run.seed = seed
        cfg = TrainConfig.model_validate(cfg.model_dump())
        logger.info("bench pipeline: %s run (max_staleness %d, seed %d) → %s", name, staleness, seed, out / name)
        runs[name] = train(cfg, out / name)
    g, t = _steps_and_times(out / "sync")
    s, a = runs["sync"], runs["async"]
    result = {
        "steps": s["steps"], "seed": seed, "async_max_staleness": k,
        "sync_wall_s": s["train_wall_s"], "async_wall_s": a["train_wall_s"],
        "async_over_sync": a["train_wall_s"] / s["train_wall_s"],
        "sync_total_wall_s": s["wall_s"], "async_total_wall_s": a["wall_s"],
        "ideal_async_over_sync": max(g, t) / (g + t), "sync_gen_s_per_step": g, "sync_train_s_per_step": t,
        "sync_trainer_idle_frac": s["trainer_idle_frac"], "async_trainer_idle_frac": a["trainer_idle_frac"],
        "sync_engine_idle_frac": s["engine_idle_frac"], "async_engine_idle_frac": a["engine_idle_frac"],
        "lend_trainer_threads": base.runtime.lend_trainer_threads,
        "baseline_accuracy": s["baseline_accuracy"],
        "sync_accuracy": s["final_accuracy"], "async_accuracy": a["final_accuracy"],
        "async_token_age_over_k_frac": _over_k(a["token_age_histogram"], k),
        "output_dir": str(out),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    return result


def _over_k(histogram: dict, k: int) -> float:
    """Share of consumed generated tokens older than ``k`` versions."""
    total = sum(histogram.values())
    return sum(c for a, c in histogram.items() if int(a) > k) / total if total else 0.0


def _mean_sd(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return mean, sd


def summarize(results: list[dict], k: int) -> dict:
    """Mean and spread over seeds of what ``_one_seed`` measured. The wall ratio and its ideal are
    averaged per seed (each seed's async run is read against its own sync run), and
    ``wall_ratio_over_ideal`` is the mean ratio divided by the mean ideal."""
    def stat(key: str) -> dict:
        mean, sd = _mean_sd([r[key] for r in results])
        return {"mean": mean, "sd": sd, "min": min(r[key] for r in results), "max": max(r[key] for r in results)}

    keys = ("sync_accuracy", "async_accuracy", "async_over_sync", "ideal_async_over_sync", "sync_wall_s",
            "async_wall_s", "sync_gen_s_per_step", "sync_train_s_per_step", "async_token_age_over_k_frac",
            "sync_trainer_idle_frac", "async_trainer_idle_frac", "sync_engine_idle_frac", "async_engine_idle_frac")
    out = {"steps": results[0]["steps"], "seeds": [r["seed"] for r in results], "async_max_staleness": k}
    out.update({key: stat(key) for key in keys})
    out["accuracy_gap"] = out["async_accuracy"]["mean"] - out["sync_accuracy"]["mean"]
    out["wall_ratio_over_ideal"] = out["async_over_sync"]["mean"] / out["ideal_async_over_sync"]["mean"]
    out["per_seed"] = results
    return out


def _print_one(r: dict, heading: str = "") -> None:
    k = r["async_max_staleness"]
    print(f"{heading}steps {r['steps']} (same seed), training-window wall time:")
    print(f"  sync  (K=0)  {r['sync_wall_s']:8.1f} s   trainer idle {r['sync_trainer_idle_frac']:.1%}   "
          f"engine idle {r['sync_engine_idle_frac']:.1%}   accuracy {r['baseline_accuracy']:.3f} → {r['sync_accuracy']:.3f}")
    print(f"  async (K={k})  {r['async_wall_s']:8.1f} s   trainer idle {r['async_trainer_idle_frac']:.1%}   "
          f"engine idle {r['async_engine_idle_frac']:.1%}   accuracy {r['baseline_accuracy']:.3f} → {r['async_accuracy']:.3f}"
          f"   tokens older than K {r['async_token_age_over_k_frac']:.1%}")
    print(f"  async / sync = {r['async_over_sync']:.3f}   ideal max(G,T)/(G+T) = "
          f"{r['ideal_async_over_sync']:.3f}  (G = {r['sync_gen_s_per_step']:.3f} s, "
          f"T = {r['sync_train_s_per_step']:.3f} s per step, from the sync run)")
    print(f"  total wall incl. start-up and evaluations: sync {r['sync_total_wall_s']:.1f} s, "
          f"async {r['async_total_wall_s']:.1f} s")


def _print_summary(s: dict) -> None:
    def ms(key: str, fmt: str = ".3f") -> str:
        v = s[key]
        return f"{v['mean']:{fmt}} ± {v['sd']:{fmt}} (min {v['min']:{fmt}}, max {v['max']:{fmt}})"

    n = len(s["seeds"])
    print(f"over {n} seeds ({', '.join(map(str, s['seeds']))}), {s['steps']} steps each; mean ± sd:")
    print(f"  held-out accuracy  sync  (K=0)  {ms('sync_accuracy')}")
    print(f"  held-out accuracy  async (K={s['async_max_staleness']})  {ms('async_accuracy')}")
    print(f"  accuracy gap (async − sync)   {s['accuracy_gap']:+.3f}")
    print(f"  training window    sync {ms('sync_wall_s', '.1f')} s   async {ms('async_wall_s', '.1f')} s")
    print(f"  async / sync       {ms('async_over_sync')}")
    print(f"  ideal max(G,T)/(G+T) {ms('ideal_async_over_sync')}  "
          f"(G = {s['sync_gen_s_per_step']['mean']:.3f} s, T = {s['sync_train_s_per_step']['mean']:.3f} s per step)")
    print(f"  (async / sync) ÷ ideal = {s['wall_ratio_over_ideal']:.3f}")

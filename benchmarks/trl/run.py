"""tokenflow against TRL's GRPOTrainer: same model, prompts, reward, batch, lengths, lr schedule, steps.

    python benchmarks/trl/run.py --setup                    # once: build .venv-trl (pinned TRL)
    python benchmarks/trl/run.py --steps 60 --seeds 0,1,2   # both workloads, all three sides

Run it with tokenflow's own interpreter. Sides: ``trl`` (GRPOTrainer, in .venv-trl),
``tokenflow-sync`` (max_staleness 0) and ``tokenflow-async`` (the preset's max_staleness, 1).
Workloads: ``default`` (the shipped model, up to 96 new tokens), ``gen-heavy`` (a 3.4M-parameter
model of the bench engine model's shape whose sampled completions have long-tailed lengths, up to
256 new tokens; built once with `make_default_model --preset long-tail`) and, when asked for,
``smollm2`` (SmolLM2-135M-Instruct on examples/laptop_math with that example's config). Every model, from either side, is scored by ``tokenflow eval`` on the same
held-out prompts. Prints a table; writes results.json, table.md and accuracy_vs_wall.png into
--out. Settings and every remaining difference: benchmarks/trl/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
import sides  # noqa: E402

SIDES = ("trl", "tokenflow-sync", "tokenflow-async")
CACHE = Path(__file__).resolve().parent / ".cache"


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="default,gen-heavy",
                    help="comma-separated: default, gen-heavy, smollm2 (a real instruct model; slow)")
    ap.add_argument("--sides", default=",".join(SIDES), help="comma-separated: " + ", ".join(SIDES))
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per run (both sides)")
    ap.add_argument("--seeds", default="0", help="comma-separated run seeds")
    ap.add_argument("--curve-every", type=int, default=0,
                    help="also save and score a checkpoint every N steps (accuracy curve); 0: start and end only")
    ap.add_argument("--eval-limit", type=int, default=None, help="score on the first N held-out prompts (default all 256)")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process (it runs alone)")
    ap.add_argument("--trl-micro-batches", type=int, default=1,
                    help="TRL trains each step's completions in this many micro-batches (gradient accumulation; "
                         "the same loss), so that it fits in memory: 4 for smollm2 in float32 on a 24 GB machine")
    ap.add_argument("--setup", action="store_true", help="build the TRL environment (--trl-venv) if it is missing")
    ap.add_argument("--trl-venv", type=Path, default=sides.TRL_VENV, help="the TRL environment (default .venv-trl)")
    ap.add_argument("--gen-heavy-model", default=None, help="model folder for gen-heavy (default: build it once)")
    ap.add_argument("--gen-heavy-warmup-steps", type=int, default=None,
                    help="supervised warm-start steps when building the gen-heavy model (default: the preset's 400)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default runs/bench-trl-<time>)")
    return ap.parse_args(argv)


def workloads(args) -> dict[str, sides.Workload]:
    out = {"default": sides.Workload("default", "default", 96, "the shipped 0.9M-parameter model, up to 96 new tokens")}
    if "gen-heavy" in args.workloads.split(","):
        path = args.gen_heavy_model or str(sides.build_gen_heavy_model(CACHE / "gen-heavy-model",
                                                                      args.gen_heavy_warmup_steps))
        # lr 3e-5: at the default task's 3e-4 every side's reward fell (0.20 to ~0 in 60 steps)
        # and held-out accuracy collapsed; at 3e-5 a 30-step synchronous run rose 0.414 → 0.488.
        out["gen-heavy"] = sides.Workload("gen-heavy", path, 256,
                                          "3.4M-parameter long-tailed-length policy, up to 256 new tokens", lr=3e-5)
    # The real model on examples/laptop_math, with that example's config on both sides: its chat
    # template and system prompt, 8 prompts × 8, temperature 0.7, 64 new tokens, lr 2e-5 constant,
    # bfloat16 autocast over float32 weights where the CPU has bfloat16 units (its "native"), float32 elsewhere.
    out["smollm2"] = sides.Workload("smollm2", "smollm2-135m-instruct", 64,
                                    "SmolLM2-135M-Instruct on examples/laptop_math, up to 64 new tokens",
                                    lr=2e-5, config="examples/laptop_math/config.toml")
    unknown = set(args.workloads.split(",")) - set(out)
    if unknown:
        raise SystemExit(f"unknown workload(s) {sorted(unknown)}; choose from {', '.join(out)}")
    return {k: out[k] for k in args.workloads.split(",")}


def main(argv=None) -> int:
    args = parse(argv)
    chosen = args.sides.split(",")
    unknown = set(chosen) - set(SIDES)
    if unknown:
        raise SystemExit(f"unknown side(s) {sorted(unknown)}; choose from {', '.join(SIDES)}")
    out = (args.out or Path(f"runs/bench-trl-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    skipped = {}
    python = None
    if "trl" in chosen:
        python = sides.trl_python(args.trl_venv) or (sides.build_trl_venv(args.trl_venv) if args.setup else None)
        if python is None:
            skipped["trl"] = f"no TRL environment at {args.trl_venv}; build it with --setup"
            print(f"skipping the TRL side: {skipped['trl']}", file=sys.stderr)
            chosen.remove("trl")
    seeds = [int(s) for s in args.seeds.split(",")]
    load_start = os.getloadavg()
    runs, scores = [], {}
    chosen_workloads = workloads(args)
    for w in chosen_workloads.values():
        for seed in seeds:
            for side in chosen:
                folder = out / w.name / f"{side}-seed{seed}"
                print(f"[{time.strftime('%H:%M:%S')}] {w.name} / {side} / seed {seed} → {folder}", file=sys.stderr)
                if side == "trl":
                    res = sides.run_trl(python, w, seed, args.steps, folder, save_every=args.curve_every,
                                        threads=args.trl_threads, micro_batches=args.trl_micro_batches)
                else:
                    res = sides.run_tokenflow(w, seed, args.steps, folder, staleness=0 if side == "tokenflow-sync" else None,
                                              save_every=args.curve_every, eval_limit=args.eval_limit)
                for p in res.points:
                    p["accuracy"] = sides.evaluate(p["model"], w, args.eval_limit, scores)
                runs.append({"workload": w.name, **asdict(res), "final_accuracy": res.points[-1]["accuracy"],
                             "load_average": list(os.getloadavg())})
    rows = report.summarise(runs)
    text = report.table(rows)
    results = {
        "settings": {"steps": args.steps, "seeds": seeds, "sides": chosen, "eval_limit": args.eval_limit,
                     "curve_every": args.curve_every, "trl_threads": args.trl_threads,
                     "trl_micro_batches": args.trl_micro_batches,
                     "workloads": {k: asdict(v) for k, v in chosen_workloads.items()},
                     "default_batch": "16 prompts × 8 samples, cosine to 0.1 × lr, no warmup",
                     "config_batch": "the workload's config (smollm2: 8 × 8, constant lr)"},
        "skipped": skipped, "load_average_start": list(load_start), "load_average_end": list(os.getloadavg()),
        "cpus": os.cpu_count(), "summary": rows, "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "table.md").write_text(text + "\n")
    report.figure(runs, out / "accuracy_vs_wall.png")
    print(text)
    print(f"\nload average {load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"results.json, table.md and accuracy_vs_wall.png in {out}")
    for side, why in skipped.items():
        print(f"skipped {side}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

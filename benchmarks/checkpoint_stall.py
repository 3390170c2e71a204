"""The stall per checkpoint: how long the training loop is held up by one, per checkpoint.

    PYTHONPATH=src python benchmarks/checkpoint_stall.py --out /tmp/stall [overrides...]
    PYTHONPATH=src python benchmarks/checkpoint_stall.py --out /tmp/stall --run.checkpoint_background false
    PYTHONPATH=src python benchmarks/checkpoint_stall.py --out /tmp/stall --model.path smollm2-135m-instruct \\
        --rollout.prompts_per_step 2 --rollout.group_size 2 --sampling.max_tokens 16 --trainer.lr 1e-6

Runs a short real run (the default task unless overridden, a checkpoint after every step) and
prints one JSON line: the stall of each periodic checkpoint (from the moment it is taken until
the trainer may take the next step), and their median. A tokenflow that predates
``time/checkpoint_stall_s`` (the checkpoint written by the trainer, then committed in the
orchestrator's loop, both before the next step) is timed the same way from outside: from
``run_state.checkpoint`` to the end of ``run_state.on_saved``; so this script measures the code
before and after the background checkpoints alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

DEFAULTS = ["--run.steps", "6", "--run.checkpoint_every", "1", "--run.keep_checkpoints", "2",
            "--run.eval_limit", "4", "--metrics.progress", "false", "--metrics.sinks", '["jsonl"]',
            "--rollout.prompts_per_step", "4", "--rollout.group_size", "4", "--sampling.max_tokens", "64"]


def _time_old_checkpoints(stalls: list[float]) -> bool:
    """Wrap the synchronous checkpoint of a tokenflow without the metric; False if it has it."""
    from tokenflow.runtime.orchestrator import run_state

    if not hasattr(run_state, "on_saved"):
        return False
    begin, saved, started = run_state.checkpoint, run_state.on_saved, {}

    def checkpoint(orch):
        started[orch.step] = time.monotonic()
        begin(orch)

    def on_saved(orch, msg):
        step = orch._pending_checkpoint[1]
        saved(orch, msg)
        stalls.append(time.monotonic() - started.pop(step))

    run_state.checkpoint, run_state.on_saved = checkpoint, on_saved
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the run folder (replaced)")
    args, overrides = parser.parse_known_args()
    import shutil

    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.metrics.sinks import read_jsonl
    from tokenflow.runtime.launch import train

    shutil.rmtree(args.out, ignore_errors=True)
    cfg = load_config(TrainConfig, None, [*DEFAULTS, *overrides])
    outside: list[float] = []
    old = _time_old_checkpoints(outside)
    t0 = time.monotonic()
    summary = train(cfg, args.out)
    wall = time.monotonic() - t0
    if old:
        stalls, how = outside[:-1], "timed from outside (synchronous checkpoints)"  # the last is the final one
    else:
        rows = [r for r in read_jsonl(f"{args.out}/metrics.jsonl") if "time/checkpoint_stall_s" in r]
        stalls, how = [r["time/checkpoint_stall_s"] for r in rows], "time/checkpoint_stall_s"
    print(json.dumps({"model": cfg.model.path, "background": None if old else cfg.run.checkpoint_background,
                      "how": how, "checkpoints": len(stalls), "stall_s": [round(s, 4) for s in stalls],
                      "stall_s_median": round(statistics.median(stalls), 4) if stalls else None,
                      "step_s_median": round(statistics.median(
                          r["time/step_s"] for r in read_jsonl(f"{args.out}/metrics.jsonl") if "time/step_s" in r), 3),
                      "run_wall_s": round(wall, 1), "steps": summary["steps"]}))


if __name__ == "__main__":
    main()

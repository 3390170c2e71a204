"""What `tokenflow bench chaos` checks once a killed-and-resumed run has completed: its ledger
against exact accounting, its metric rows, its checkpoints, what it left in /dev/shm, and its final
weights against a run that was never killed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def prompt_accounting(run_dir: Path) -> dict:
    """Prompts lost / repeated, from prompts.jsonl (what each step consumed) and the summary's
    in-flight ids (admitted, not yet consumed, when the run ended). Prompt ids are positions in
    the training stream, so everything seen must be exactly 0..max."""
    import json

    from tokenflow.metrics.sinks import read_jsonl

    ledger = read_jsonl(run_dir / "prompts.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    consumed = [p for row in ledger for p in row["prompt_ids"]]
    # Dynamic sampling's dropped prompts were scored and left out: seen once, like the trained.
    seen = consumed + [p for row in ledger for p in row.get("dropped_prompt_ids", [])]
    everything = set(seen) | set(summary.get("in_flight_prompt_ids", []))
    steps = Counter(row["step"] for row in ledger)
    return {
        "prompts_consumed": len(consumed),
        "prompts_repeated": len(seen) - len(set(seen)),
        "prompts_lost": (max(everything) + 1 - len(everything)) if everything else 0,
        "ledger_steps_missing": sum(1 for s in range(1, summary["steps"] + 1) if s not in steps),
        "ledger_steps_repeated": sum(n - 1 for n in steps.values() if n > 1),
    }


def metric_rows(run_dir: Path, steps: int) -> dict:
    """Duplicated rows: a training row or an evaluation row logged twice for one step."""
    from tokenflow.metrics.sinks import read_jsonl

    keys = Counter((r.get("step"), "train" if "loss/total" in r else "eval" if "eval/accuracy" in r else "other")
                   for r in read_jsonl(run_dir / "metrics.jsonl"))
    trained = {s for s, kind in keys if kind == "train"}
    return {"metric_rows_duplicated": sum(n - 1 for n in keys.values() if n > 1),
            "metric_steps_missing": sum(1 for s in range(1, steps + 1) if s not in trained)}


def checkpoints(run_dir: Path) -> dict:
    from tokenflow.runtime.run.run_dir import RunDir, verify_checkpoint

    rd = RunDir(run_dir)
    cps = rd.complete_checkpoints()
    bad = [cp.name for cp in cps if verify_checkpoint(cp) is not None]
    return {"checkpoints": len(cps), "checkpoints_bad": len(bad),
            "checkpoints_set_aside": len(list(rd.checkpoints.glob(".bad-*"))),
            "staging_left": len(list(rd.checkpoints.glob(".tmp-*")))}


def shm_left(*run_dirs: Path) -> list[str]:
    from tokenflow.runtime.run.resources import leftovers, run_tag

    return [p.name for d in run_dirs for p in leftovers(run_tag(d))]


def weights_diff(a: Path, b: Path) -> float:
    """Largest absolute difference between two checkpoints' model weights (inf if they differ in
    names or shapes)."""
    from safetensors.torch import load_file

    def load(cp: Path) -> dict:
        out = {}
        for f in sorted((cp / "model").glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    wa, wb = load(a), load(b)
    if wa.keys() != wb.keys() or any(wa[k].shape != wb[k].shape for k in wa):
        return float("inf")
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa) if wa else 0.0

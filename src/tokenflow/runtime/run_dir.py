"""The run folder and its checkpoints.

    runs/<name>/
      config.toml          resolved config
      metrics.jsonl        one line per optimizer step (and eval rows)
      prompts.jsonl        the prompt ids each step consumed (exact accounting across resume)
      rollouts.jsonl       every consumed rollout, with run.save_rollouts = true
      workers.json         name → pid of each worker process of the current invocation
      summary.json         baseline/final accuracy, wall time, steps, idle fractions
      calibration.json     component timings for `tokenflow simulate --calibrate`
      tensorboard/  trace/  checkpoints/step_000010/{model/, trainer_state.pt, orchestrator.json, buffer.pkl}

A checkpoint is written into a hidden temporary folder and renamed into place, so a folder named
``step_*`` is always complete; a run killed mid-write leaves only a temporary folder, removed on
resume.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

from tokenflow.metrics.sinks import read_jsonl


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    config = property(lambda self: self.root / "config.toml")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    ledger = property(lambda self: self.root / "prompts.jsonl")
    rollouts = property(lambda self: self.root / "rollouts.jsonl")
    workers = property(lambda self: self.root / "workers.json")
    summary = property(lambda self: self.root / "summary.json")
    calibration = property(lambda self: self.root / "calibration.json")
    trace_dir = property(lambda self: self.root / "trace")
    checkpoints = property(lambda self: self.root / "checkpoints")

    def create(self) -> "RunDir":
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        return self

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def complete_checkpoints(self) -> list[Path]:
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.iterdir() if p.is_dir() and p.name.startswith("step_"))

    def latest_checkpoint(self) -> Path | None:
        cps = self.complete_checkpoints()
        return cps[-1] if cps else None

    def staging_dir(self, step: int) -> Path:
        tmp = self.checkpoints / f".tmp-step_{step:06d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, staging: Path, step: int, orchestrator_state: dict, buffer_state: dict,
                          keep: int) -> Path:
        (staging / "orchestrator.json").write_text(json.dumps(orchestrator_state, indent=1))
        with open(staging / "buffer.pkl", "wb") as f:
            pickle.dump(buffer_state, f)
        final = self.checkpoint_dir(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)  # atomic: the step_* name appears only when complete
        for old in self.complete_checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def clean_staging(self) -> None:
        for p in self.checkpoints.glob(".tmp-*"):
            shutil.rmtree(p, ignore_errors=True)

    @staticmethod
    def load_checkpoint(path: Path) -> tuple[dict, dict]:
        state = json.loads((path / "orchestrator.json").read_text())
        with open(path / "buffer.pkl", "rb") as f:
            buffer_state = pickle.load(f)
        return state, buffer_state

    def append_rollouts(self, step: int, rollouts) -> None:
        """Record the rollouts a step consumed (``run.save_rollouts``), one JSON object each."""
        with open(self.rollouts, "a", encoding="utf-8") as f:
            for r in rollouts:
                f.write(json.dumps({
                    "step": step, "group_id": r.group_id, "prompt_id": r.prompt_id,
                    "sample_index": r.sample_index, "prompt_ids": r.prompt_ids.tolist(),
                    "completion_ids": r.completion_ids.tolist(), "logprobs": r.logprobs.tolist(),
                    "versions": r.versions.tolist(), "reward": r.reward, "failed": r.failed,
                    "finish_reason": r.finish_reason, "text": r.text,
                    "token_rewards": None if r.token_rewards is None else r.token_rewards.tolist()}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Forget rows logged after ``step`` (work the killed run did past its last checkpoint)."""
        for path in (self.metrics, self.ledger, self.rollouts):
            if not path.exists():
                continue
            rows = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.replace(tmp, path)

"""The run folder and its checkpoints.

    runs/<name>/
      .tokenflow-run       the marker that makes it a run folder (runtime/run/folder_guard.py)
      config.toml          resolved config
      metrics.jsonl        one line per optimizer step (and eval rows)
      prompts.jsonl        the prompt ids each step consumed, and dynamic sampling's dropped ones (exact accounting across resume)
      rollouts.jsonl       every consumed rollout, with run.save_rollouts = true
      samples.jsonl        decoded samples: a few per step, every held-out one (runtime/run/samples.py)
      workers.json         name → pid of each worker process of the current invocation
      engines.jsonl        engines joining and leaving, and every weight load per engine (Ray)
      control/             requests to the live run (`tokenflow engines`, runtime/run/control.py)
      summary.json         baseline/final accuracy, wall time, steps, idle fractions
      calibration.json     component timings for `tokenflow simulate --calibrate`
      tensorboard/  trace/  checkpoints/step_000010/{model/, trainer_state.pt, orchestrator.json,
                                               buffer.json, buffer.safetensors,
                                               inflight.json, inflight.safetensors}

A checkpoint is written into a hidden temporary folder, closed with a ``manifest.json`` (the
size and SHA-256 of every file in it), flushed to disk and renamed into place, so a folder named
``step_*`` is complete when it appears; a run killed mid-write leaves only a temporary folder,
removed on resume. A checkpoint is loaded only if its manifest is there and every file matches
it: one damaged later (a torn copy, a disk error) is set aside as ``.bad-step_*`` and the one
before it is used. A write that fails (a full disk) removes its temporary folder and leaves the
previous checkpoint as it was.

Nothing in a run folder is code: the orchestrator's and the buffer's state are JSON, the
buffer's rollouts safetensors (`tokenflow.rollout_files`), the trainer's state a tensors-only
``torch.save`` read back with ``weights_only=True``. A run folder from elsewhere can be resumed
without trusting it to run nothing; a file that does not read as what it should be is a
`CheckpointError` naming the file, and the checkpoint is not used. Code its config names runs only
when the user says so (`tokenflow.runtime.run.folder_code`); a folder is a run folder only with
its marker, and tokenflow writes in it only without following links
(`tokenflow.runtime.run.folder_guard`, `tokenflow.metrics.safe_files`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from tokenflow.errors import CheckpointError
from tokenflow.metrics.safe_files import open_text, write_atomic
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.run.folder_guard import write_marker
from tokenflow.runtime.run.inflight_files import read_inflight
from tokenflow.rollout_files import RolloutFileError, decode, encode

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(root: Path) -> None:
    """Record every file's size and checksum, with everything (the manifest last) on disk."""
    entries = {}
    for p in _files(root):
        with open(p, "rb") as f:
            os.fsync(f.fileno())
        entries[str(p.relative_to(root))] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    write_atomic(root / MANIFEST, json.dumps({"files": entries}, indent=1), fsync=True)


def verify_checkpoint(root: Path) -> str | None:
    """None if ``root`` is whole (every file its manifest lists, of that size and checksum), else why not."""
    try:
        entries = json.loads((root / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return "it has no manifest (its write never finished)"
    except (ValueError, KeyError, TypeError) as e:
        return f"its manifest is unreadable ({e})"
    for rel, want in entries.items():
        p = root / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != want["bytes"]:
            return f"{rel} has {p.stat().st_size} bytes, the manifest says {want['bytes']}"
        if _sha256(p) != want["sha256"]:
            return f"{rel} does not match its checksum"
    return None


def _read_json(path: Path, kind: type):
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete: delete it to resume "
                              "from the one before") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the checkpoint is damaged: delete it to "
                              "resume from the one before") from None
    if not isinstance(value, kind):
        raise CheckpointError(f"{path} holds a {type(value).__name__}, not a {kind.__name__}; the checkpoint "
                              "is damaged or not tokenflow's: delete it to resume from the one before")
    return value


def write_buffer_state(folder: Path, state: dict) -> None:
    """The buffer's counters as ``buffer.json``, its scored groups' rollouts as ``buffer.safetensors``."""
    ready = state["ready"]
    order = sorted(ready)
    counters = {k: v for k, v in state.items() if k != "ready"}
    counters["ready"] = [[int(gid), len(ready[gid])] for gid in order]
    write_atomic(folder / "buffer.json", json.dumps(counters, indent=1, allow_nan=False))
    write_atomic(folder / "buffer.safetensors", encode([r for gid in order for r in ready[gid]]))


def _ints(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_BUFFER_FIELDS = {  # what a buffer.json must hold, and a check of each
    "engine_version": _ints, "rollouts_admitted": _ints,
    "in_flight": lambda v: isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(map(_ints, p))
                                                       for p in v),
    "ready": lambda v: isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(map(_ints, p))
                                                   for p in v),
    "age_histogram": lambda v: isinstance(v, dict) and all(k.lstrip("-").isdigit() and _ints(c) for k, c in v.items()),
}


def read_buffer_state(folder: Path) -> dict:
    state = _read_json(folder / "buffer.json", dict)
    bad = [k for k, ok in _BUFFER_FIELDS.items() if k not in state or not ok(state[k])]
    if bad:
        raise CheckpointError(f"{folder / 'buffer.json'} has no valid {', '.join(bad)}; the checkpoint is damaged "
                              "or not tokenflow's: delete it to resume from the one before")
    blob = folder / "buffer.safetensors"
    try:
        rollouts = decode(blob.read_bytes())
        groups, at = {}, 0
        for gid, n in state["ready"]:
            groups[int(gid)] = rollouts[at:at + int(n)]
            at += int(n)
        if at != len(rollouts):
            raise RolloutFileError(f"buffer.json lists {at} rollouts, the file holds {len(rollouts)}")
    except FileNotFoundError:
        raise CheckpointError(f"{blob} is missing; the checkpoint is incomplete: delete it to resume from "
                              "the one before") from None
    except (RolloutFileError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{blob} does not read as the buffer's rollouts ({e}); the checkpoint is "
                              "damaged or not tokenflow's: delete it to resume from the one before") from None
    state["ready"] = groups
    return state


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    config = property(lambda self: self.root / "config.toml")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    ledger = property(lambda self: self.root / "prompts.jsonl")
    rollouts = property(lambda self: self.root / "rollouts.jsonl")
    samples = property(lambda self: self.root / "samples.jsonl")
    workers = property(lambda self: self.root / "workers.json")
    engines_log = property(lambda self: self.root / "engines.jsonl")
    summary = property(lambda self: self.root / "summary.json")
    calibration = property(lambda self: self.root / "calibration.json")
    trace_dir = property(lambda self: self.root / "trace")
    checkpoints = property(lambda self: self.root / "checkpoints")

    def create(self) -> "RunDir":
        self.root.mkdir(parents=True, exist_ok=True)
        write_marker(self.root)
        self.checkpoints.mkdir(exist_ok=True)
        return self

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def complete_checkpoints(self) -> list[Path]:
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.iterdir() if p.is_dir() and p.name.startswith("step_"))

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint that verifies; damaged ones are set aside (never loaded)."""
        for cp in reversed(self.complete_checkpoints()):
            why = verify_checkpoint(cp)
            if why is None:
                return cp
            bad = cp.with_name(f".bad-{cp.name}")
            shutil.rmtree(bad, ignore_errors=True)
            os.replace(cp, bad)
            log.warning("checkpoint %s is damaged (%s); set aside as %s, using the one before it", cp, why, bad.name)
        return None

    def finished(self, steps: int) -> dict | None:
        """The summary of a run that already reached ``steps`` (None if it has not)."""
        if not self.summary.is_file():
            return None
        try:
            summary = json.loads(self.summary.read_text())
        except ValueError:
            return None
        cps = self.complete_checkpoints()
        if summary.get("steps", -1) >= steps and cps and int(cps[-1].name.split("_")[-1]) >= steps:
            return summary
        return None

    def reset(self) -> None:
        """Forget everything a run that never checkpointed did (it starts again from step 0)."""
        for path in (self.metrics, self.ledger, self.rollouts, self.samples, self.summary, self.calibration,
                     self.workers, self.engines_log):
            path.unlink(missing_ok=True)
        for path in (self.trace_dir, self.root / "tensorboard"):
            shutil.rmtree(path, ignore_errors=True)
        self.clean_staging()

    def write_failure(self, step: int, error: str, code: int = 0) -> str:
        """What a failed checkpoint write says: what failed, what is intact, what to do."""
        previous = self.complete_checkpoints()
        kept = f"the previous checkpoint ({previous[-1].name}) is intact" if previous else "no earlier checkpoint exists"
        fix = "free disk space" if code in (errno.ENOSPC, errno.EDQUOT) else "fix the cause"
        return f"writing checkpoint step {step} failed ({error}); {kept}; {fix}, then resume"

    def discard_staging(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def staging_dir(self, step: int) -> Path:
        tmp = self.checkpoints / f".tmp-step_{step:06d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, staging: Path, step: int, orchestrator_state: dict, buffer_state: dict,
                          keep: int, files: dict[str, bytes] | None = None) -> Path:
        """Close ``staging`` (the trainer's files already in it) with the orchestrator's and the
        buffer's state, ``files`` (name → bytes: the in-flight rollouts) and the manifest, and
        rename it into place. Safe to run in a thread beside the run: it reads only what it is
        given and writes only into ``staging`` and ``checkpoints/``."""
        final = self.checkpoint_dir(step)
        try:
            write_atomic(staging / "orchestrator.json", json.dumps(orchestrator_state, indent=1, allow_nan=False))
            write_buffer_state(staging, buffer_state)
            for name, data in (files or {}).items():
                write_atomic(staging / name, data)
            write_manifest(staging)
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)  # atomic: the step_* name appears only when complete
            fd = os.open(self.checkpoints, os.O_RDONLY)
            try:
                os.fsync(fd)  # the rename itself on disk
            finally:
                os.close(fd)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise CheckpointError(self.write_failure(step, str(e), e.errno or 0)) from None
        for old in self.complete_checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def clean_staging(self) -> None:
        for p in self.checkpoints.glob(".tmp-*") if self.checkpoints.is_dir() else []:
            shutil.rmtree(p, ignore_errors=True)

    @staticmethod
    def load_checkpoint(path: Path) -> tuple[dict, dict]:
        """(orchestrator state, buffer state) of a checkpoint, the kept in-flight rollouts in
        the first as ``"kept"`` (`tokenflow.runtime.run.inflight_files`); `CheckpointError`
        naming the file when one does not read."""
        if (path / "buffer.pkl").exists():
            raise CheckpointError(
                f"{path / 'buffer.pkl'} is a pickle (a checkpoint from an older tokenflow); it is not loaded, "
                "since unpickling a file runs code. Start the run again, or resume from a checkpoint "
                "this version wrote")
        state = _read_json(path / "orchestrator.json", dict)
        for key, kind in (("step", int), ("cursor", int), ("next_group_id", int)):
            if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
                raise CheckpointError(f"{path / 'orchestrator.json'} has no integer {key!r}; the checkpoint is "
                                      "damaged or not tokenflow's: delete it to resume from the one before")
        buffer_state = read_buffer_state(path)
        state["kept"] = read_inflight(path, state["step"])
        return state, buffer_state

    def _eval_row(self, path: Path, row: dict) -> bool:
        """A row an evaluation wrote (metrics.jsonl's accuracy, samples.jsonl's held-out samples)."""
        return (path == self.metrics and "eval/accuracy" in row) or (path == self.samples and row.get("kind") == "eval")

    def append_rollouts(self, step: int, rollouts) -> None:
        """Record the rollouts a step consumed (``run.save_rollouts``), one JSON object each."""
        with open_text(self.rollouts, "a") as f:
            for r in rollouts:
                f.write(json.dumps({
                    "step": step, "group_id": r.group_id, "prompt_id": r.prompt_id,
                    "sample_index": r.sample_index, "prompt_ids": r.prompt_ids.tolist(),
                    "completion_ids": r.completion_ids.tolist(), "logprobs": r.logprobs.tolist(),
                    "versions": r.versions.tolist(), "reward": r.reward, "failed": r.failed,
                    "finish_reason": r.finish_reason, "text": r.text, "engine": r.info.get("engine"),
                    "token_rewards": None if r.token_rewards is None else r.token_rewards.tolist()}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Forget rows logged after ``step`` (work the killed run did past its last checkpoint).
        An evaluation logged at ``step`` itself goes too: it ran after the checkpoint was taken,
        and the resumed run evaluates there again."""
        for path in (self.metrics, self.ledger, self.rollouts, self.samples):
            if not path.exists():
                continue
            rows = [r for r in read_jsonl(path) if r.get("step", 0) < step or (
                r.get("step", 0) == step and not (self._eval_row(path, r) and step > 0))]
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))

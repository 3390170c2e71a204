"""The trainer's part of a checkpoint, written without stopping training.

    Save ──► snapshot: weights + optimizer/scheduler/RNG/version copied to CPU memory (the
             trainer's only pause) ──Saved──► the trainer trains on
         └─► writer thread: model/ (Hugging Face format) + trainer_state.pt ──SaveWritten──►

The copy is what makes the write safe to overlap with training: the next optimizer step changes
the live tensors in place, never the copy. Tensors that share storage (tied embeddings) share it
in the copy too, so ``save_pretrained`` drops the duplicate as it would for the live model. One
write at a time: a ``Save`` that comes while the previous write still runs waits for it (the
wait is part of the pause it reports). ``trainer_state.pt`` holds tensors and plain values only,
read back with ``torch.load(weights_only=True)`` (`load_trainer_state`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tokenflow.errors import CheckpointError
from tokenflow.runtime.workers.messages import Envelope, Saved, SaveWritten

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"


@dataclass
class Snapshot:
    weights: dict
    """The policy's weights under their Hugging Face names, on CPU, owned by the snapshot."""
    state: dict
    """Optimizer, scheduler, RNG, version (LoRA: the adapters too), owned by the snapshot."""
    buffers: list = field(default_factory=list)
    """Every tensor the copy made, in order: the next snapshot copies into them."""


class _Copier:
    """Copies a state's tensors to CPU memory, into the buffers of the previous snapshot where
    they fit (its write is over by then): fresh memory costs a page fault per page, about as
    much as the copy itself. Tensors that share storage share it in the copy too."""

    def __init__(self, spare: list) -> None:
        self.memo: dict = {}
        self.spare = spare
        self.used: list = []

    def __call__(self, value):
        import torch

        if isinstance(value, torch.Tensor):
            t = value.detach()
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
                   t.dtype, t.device)
            if key not in self.memo:
                old = self.spare[len(self.used)] if len(self.used) < len(self.spare) else None
                fits = old is not None and old.shape == t.shape and old.dtype == t.dtype
                self.memo[key] = old.copy_(t) if fits else t.to("cpu", copy=True)
                self.used.append(self.memo[key])
            return self.memo[key]
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self(v) for v in value)
        return value


def snapshot_trainer(trainer, copy: bool = True, spare: list | None = None) -> Snapshot:
    """Everything a checkpoint holds, copied (into ``spare``, the buffers of an earlier
    snapshot whose write is over, where they fit) unless ``copy`` is false (then it is written
    at once, before training goes on). Every rank of a sharded trainer calls it: the gathers
    are collectives."""
    weights = dict(trainer.named_weights(cpu=False))
    state = trainer.state_dict()
    if not trainer.is_lora:  # LoRA keeps its adapters here; the full weights go to model/
        state.pop("model")
    if not copy:
        return Snapshot(weights, state)
    copier = _Copier(spare or [])
    return Snapshot(copier(weights), copier(state), copier.used)


def write_snapshot(trainer, snap: Snapshot, directory: str | Path) -> None:
    """``model/`` in Hugging Face format (config, weights, tokenizer) and ``trainer_state.pt``."""
    import torch

    directory = Path(directory)
    model_dir = directory / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    model = trainer.model.get_base_model() if trainer.is_lora else trainer.model
    model.save_pretrained(model_dir, state_dict=snap.weights)
    if trainer.tokenizer is not None:
        trainer.tokenizer.save_pretrained(model_dir)
    torch.save(snap.state, directory / STATE_FILE)


def load_trainer_state(trainer, directory: str | Path) -> None:
    import torch

    # Tensors and plain values only: a tampered file cannot run code here (no full unpickler).
    path = Path(directory) / STATE_FILE
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever the unpickler refused, say which file
        raise CheckpointError(f"{path} does not load as a trainer state of tensors and numbers "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); the checkpoint is "
                              "damaged or not tokenflow's: delete it to resume from the one before") from None
    if not trainer.is_lora:
        state["model"] = trainer.model.state_dict()  # already loaded from directory/model
    trainer.load_state_dict(state)


class CheckpointWriter:
    """Answers a trainer rank's ``Save``: snapshot now, write in the background (or inline)."""

    def __init__(self, trainer, out_q, name: str, writes: bool) -> None:
        self.trainer, self.out_q, self.name = trainer, out_q, name
        self.writes = writes  # rank 0 of a sharded trainer (every other rank only takes part in the gathers)
        self._thread: threading.Thread | None = None
        self._spare: list = []  # the last snapshot's buffers, reused once its write is over

    def save(self, directory: str, background: bool, collective=lambda what, fn: fn()) -> None:
        t0 = time.perf_counter()
        self.wait()  # one write at a time; the wait counts as part of this pause
        waited = time.perf_counter() - t0
        snap = collective("save", lambda: snapshot_trainer(self.trainer, copy=background, spare=self._spare))
        self._spare = snap.buffers
        snapshot_s = time.perf_counter() - t0
        if not self.writes:
            return
        if not background:  # the trainer is busy until the files are on disk
            self._write(snap, directory)
            self._send(Saved(directory, time.perf_counter() - t0))
            return
        self._send(Saved(directory, snapshot_s, waited))
        self._thread = threading.Thread(target=self._write, args=(snap, directory),
                                        name="tokenflow-checkpoint-writer", daemon=True)
        self._thread.start()

    def _write(self, snap: Snapshot, directory: str) -> None:
        t0 = time.perf_counter()
        try:
            write_snapshot(self.trainer, snap, directory)
        except BaseException as e:  # noqa: BLE001 - the orchestrator decides; the staging folder is its
            log.warning("%s: writing the checkpoint into %s failed: %s", self.name, directory, e)
            code = (e.errno or 0) if isinstance(e, OSError) else 0
            self._send(SaveWritten(directory, time.perf_counter() - t0, f"{type(e).__name__}: {e}", code))
            return
        self._send(SaveWritten(directory, time.perf_counter() - t0))

    def _send(self, msg) -> None:
        self.out_q.put(Envelope(self.name, msg))

    def wait(self) -> None:
        """Block until the write under way (if any) is done."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

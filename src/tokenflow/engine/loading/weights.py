"""Weights in and out: checkpoint reading, update validation, and the sync checksum.

Tensors are always keyed by their Hugging Face names, on the engine side as on the trainer
side, so a checkpoint's ``model.safetensors`` and a transformers model's ``state_dict()`` load
through the same path and hash to the same checksum.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from tokenflow.engine.errors import WeightUpdateError

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]

# Buffers some checkpoints carry that are not weights (recomputed from the config).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def as_dict(named_tensors: NamedTensors) -> dict[str, torch.Tensor]:
    """A name -> tensor dict (no copies) from a mapping or an iterable of pairs."""
    return dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)


def weights_checksum(named_tensors: NamedTensors) -> str:
    """Hex blake2b digest over the tensors in name order: each name, shape, and its values as
    float32 bytes. Deterministic across processes and devices for equal values, whatever the
    dtype they travelled in (as long as both sides hash the same values)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(as_dict(named_tensors).items()):
        arr = tensor.detach().to("cpu", torch.float32).contiguous().numpy()
        h.update(name.encode())
        h.update(repr(tuple(arr.shape)).encode())
        h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


def check_weights(named: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size],
                  optional: Mapping[str, torch.Size]) -> None:
    """Refuse a set of tensors that does not match the model exactly, naming every problem.

    ``optional`` names may be present (then their shapes are checked) or absent, e.g. the
    ``lm_head.weight`` of a model with tied embeddings."""
    allowed = {**expected, **optional}
    missing = sorted(set(expected) - set(named))
    unexpected = sorted(n for n in named if n not in allowed and not n.endswith(IGNORED_SUFFIXES))
    misshaped = [
        f"{n} {tuple(named[n].shape)} (expected {tuple(allowed[n])})"
        for n in sorted(named) if n in allowed and tuple(named[n].shape) != tuple(allowed[n])
    ]
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if names:
            shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise WeightUpdateError("weight update refused; " + "; ".join(problems))


def load_checkpoint(folder: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a Hugging Face model folder (``model.safetensors``, sharded or not)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    single = folder / "model.safetensors"
    if single.exists():
        return load_file(str(single))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(str(folder / shard)))
        return out
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {folder}")

"""Rollouts as data, never as code: safetensors for their arrays, JSON for the rest.

What leaves a process to be read by another one later (a checkpoint's buffer) or elsewhere (a
trainer rank's command) must not be a pickle: unpickling a file or a message runs whatever it
names. Here a list of rollouts becomes a safetensors blob whose header carries one JSON record
per rollout::

    header: {"__metadata__": {"tokenflow.rollouts": "[{scalars..., "arrays": [...]}, ...]"},
             "0.prompt_ids": {...}, "0.completion_ids": {...}, "0.support.flat": {...}, ...}

Ragged per-token lists (``support``, ``top_logprobs``) are stored flat with their lengths
(-1 for a position whose support was the whole vocabulary). Reading checks every record against
the `Rollout` fields and raises `RolloutFileError` naming what is wrong; nothing in the blob is
ever executed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import numpy as np

from tokenflow.rollout import Rollout

KEY = "tokenflow.rollouts"
_RAGGED = ("support", "top_logprobs")
_FIELDS = {f.name for f in dataclasses.fields(Rollout)}


class RolloutFileError(ValueError):
    """Bytes that are not a rollout blob this module wrote (damaged, truncated or forged)."""


def _plain(value):
    """``value`` as strict JSON (NumPy scalars and arrays to Python; non-finite floats to None)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)  # a record for people (info), not something to rebuild


def _ragged(arrays: list, dtype) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([-1 if a is None else len(a) for a in arrays], dtype=np.int64)
    parts = [np.asarray(a, dtype=dtype).reshape(-1) for a in arrays if a is not None]
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)), lengths


def _split(flat: np.ndarray, lengths: np.ndarray) -> list:
    if int(lengths[lengths > 0].sum()) != len(flat):
        raise RolloutFileError(f"ragged lengths sum to {int(lengths[lengths > 0].sum())}, not {len(flat)}")
    out, at = [], 0
    for n in lengths.tolist():
        out.append(None if n < 0 else flat[at:at + n])
        at += max(n, 0)
    return out


def encode(rollouts: list[Rollout], extra: dict[str, str] | None = None) -> bytes:
    """One safetensors blob holding ``rollouts`` (arrays bit for bit, scalars as JSON), and
    ``extra`` strings in its header (a message's own fields, say)."""
    from safetensors.numpy import save

    tensors: dict[str, np.ndarray] = {}
    records = []
    for i, r in enumerate(rollouts):
        rec, names = {}, []
        for f in dataclasses.fields(r):
            v = getattr(r, f.name)
            if f.name == "support" and v is not None:
                tensors[f"{i}.support.flat"], tensors[f"{i}.support.len"] = _ragged(v, np.int32)
                names.append("support")
            elif f.name == "top_logprobs" and v is not None:
                tensors[f"{i}.top.ids"], lengths = _ragged([ids for ids, _ in v], np.int32)
                tensors[f"{i}.top.lps"], _ = _ragged([lps for _, lps in v], np.float32)
                tensors[f"{i}.top.len"] = lengths
                names.append("top_logprobs")
            elif isinstance(v, np.ndarray):
                tensors[f"{i}.{f.name}"] = np.ascontiguousarray(v)
                names.append(f.name)
            elif f.name not in _RAGGED:
                rec[f.name] = _plain(v)
        rec["arrays"] = names
        records.append(rec)
    meta = json.dumps(records, allow_nan=False, separators=(",", ":"))
    return save(tensors, metadata={**(extra or {}), KEY: meta})


def metadata(blob: bytes) -> dict[str, str]:
    """The header strings of a blob `encode` wrote (``extra`` and the rollout records)."""
    if len(blob) < 8:
        raise RolloutFileError(f"{len(blob)} bytes: too short for a safetensors header")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > len(blob) - 8:
        raise RolloutFileError(f"its header claims {size} bytes but only {len(blob) - 8} follow")
    try:
        meta = json.loads(blob[8:8 + size])["__metadata__"]
        json.loads(meta[KEY])
    except (ValueError, KeyError, TypeError) as e:
        raise RolloutFileError(f"its header holds no rollout records ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise RolloutFileError("its header metadata is not a table of strings")
    return meta


def decode(blob: bytes) -> list[Rollout]:
    """The rollouts `encode` wrote; `RolloutFileError` for anything else."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    records = json.loads(metadata(blob)[KEY])
    try:
        tensors = load(blob)
    except (SafetensorError, ValueError) as e:
        raise RolloutFileError(f"its tensors do not read ({e})") from None
    if not isinstance(records, list):
        raise RolloutFileError("its rollout records are not a list")
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not isinstance(rec.get("arrays"), list):
            raise RolloutFileError(f"rollout {i}'s record is not an object with its array names")
        unknown = (set(rec) - {"arrays"} | set(rec["arrays"])) - _FIELDS
        if unknown:
            raise RolloutFileError(f"rollout {i} has fields a Rollout does not: {sorted(unknown)}")
        kwargs = {k: v for k, v in rec.items() if k != "arrays"}
        try:
            for name in rec["arrays"]:
                if name == "support":
                    kwargs[name] = _split(tensors[f"{i}.support.flat"], tensors[f"{i}.support.len"])
                elif name == "top_logprobs":
                    lengths = tensors[f"{i}.top.len"]
                    kwargs[name] = list(zip(_split(tensors[f"{i}.top.ids"], lengths),
                                            _split(tensors[f"{i}.top.lps"], lengths)))
                else:
                    kwargs[name] = tensors[f"{i}.{name}"]
            out.append(Rollout(**kwargs))
        except KeyError as e:
            raise RolloutFileError(f"rollout {i} names array {e} but the blob has none") from None
        except (TypeError, ValueError) as e:
            raise RolloutFileError(f"rollout {i} is not a valid Rollout ({e})") from None
    return out

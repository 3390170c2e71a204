"""A checkpoint's in-flight rollouts: what the groups not yet scored held when it was taken.

    checkpoints/step_N/inflight.json          {"step": N, "groups": [[group id, rollouts], ...],
                                               "unkeepable": [group ids]}
    checkpoints/step_N/inflight.safetensors   their rollouts (`tokenflow.rollout_files`)

Per group, its finished samples and its running samples' tokens so far (partial rollouts,
finish reason "abort"); samples that had no token are not there. ``unkeepable`` names the
groups whose state could not be saved (an environment's or an agent's episodes): a resumed run
generates those again. The files are data, and read as hostile input: every rollout is checked
(its group, sample index, token ids within the vocabulary, finite log-probs, versions no newer
than the checkpoint) and anything else is a `CheckpointError` naming the file. A checkpoint
written before these files existed has none; its in-flight groups are generated again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tokenflow.errors import CheckpointError
from tokenflow.rollout import Rollout
from tokenflow.rollout_files import RolloutFileError, decode, encode

INDEX, BLOB = "inflight.json", "inflight.safetensors"


def encode_inflight(step: int, groups: dict[int, list[Rollout]], unkeepable: list[int]) -> dict[str, bytes]:
    """The two files' bytes, by name."""
    order = sorted(groups)
    index = {"step": step, "groups": [[int(g), len(groups[g])] for g in order],
             "unkeepable": sorted(int(g) for g in unkeepable)}
    return {INDEX: json.dumps(index).encode(),
            BLOB: encode([r for g in order for r in groups[g]])}


def _damaged(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"{path} {why}; the checkpoint is damaged or not tokenflow's: delete it to "
                           "resume from the one before")


def _vocab_size(folder: Path) -> int | None:
    try:
        size = json.loads((folder / "model" / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _pairs(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
        for p in value)


def read_inflight(folder: Path, step: int) -> tuple[dict[int, list[Rollout]], list[int], str]:
    """(group id → kept rollouts, unkeepable group ids, the file they came from) of the
    checkpoint in ``folder``."""
    index_path, blob_path = folder / INDEX, folder / BLOB
    if not index_path.exists() and not blob_path.exists():
        return {}, [], str(blob_path)
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _damaged(index_path, "is missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _damaged(index_path, f"is not valid JSON ({e})") from None
    if not (isinstance(index, dict) and index.get("step") == step and _pairs(index.get("groups"))
            and isinstance(index.get("unkeepable"), list)
            and all(isinstance(g, int) and not isinstance(g, bool) for g in index["unkeepable"])):
        raise _damaged(index_path, f"is not an index of in-flight groups of step {step}")
    try:
        rollouts = decode(blob_path.read_bytes())
    except FileNotFoundError:
        raise _damaged(blob_path, "is missing") from None
    except RolloutFileError as e:
        raise _damaged(blob_path, f"does not read as rollouts ({e})") from None
    if sum(n for _, n in index["groups"]) != len(rollouts):
        raise _damaged(blob_path, f"holds {len(rollouts)} rollouts, {index_path.name} lists "
                                  f"{sum(n for _, n in index['groups'])}")
    vocab = _vocab_size(folder)
    groups, at = {}, 0
    for gid, n in index["groups"]:
        groups[gid] = rollouts[at:at + n]
        at += n
        for r in groups[gid]:
            why = _check(r, gid, step, vocab)
            if why:
                raise _damaged(blob_path, f"holds a rollout of group {gid} that {why}")
    return groups, list(index["unkeepable"]), str(blob_path)


def _check(r: Rollout, gid: int, step: int, vocab: int | None) -> str | None:
    if r.group_id != gid:
        return f"says it is of group {r.group_id}"
    if r.sample_index < 0:
        return f"has sample index {r.sample_index}"
    ids = r.completion_ids
    if len(ids) and (ids.min() < 0 or (vocab is not None and ids.max() >= vocab)):
        return f"has token ids outside [0, {vocab})"
    if len(r.versions) and (r.versions.min() < 0 or r.versions.max() > step):
        return f"has versions outside [0, {step}]"
    if not np.isfinite(r.logprobs).all() or not (r.loss_mask == 1).all():
        return "has non-finite log-probs or environment tokens"
    if r.reward is not None and not math.isfinite(r.reward):
        return "has a non-finite reward"
    return None


def trim_to_version(r: Rollout, version: int) -> Rollout:
    """``r`` without its tokens from weights newer than ``version`` (the resumed trainer's): an
    engine may have loaded the next weights before it answered the checkpoint. Versions never
    decrease along a rollout, so this cuts a suffix; a cut rollout is a partial one."""
    keep = int(np.searchsorted(r.versions, version, side="right"))
    if keep == r.num_tokens:
        return r
    routed = None if r.routed_experts is None else r.routed_experts[:max(len(r.prompt_ids) + keep - 1, 0)]
    return Rollout(
        prompt_ids=r.prompt_ids, completion_ids=r.completion_ids[:keep], logprobs=r.logprobs[:keep],
        versions=r.versions[:keep], finish_reason="abort", temperature=r.temperature,
        support_logmass=None if r.support_logmass is None else r.support_logmass[:keep],
        support=None if r.support is None else r.support[:keep], loss_mask=r.loss_mask[:keep],
        request_id=r.request_id, sample_index=r.sample_index, group_id=r.group_id, prompt_id=r.prompt_id,
        info=dict(r.info), routed_experts=routed,
        top_logprobs=None if r.top_logprobs is None else r.top_logprobs[:keep])

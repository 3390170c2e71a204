"""The training record and sequence packing.

A :class:`TrainSequence` is one rollout as the trainer sees it: the model input (prompt plus
completion minus its last token, since nothing is predicted after it), the completion tokens to
score, the behaviour log-prob to compare against, and which tokens count in the loss.

Packing puts several sequences end to end in one row with ``position_ids`` restarting at 0 per
sequence and no attention mask. Transformers (≥ 5) reads the restarts as sequence boundaries and
builds a block-diagonal causal mask, so a packed row gives the same logits as each sequence alone
and no compute is spent on padding. With ``trainer.share_prompts`` a group's samples first become
units that hold their prompt once (`shared_prompts`); a micro-batch with such a unit carries its
own attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenflow.algorithms.corrections import version_keep
from tokenflow.rollout import Rollout
from tokenflow.trainer.shared_prompts import block_mask, prompt_groups, unit_width


@dataclass
class TrainSequence:
    index: int
    """Position of the rollout in the list given to the step (failed ones removed)."""
    input_ids: np.ndarray
    """prompt + completion[:-1]: the tokens the model reads."""
    prompt_len: int
    targets: np.ndarray
    """The completion tokens whose log-probs are scored."""
    behaviour: np.ndarray
    """log μ per target: truncated where the Keep Sampling Mask applies, full otherwise."""
    versions: np.ndarray
    loss_mask: np.ndarray
    """Bool: model-generated tokens (the rollout's loss mask)."""
    keep: np.ndarray
    """Bool: loss tokens kept by version rejection — the tokens that count in the loss."""
    temperature: float
    support: list[np.ndarray | None] | None
    """Per target, the sampling support to mask to (only when the Keep Sampling Mask applies)."""
    routing: np.ndarray | None = None
    """Mixture-of-experts policies: the engine's experts per input token, [len(input_ids),
    moe_layers, top_k] (`Rollout.routed_experts`), or None."""

    @property
    def num_loss_tokens(self) -> int:
        return int(self.keep.sum())


def to_train_sequence(index: int, r: Rollout, trainer_version: int, *, keep_sampling_mask: bool,
                      max_token_age: int | None) -> TrainSequence:
    if len(r.prompt_ids) == 0:
        raise ValueError(f"rollout {index} has an empty prompt; the first completion token "
                         "needs at least one token before it")
    support = r.support if keep_sampling_mask and r.support is not None else None
    if support is None:
        behaviour = r.full_logprobs
    else:
        # Truncated log-prob where a support is recorded, full-vocabulary log-prob elsewhere.
        has = np.array([s is not None for s in support])
        behaviour = np.where(has, r.logprobs, r.full_logprobs)
        for t, s in enumerate(support):
            if s is not None and not np.isin(r.completion_ids[t], s):
                raise ValueError(f"rollout {index}: token {t} (id {r.completion_ids[t]}) is not "
                                 "in its recorded sampling support")
    loss_mask = r.loss_mask.astype(bool)
    keep = loss_mask & version_keep(r.versions, trainer_version, max_token_age)
    # Engines may leave tool tokens' log-probs undefined; a NaN there would reach the gradient
    # through 0·NaN even though the token carries no weight.
    behaviour = np.where(keep | np.isfinite(behaviour), behaviour, 0.0)
    return TrainSequence(
        index=index, input_ids=np.concatenate([r.prompt_ids, r.completion_ids[:-1]]),
        prompt_len=len(r.prompt_ids), targets=r.completion_ids, behaviour=behaviour.astype(np.float32),
        versions=r.versions, loss_mask=loss_mask, keep=keep, temperature=float(r.temperature),
        support=support, routing=r.routed_experts,
    )


def pack(lengths: list[int], budget: int, packed: bool = True) -> list[list[int]]:
    """Group sequence indices into rows of at most ``budget`` tokens (first-fit decreasing).

    A sequence longer than the budget gets a row of its own; ``packed=False`` gives every
    sequence its own row (for models whose attention ignores packed position ids).
    """
    if not packed:
        return [[i] for i in range(len(lengths))]
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for r, space in enumerate(free):
            if lengths[i] <= space:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(budget - lengths[i])
    return [sorted(r) for r in rows]


def prompt_units(seqs: list[TrainSequence], budget: int) -> list[list[int]]:
    """Indices of ``seqs`` grouped into units (`shared_prompts`): sequences with the same prompt in
    as few units as fit ``budget`` tokens each (the prompt once, plus each member's tokens after
    it: `pack` on those tails), every other sequence a unit of its own."""
    units: list[list[int]] = []
    for members in prompt_groups(seqs):
        prompt = seqs[members[0]].prompt_len
        tails = [len(seqs[i].input_ids) - prompt for i in members]
        cut = pack(tails, budget - prompt) if len(members) > 1 else [[0]]
        units.extend([members[j] for j in part] for part in cut)
    return units


@dataclass
class MicroBatch:
    """Rows of packed sequences (padded to one width) and the flat per-target tensors."""

    seqs: list[TrainSequence]
    input_ids: torch.Tensor  # [B, W]
    position_ids: torch.Tensor  # [B, W]
    target_pos: torch.Tensor  # [n] flat index (row · W + column) whose logits predict each target
    targets: torch.Tensor  # [n]
    temperature: torch.Tensor  # [n]
    behaviour: torch.Tensor  # [n]
    mask: torch.Tensor  # [n] bool, counted loss tokens
    seq_index: torch.Tensor  # [n] 0..len(seqs)-1
    versions: torch.Tensor  # [n] policy version of each target
    support_rows: torch.Tensor | None  # targets that carry a support
    support_pairs: tuple[torch.Tensor, torch.Tensor] | None  # (target row, token id) members
    num_tokens: int = 0
    """Real (unpadded) tokens forwarded."""
    routing: torch.Tensor | None = None
    """[B·W, moe_layers, top_k] recorded experts per input position (flat, as routers see
    them), where any sequence of the micro-batch has a record; see `keep_routing`."""
    routing_has: torch.Tensor | None = None
    """[B·W] bool: the positions ``routing`` covers (not padding, not unrecorded sequences)."""
    attention_mask: torch.Tensor | None = None
    """[B, 1, W, W] bool, where rows hold shared prompts (`shared_prompts`): which positions each
    position attends to. None: transformers builds the mask from the position ids."""
    shared_tokens: int = 0
    """Prompt tokens not forwarded because their group's samples share them."""

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def made_under(self, version: int) -> torch.Tensor:
        """[n] bool: loss tokens that, with every token before them in their sequence, were
        sampled under policy ``version``. A token sampled after an in-flight weight update read
        keys and values computed under the older weights, so the trainer's log-prob of it differs
        from the engine's for that reason alone; it is left out where engine and trainer are
        compared on the same weights."""
        prefix_min = {s.index: np.minimum.accumulate(np.asarray(s.versions)) for s in self.seqs}
        return self.mask & (self.per_token(prefix_min, dtype=torch.int64) == version)

    def per_token(self, per_seq, dtype=torch.float32) -> torch.Tensor:
        """Concatenate per-sequence arrays (a list or mapping indexed by ``TrainSequence.index``)
        in target order."""
        parts = [np.asarray(per_seq[s.index]) for s in self.seqs]
        return torch.from_numpy(np.concatenate(parts)).to(dtype=dtype, device=self.targets.device)


def collate(seqs: list[TrainSequence], device: torch.device | str = "cpu") -> MicroBatch:
    """One packed row holding ``seqs`` end to end."""
    return collate_rows([seqs], device)


def collate_rows(rows: list[list[TrainSequence]], device: torch.device | str = "cpu") -> MicroBatch:
    """Rows of packed sequences, padded at the end to the widest row.

    Padding gets position ids restarting at 0, so the model reads it as one more (ignored)
    sequence of the row and no real token attends to it.
    """
    return collate_units([[[s] for s in row] for row in rows], device)


def collate_units(rows: list[list[list[TrainSequence]]], device: torch.device | str = "cpu",
                  own_mask: bool = False) -> MicroBatch:
    """Rows of units, padded at the end to the widest row. A unit is one sequence, or several with
    the same prompt laid out as `shared_prompts` describes (the prompt once, then each one's
    tokens after it). The micro-batch carries its attention mask where a unit is shared, and
    with ``own_mask`` always: a trainer that shares prompts gives its compiled layers one kind of
    mask (the one their warm-up compiled), whatever the micro-batch holds."""
    width = max(sum(unit_width(u) for u in row) for row in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    pos = np.zeros((len(rows), width), dtype=np.int64)
    segment = np.zeros((len(rows), width), dtype=np.int64)
    parent = np.full((len(rows), width), -1, dtype=np.int64)
    seqs = [s for row in rows for u in row for s in u]
    tpos, sidx = [], []
    sup_index, members, sup_rows = [], [], []
    n = k = seg = 0
    shared = own_mask
    for b, row in enumerate(rows):
        offset = 0
        for unit in row:
            prompt = unit[0].prompt_len if len(unit) > 1 else 0
            if prompt:  # the shared prompt, then each sequence's tokens after it
                shared = True
                ids[b, offset:offset + prompt] = unit[0].input_ids[:prompt]
                pos[b, offset:offset + prompt] = np.arange(prompt)
                segment[b, offset:offset + prompt] = seg
                home, seg, offset = seg, seg + 1, offset + prompt
                prompt_end = offset - 1  # predicts every member's first target
            for s in unit:
                tail = s.input_ids[prompt:]
                ids[b, offset:offset + len(tail)] = tail
                pos[b, offset:offset + len(tail)] = prompt + np.arange(len(tail))
                segment[b, offset:offset + len(tail)] = seg
                # input position j of the sequence sits at offset + j − prompt (j ≥ prompt), or
                # in the shared prompt (j < prompt): only its first target is predicted there
                where = offset - prompt + s.prompt_len - 1 + np.arange(len(s.targets))
                if prompt:
                    parent[b, offset:offset + len(tail)] = home
                    where[0] = prompt_end
                tpos.append(b * width + where)
                sidx.append(np.full(len(s.targets), k))
                for t, sup in enumerate(s.support or ()):
                    if sup is not None:
                        sup_rows.append(n + t)
                        sup_index.append(np.full(len(sup), n + t))
                        members.append(np.asarray(sup))
                offset += len(tail)
                n += len(s.targets)
                k += 1
                seg += 1
        pos[b, offset:] = np.arange(width - offset)
        segment[b, offset:] = seg
        seg += 1

    def t(parts, dtype):
        return torch.from_numpy(np.concatenate(parts)).to(dtype=dtype, device=device)

    routing, routing_has = _routing(rows, width, device)
    support_rows = support_pairs = None
    if sup_rows:
        support_rows = torch.tensor(sup_rows, dtype=torch.long, device=device)
        support_pairs = (t(sup_index, torch.long), t(members, torch.long))
    forwarded = sum(unit_width(u) for row in rows for u in row)
    return MicroBatch(
        seqs=seqs, input_ids=torch.from_numpy(ids).to(device), position_ids=torch.from_numpy(pos).to(device),
        target_pos=t(tpos, torch.long), targets=t([s.targets for s in seqs], torch.long),
        temperature=t([np.full(len(s.targets), s.temperature) for s in seqs], torch.float32),
        behaviour=t([s.behaviour for s in seqs], torch.float32),
        mask=t([s.keep for s in seqs], torch.bool), seq_index=t(sidx, torch.long),
        versions=t([s.versions for s in seqs], torch.long),
        support_rows=support_rows, support_pairs=support_pairs,
        num_tokens=forwarded, routing=routing, routing_has=routing_has,
        attention_mask=block_mask(segment, parent).to(device) if shared else None,
        shared_tokens=sum(len(s.input_ids) for s in seqs) - forwarded,
    )


def _routing(rows: list[list[list[TrainSequence]]], width: int, device):
    """The recorded experts laid out like the rows of units (flattened), and where they apply.
    Sequences with a record are never shared (`shared_prompts.prompt_key`)."""
    shape = next((s.routing.shape[1:] for row in rows for u in row for s in u if s.routing is not None), None)
    if shape is None:
        return None, None
    experts = np.zeros((len(rows), width, *shape), dtype=np.int64)
    has = np.zeros((len(rows), width), dtype=bool)
    for b, row in enumerate(rows):
        offset = 0
        for unit in row:
            s = unit[0]
            if len(unit) == 1 and s.routing is not None:
                experts[b, offset:offset + len(s.input_ids)] = s.routing
                has[b, offset:offset + len(s.input_ids)] = True
            offset += unit_width(unit)
    return (torch.from_numpy(experts.reshape(-1, *shape)).to(device),
            torch.from_numpy(has.reshape(-1)).to(device))


def stack_rows(widths: list[int], budget: int, max_rows: int | None = None) -> list[list[int]]:
    """Group rows (by index) into micro-batches whose padded size rows × widest ≤ ``budget``.

    Rows are taken widest first, so each micro-batch pads little.
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(widths)), key=lambda k: (-widths[k], k)):
        if groups:
            g = groups[-1]
            fits = (len(g) + 1) * widths[g[0]] <= budget
            if fits and (max_rows is None or len(g) < max_rows):
                g.append(i)
                continue
        groups.append([i])
    return groups


def micro_batches(seqs: list[TrainSequence], budget: int, packed: bool = True,
                  device: torch.device | str = "cpu", row_tokens: int | None = None,
                  max_rows: int | None = None, share_prompts: bool = False,
                  own_masks: bool = False) -> list[MicroBatch]:
    """Pack ``seqs`` into rows of at most ``row_tokens`` and stack rows into micro-batches of
    at most ``budget`` padded tokens (``max_rows=1``: one row per micro-batch). With
    ``share_prompts``, sequences with the same prompt first form units that hold it once
    (`prompt_units`, each within the row budget); units are packed like sequences
    (``packed=False``: a row each). ``own_masks``: every micro-batch carries its mask
    (`collate_units`)."""
    row_budget = min(row_tokens or budget, budget)
    units = prompt_units(seqs, row_budget) if share_prompts else [[i] for i in range(len(seqs))]
    units = [[seqs[i] for i in u] for u in units]
    rows = pack([unit_width(u) for u in units], row_budget, packed)
    widths = [sum(unit_width(units[i]) for i in row) for row in rows]
    return [collate_units([[units[i] for i in rows[r]] for r in group], device, own_mask=own_masks)
            for group in stack_rows(widths, budget, max_rows)]


@dataclass
class MicroBatcher:
    """How a trainer cuts sequences into micro-batches: ``trainer.micro_batch_tokens``,
    ``pack_sequences``, ``pack_row_tokens`` and ``share_prompts`` (with ``own_masks`` for
    compiled layers), one row per micro-batch when a runner cannot run several (``max_rows = 1``). A sharded trainer's batcher keeps its rank's
    share."""

    budget: int
    packed: bool
    device: torch.device | str
    row_tokens: int | None = None
    max_rows: int | None = None
    share_prompts: bool = False
    own_masks: bool = False

    def __call__(self, seqs: list[TrainSequence]) -> list[MicroBatch]:
        return micro_batches(seqs, self.budget, self.packed, self.device, row_tokens=self.row_tokens,
                             max_rows=self.max_rows, share_prompts=self.share_prompts, own_masks=self.own_masks)

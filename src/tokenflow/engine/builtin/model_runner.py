"""Runs the model on the scheduler's batches: prefill, extend (after parked KV), decode, cache
moves and parking, KV recompute."""

from __future__ import annotations

import numpy as np
import torch

from tokenflow.engine.builtin.cache.kv_cache import KVCache
from tokenflow.engine.builtin.models.attention import AttentionContext, decode_split
from tokenflow.engine.builtin.models.llama import LlamaForCausalLM, head_dim_of
from tokenflow.engine.builtin.cache.parked import ParkedEntry, ParkedKV, ParkKey
from tokenflow.engine.builtin.scheduler import Move, Park
from tokenflow.engine.builtin.sequence import Sequence
from tokenflow.engine.routing import expert_id_dtype


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, max_num_seqs: int, max_model_len: int,
                 device: torch.device, dtype: torch.dtype, kv_growth: int = 64,
                 record_routing: bool = True, max_parked: int = 0) -> None:
        cfg = model.config
        self.model = model
        self.recorder = model.routing if record_routing else None
        self.routing_dtype = compact_dtype(getattr(model, "num_experts", 0))
        self.last_routing: np.ndarray | None = None
        """Expert ids of the last prefill/decode's input tokens, [rows, tokens, moe_layers, k]
        (MoE models recording routing only)."""
        self.device = device
        self.dtype = dtype
        self.cache = KVCache(
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            head_dim=head_dim_of(cfg),
            max_slots=max_num_seqs,
            max_len=max_model_len,
            dtype=dtype,
            device=device,
            growth=kv_growth,
        )
        self.parked = ParkedKV(max_parked)
        self.last_hidden: torch.Tensor | None = None
        """The last prefill's hidden states, [G, L, H], when it was asked to keep them."""
        self.attention_kernel = None
        """Decode attention's compiled CPU kernel (set by the engine; None: PyTorch's operations)."""

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _prefill_context(self, length: int) -> AttentionContext:
        """A prefill's context; with the windowed layers' mask once a prompt outgrows the window."""
        ctx = AttentionContext("prefill")
        window = self.model.window
        if window is not None and length > window:
            q = torch.arange(length, device=self.device)[:, None]
            k = torch.arange(length, device=self.device)[None, :]
            ctx.window_mask = (k <= q) & (k > q - window)
            ctx.windowed = self.model.windowed_layers
        return ctx

    @torch.inference_mode()
    def prefill(self, token_lists: list[list[int]], slots: list[list[int]] | None,
                need_logits: bool = True, keep_hidden: bool = False) -> torch.Tensor | None:
        """Run the prompts, copy each prompt's keys/values into its slots, and return the logits
        at each prompt's last position, [G, V]. The prompts run packed, without padding
        (`_prefill_packed`); with ``keep_hidden`` (every position's hidden states stay in
        `last_hidden`, [G, L, H], for `prompt_scores`) or an MoE model recording its routing
        (read back as [G, L]) they run right-padded to the longest, in one batch."""
        if keep_hidden or self.recorder is not None or len(token_lists) < 2:
            return self._prefill(token_lists, slots, need_logits, keep_hidden)
        return self._prefill_packed(token_lists, slots, need_logits)

    def _prefill_packed(self, token_lists: list[list[int]], slots: list[list[int]] | None,
                        need_logits: bool) -> torch.Tensor | None:
        """The prompts as one row of T tokens: every product and norm runs on the real tokens
        only (right-padded, the bench's 16 prompts of 16-64 tokens took 1,008 rows for 643
        tokens), and attention runs per prompt on the padded grid (`packed_prefill_attention`)."""
        lengths = np.asarray([len(t) for t in token_lists])
        longest = int(lengths.max())
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        positions = np.arange(int(lengths.sum())) - starts
        ids = self._long([token for tokens in token_lists for token in tokens])[None]
        ctx = self._prefill_context(longest)
        ctx.pack_shape = (len(lengths), longest)
        ctx.pack_index = self._long(np.repeat(np.arange(len(lengths)) * longest, lengths) + positions)
        self._write_slots(ctx, slots, longest)
        hidden = self.model(ids, self._long(positions)[None], ctx)[0]
        self.last_hidden = None
        if not need_logits:
            return None
        return self.model.compute_logits(hidden[self._long(np.cumsum(lengths) - 1)])

    def _prefill(self, token_lists: list[list[int]], slots: list[list[int]] | None,
                 need_logits: bool, keep_hidden: bool) -> torch.Tensor | None:
        lengths = [len(t) for t in token_lists]
        longest = max(lengths)
        ids = self._long([t + [0] * (longest - len(t)) for t in token_lists])
        positions = torch.arange(longest, device=self.device).expand(len(token_lists), longest)
        ctx = self._prefill_context(longest)
        self._write_slots(ctx, slots, longest)
        if not need_logits:  # a KV recompute: its routing is not what produced any token
            self.model(ids, positions, ctx)
            return None
        hidden = self._forward_recorded(ids, positions, ctx)
        self.last_hidden = hidden if keep_hidden else None
        last = hidden[torch.arange(len(lengths), device=self.device), self._long(lengths) - 1]
        return self.model.compute_logits(last)

    def _write_slots(self, ctx: AttentionContext, slots: list[list[int]] | None, longest: int) -> None:
        """Have a prefill copy prompt g's keys/values into each of ``slots[g]`` (None: no cache)."""
        if slots is None:
            return
        flat = [s for group in slots for s in group]
        self.cache.ensure(max(flat) + 1, longest)
        ctx.cache = self.cache
        ctx.write_slots = self._long(flat)
        ctx.write_rows = self._long([g for g, group in enumerate(slots) for _ in group])

    @torch.inference_mode()
    def prompt_scores(self, row: int, prompt: list[int], top: int, chunk: int = 256) -> dict:
        """Row ``row`` of the last prefill (`keep_hidden`): each prompt token's log-prob
        ``log_softmax(logits)`` given the tokens before it (NaN for the first) and, if ``top``,
        the ``top`` most likely tokens at each position; as `Rollout` fields. The logits are the
        head applied to the very hidden states the prefill's last-position logits came from,
        ``chunk`` positions at a time (a [prompt, vocab] float32 block at once could be large)."""
        hidden = self.last_hidden[row]
        n = len(prompt)
        targets = self._long(prompt[1:])
        lps = torch.full((n,), float("nan"), dtype=torch.float32)
        top_ids = torch.full((n, top), -1, dtype=torch.int32)
        top_lps = torch.full((n, top), float("nan"), dtype=torch.float32)
        for a in range(0, n - 1, chunk):
            b = min(a + chunk, n - 1)
            logp = torch.log_softmax(self.model.compute_logits(hidden[a:b]), -1)
            lps[a + 1:b + 1] = logp.gather(1, targets[a:b, None])[:, 0].cpu()
            if top:
                values, ids = logp.topk(top, -1)
                top_ids[a + 1:b + 1], top_lps[a + 1:b + 1] = ids.to(torch.int32).cpu(), values.cpu()
        out = {"prompt_logprobs": lps.numpy()}
        if top:
            out.update(prompt_top_ids=top_ids.numpy(), prompt_top_logprobs=top_lps.numpy())
        return out

    @torch.inference_mode()
    def extend(self, token_lists: list[list[int]], starts: list[int], slots: list[list[int]]) -> torch.Tensor:
        """Prefill rows whose first ``starts[i]`` positions are already cached in their slots
        (``slots[i][0]`` is read): run only the new tokens ``token_lists[i]`` at positions
        ``starts[i]..``, write their keys/values into the slots, and return the logits at each
        row's last token, [G, V]."""
        counts = [len(t) for t in token_lists]
        longest = max(counts)
        ends = [s + c for s, c in zip(starts, counts)]
        length = max(ends)
        ids = self._long([t + [0] * (longest - len(t)) for t in token_lists])
        # Padding repeats the row's last real position: it stays inside the context and its
        # query still sees keys (never a fully masked row).
        positions = torch.minimum(self._long(starts)[:, None] + torch.arange(longest, device=self.device),
                                  self._long(ends)[:, None] - 1)
        self.cache.ensure(max(s for group in slots for s in group) + 1, length)
        entries = [(slot, start + j, row, j) for row, (start, count, group) in enumerate(zip(starts, counts, slots))
                   for slot in group for j in range(count)]
        token_slots, token_positions, token_rows, token_index = self._long(entries).unbind(1)
        keys = torch.arange(length, device=self.device)[None, None, :]
        causal = keys <= positions[:, :, None]
        ctx = AttentionContext("extend", cache=self.cache, length=length, key_mask=causal[:, None],
                               read_slots=self._long([group[0] for group in slots]),
                               token_slots=token_slots, token_positions=token_positions,
                               token_rows=token_rows, token_index=token_index)
        window = self.model.window
        if window is not None and length > window:
            ctx.window_mask = (causal & (keys > positions[:, :, None] - window))[:, None]
            ctx.windowed = self.model.windowed_layers
        hidden = self._forward_recorded(ids, positions, ctx)
        last = hidden[torch.arange(len(counts), device=self.device), self._long(counts) - 1]
        return self.model.compute_logits(last)

    @torch.inference_mode()
    def unpark(self, key: ParkKey, slot: int) -> int:
        """Put the parked KV cache under ``key`` back into ``slot`` (dropping it from the store);
        returns how many positions it covers."""
        entry = self.parked.take(key)
        n = entry.num_tokens
        self.cache.ensure(slot + 1, n)
        for layer, (k, v) in enumerate(zip(self.cache.k, self.cache.v)):
            k[slot, :, :n].copy_(entry.keys[layer])
            v[slot, :, :n].copy_(entry.values[layer])
        return n

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One decode step: row i is the sequence in slot i; returns the next-token logits [B, V]
        in the model's dtype."""
        batch = len(seqs)
        ids = self._long([[s.token_ids[-1]] for s in seqs])
        positions = self._long([s.num_tokens - 1 for s in seqs])
        length = int(positions.max()) + 1
        if length > self.cache.capacity:
            # Grow no further than the running sequences can get (prompt + max_tokens).
            longest = max(s.num_prompt_tokens + s.params.max_tokens for s in seqs) - 1
            self.cache.ensure(batch, length, longest)
        else:
            self.cache.ensure(batch, length)
        ctx = (self._kernel_context(positions, length) if self.attention_kernel is not None
               else self._masked_context(seqs, positions, length))
        hidden = self._forward_recorded(ids, positions[:, None], ctx)
        return self.model.compute_logits(hidden[:, 0], float32=False)

    def _masked_context(self, seqs: list[Sequence], positions: torch.Tensor, length: int) -> AttentionContext:
        """A decode step attended with PyTorch's operations over ``[:length]`` of every row,
        the positions past each row's end (and behind a window) masked."""
        past_end = torch.arange(length, device=self.device)[None, :] > positions[:, None]
        key_bias = torch.zeros(len(seqs), 1, 1, length, dtype=self.dtype, device=self.device)
        key_bias.masked_fill_(past_end[:, None, None, :], float("-inf"))
        ctx = AttentionContext("decode", cache=self.cache, write_index=self.cache.decode_index(positions),
                               length=length, key_bias=key_bias)
        split = decode_split([s.num_tokens for s in seqs])
        if split is not None:
            ctx.short_length, long_rows = split
            ctx.long_rows = self._long(long_rows)
        window = self.model.window
        if window is not None and length > window:
            behind = torch.arange(length, device=self.device)[None, :] <= positions[:, None] - window
            ctx.window_bias = key_bias.masked_fill(behind[:, None, None, :], float("-inf"))
            ctx.windowed = self.model.windowed_layers
        return ctx

    def _kernel_context(self, positions: torch.Tensor, length: int) -> AttentionContext:
        """A decode step attended by the compiled kernel: each row reads its own positions only
        (no masks, and no split for long-tailed batches: a short row costs its own length)."""
        ends = positions + 1
        ctx = AttentionContext("decode", cache=self.cache, length=length, kernel=self.attention_kernel, row_ends=ends,
                               row_starts=torch.zeros_like(ends))
        window = self.model.window
        if window is not None and length > window:
            ctx.window_starts = (ends - window).clamp_(min=0)
            ctx.windowed = self.model.windowed_layers
        return ctx

    def _forward_recorded(self, ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """The forward pass; with routing recorded into `last_routing` (one host copy per step)."""
        if self.recorder is None:
            return self.model(ids, positions, ctx)
        self.recorder.start()
        try:
            hidden = self.model(ids, positions, ctx)
        finally:
            experts = self.recorder.take()
        self.last_routing = experts.to(self.routing_dtype).cpu().numpy().reshape(*ids.shape, *experts.shape[1:])
        return hidden

    @torch.inference_mode()
    def apply_moves(self, ops: list[Move | Park]) -> None:
        """Run the scheduler's cache ops in order: copy rows so that slots stay packed after
        sequences left, and copy the rows of sequences that park their KV cache out first."""
        for op in ops:
            if isinstance(op, Park):
                if self.parked.capacity > 0:
                    keys = torch.stack([k[op.slot, :, :op.length] for k in self.cache.k])
                    values = torch.stack([v[op.slot, :, :op.length] for v in self.cache.v])
                    self.parked.park(op.key, ParkedEntry(op.token_ids, keys, values))
            else:
                self.cache.move(op.src, op.dst, min(op.length, self.cache.capacity))

    @torch.inference_mode()
    def recompute(self, seqs: list[Sequence]) -> None:
        """Recompute the cached keys/values of running sequences under the current weights."""
        if seqs:
            self.prefill([s.token_ids[:-1] for s in seqs], [[s.slot] for s in seqs], need_logits=False)

    @torch.inference_mode()
    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one sequence, without touching the cache, [L, V]."""
        ids = self._long([token_ids])
        positions = torch.arange(len(token_ids), device=self.device)[None, :]
        hidden = self.model(ids, positions, self._prefill_context(len(token_ids)))
        return self.model.compute_logits(hidden[0])

    @torch.inference_mode()
    def hidden_states(self, sequences: list[list[int]]) -> torch.Tensor:
        """Last-layer hidden states of a batch of sequences, right-padded to the longest, from one
        prefill that does not touch the cache, [B, L, H] (causal attention keeps padding out of
        the real positions). A teacher scores rollouts with it."""
        longest = max(len(s) for s in sequences)
        ids = self._long([list(s) + [0] * (longest - len(s)) for s in sequences])
        positions = torch.arange(longest, device=self.device).expand(len(sequences), longest)
        return self.model(ids, positions, self._prefill_context(longest))


def compact_dtype(num_experts: int) -> torch.dtype:
    """`tokenflow.engine.routing.expert_id_dtype`, as a torch dtype."""
    return getattr(torch, expert_id_dtype(num_experts).name)

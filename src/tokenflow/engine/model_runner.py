"""Runs the model on the scheduler's batches: prefill, decode, cache moves, KV recompute."""

from __future__ import annotations

import numpy as np
import torch

from tokenflow.engine.kv_cache import KVCache
from tokenflow.engine.models.attention import AttentionContext
from tokenflow.engine.models.llama import LlamaForCausalLM, head_dim_of
from tokenflow.engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, max_num_seqs: int, max_model_len: int,
                 device: torch.device, dtype: torch.dtype, kv_growth: int = 64,
                 record_routing: bool = True) -> None:
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
                need_logits: bool = True) -> torch.Tensor | None:
        """Run the prompts (right-padded into one batch), copy each prompt's keys/values into
        its slots, and return the logits at each prompt's last position, [G, V]."""
        lengths = [len(t) for t in token_lists]
        longest = max(lengths)
        ids = self._long([t + [0] * (longest - len(t)) for t in token_lists])
        positions = torch.arange(longest, device=self.device).expand(len(token_lists), longest)
        ctx = self._prefill_context(longest)
        if slots is not None:
            flat = [s for group in slots for s in group]
            self.cache.ensure(max(flat) + 1, longest)
            ctx.cache = self.cache
            ctx.write_slots = self._long(flat)
            ctx.write_rows = self._long([g for g, group in enumerate(slots) for _ in group])
        if not need_logits:  # a KV recompute: its routing is not what produced any token
            self.model(ids, positions, ctx)
            return None
        hidden = self._forward_recorded(ids, positions, ctx)
        last = hidden[torch.arange(len(lengths), device=self.device), self._long(lengths) - 1]
        return self.model.compute_logits(last)

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One decode step: row i is the sequence in slot i; returns the next-token logits [B, V]."""
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
        past_end = torch.arange(length, device=self.device)[None, :] > positions[:, None]
        key_bias = torch.zeros(batch, 1, length, dtype=self.dtype, device=self.device)
        key_bias.masked_fill_(past_end[:, None, :], float("-inf"))
        kv_heads = self.cache.shape_tail[0]
        ctx = AttentionContext("decode", cache=self.cache, rows=torch.arange(batch, device=self.device),
                               positions=positions, length=length,
                               key_bias=key_bias.expand(batch, kv_heads, length).reshape(-1, 1, length))
        window = self.model.window
        if window is not None and length > window:
            behind = torch.arange(length, device=self.device)[None, :] <= positions[:, None] - window
            window_bias = key_bias.masked_fill(behind[:, None, :], float("-inf"))
            ctx.window_bias = window_bias.expand(batch, kv_heads, length).reshape(-1, 1, length)
            ctx.windowed = self.model.windowed_layers
        hidden = self._forward_recorded(ids, positions[:, None], ctx)
        return self.model.compute_logits(hidden[:, 0])

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
    def apply_moves(self, moves: list[tuple[int, int, int]]) -> None:
        """Copy cache rows so that slots stay packed after sequences left (in the given order)."""
        for src, dst, length in moves:
            self.cache.move(src, dst, min(length, self.cache.capacity))

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


def compact_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer type that holds an expert id (Rollout.routed_experts stays small)."""
    return torch.uint8 if num_experts <= 256 else torch.int16 if num_experts <= 32768 else torch.int32

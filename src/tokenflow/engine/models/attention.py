"""Attention over the slot KV cache: a prefill (padded prompts), an extend (new tokens after
cached ones) and one decode step.

A prefill runs causal attention over right-padded prompts (padding sits after every real
token, so the causal mask alone keeps it out of the real tokens' attention) and copies each
prompt's keys/values into the cache slots of its samples - one prefill serves all n samples.
A decode step writes the new token's keys/values at its position and attends over the first
``length`` positions of slots ``0..B-1``, a strided view of the cache (no gather, no copy),
with positions past each sequence's end masked out.

An extend is a prefill whose rows start at per-row offsets: row i's first ``offset_i`` positions
are already in its slot (a parked KV cache put back), and its new tokens sit at positions
``offset_i ..``. The new keys/values are written into the slot first (real tokens only: a padded
position could lie past the context), then each row attends over its slot's keys, causally in
absolute positions. Padding queries repeat the row's last real position, so no query row is
fully masked.

Sliding-window layers (Mistral; the ``sliding_attention`` layers of Qwen2/Qwen3) attend to the
last ``window`` positions only: a query at position p sees keys at p − window < j ≤ p, as
transformers defines it. The cache still holds the whole context; the window is a mask, built
once per forward pass and used by the windowed layers (``ctx.windowed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from tokenflow.engine.kv_cache import KVCache


@dataclass
class AttentionContext:
    """How one forward pass reads and writes the KV cache (shared by all layers)."""

    kind: Literal["prefill", "decode", "extend"]
    cache: KVCache | None = None
    write_slots: torch.Tensor | None = None
    """Prefill: cache slots to fill, [S]."""
    write_rows: torch.Tensor | None = None
    """Prefill: for each slot in `write_slots`, the batch row whose keys/values it receives."""
    rows: torch.Tensor | None = None
    """Decode: ``arange(B)``; row b is slot b."""
    positions: torch.Tensor | None = None
    """Decode: position of each row's new token, [B]."""
    key_bias: torch.Tensor | None = None
    """Decode: additive mask [B * kv_heads, 1, length], -inf past each row's end."""
    length: int = 0
    """Decode: positions attended (the longest sequence in the batch)."""
    windowed: frozenset[int] = frozenset()
    """Layers with sliding-window attention that need the masks below (empty when every
    sequence of the pass fits in the window)."""
    window_bias: torch.Tensor | None = None
    """Decode, windowed layers: ``key_bias`` with the positions behind the window masked too."""
    window_mask: torch.Tensor | None = None
    """Prefill, windowed layers: bool [T, T], True where a query may attend (causal and within
    the window). Extend: the same per row, [G, 1, T, length]."""
    key_mask: torch.Tensor | None = None
    """Extend: bool [G, 1, T, length], True where a query may attend (causal, absolute positions)."""
    read_slots: torch.Tensor | None = None
    """Extend: the cache slot each row reads its keys/values from, [G]."""
    token_slots: torch.Tensor | None = None
    """Extend, one entry per (real new token, slot it goes to): the slot, [M]."""
    token_positions: torch.Tensor | None = None
    """Extend: the position each entry is written at, [M]."""
    token_rows: torch.Tensor | None = None
    """Extend: the batch row each entry's keys/values come from, [M]."""
    token_index: torch.Tensor | None = None
    """Extend: the entry's index within its row (0 = the row's first new token), [M]."""


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext,
                      layer: int, scale: float) -> torch.Tensor:
    """``q`` [N, H, T, D], ``k``/``v`` [N, KVH, T, D] -> [N, H, T, D]."""
    if ctx.cache is not None and ctx.write_slots is not None:
        length = k.shape[2]
        for src, cache in ((k, ctx.cache.k[layer]), (v, ctx.cache.v[layer])):
            cache[:, :, :length].index_copy_(0, ctx.write_slots, src.index_select(0, ctx.write_rows))
    if layer in ctx.windowed:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.window_mask, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext,
                     layer: int, scale: float) -> torch.Tensor:
    """``q`` [B, H, D], ``k``/``v`` [B, KVH, D] (the new token) -> [B, H * D]."""
    k_cache, v_cache = ctx.cache.k[layer], ctx.cache.v[layer]
    k_cache[ctx.rows, :, ctx.positions] = k
    v_cache[ctx.rows, :, ctx.positions] = v
    batch, heads, dim = q.shape
    kv_heads = k.shape[1]
    # Slots and kv heads merge into one batch dim of a strided view (no copy). Grouped-query
    # attention without repeating K/V: query head h uses kv head h // group.
    keys = k_cache[:batch, :, : ctx.length].view(batch * kv_heads, ctx.length, dim)
    values = v_cache[:batch, :, : ctx.length].view(batch * kv_heads, ctx.length, dim)
    q = q.reshape(batch * kv_heads, heads // kv_heads, dim)
    # baddbmm reads the strided cache view in place, where bmm/matmul first copy it (measured
    # ~1.5x slower on CPU); it also folds in the scale and the mask.
    bias = ctx.window_bias if layer in ctx.windowed else ctx.key_bias
    scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.baddbmm(ctx.key_bias.new_zeros(1, 1, 1).expand(q.shape), probs, values, beta=0)
    return out.reshape(batch, heads * dim)


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext,
                     layer: int, scale: float) -> torch.Tensor:
    """``q`` [G, H, T, D], ``k``/``v`` [G, KVH, T, D] (new tokens, right-padded) -> [G, H, T, D]."""
    k_cache, v_cache = ctx.cache.k[layer], ctx.cache.v[layer]
    k_cache[ctx.token_slots, :, ctx.token_positions] = k[ctx.token_rows, :, ctx.token_index]
    v_cache[ctx.token_slots, :, ctx.token_positions] = v[ctx.token_rows, :, ctx.token_index]
    keys = k_cache[:, :, : ctx.length].index_select(0, ctx.read_slots)
    values = v_cache[:, :, : ctx.length].index_select(0, ctx.read_slots)
    mask = ctx.window_mask if layer in ctx.windowed else ctx.key_mask
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)

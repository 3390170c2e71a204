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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from tokenflow.engine.builtin.cache.kv_cache import KVCache


@dataclass
class AttentionContext:
    """How one forward pass reads and writes the KV cache (shared by all layers)."""

    kind: Literal["prefill", "decode", "extend"]
    cache: KVCache | None = None
    write_slots: torch.Tensor | None = None
    """Prefill: cache slots to fill, [S]."""
    write_rows: torch.Tensor | None = None
    """Prefill: for each slot in `write_slots`, the batch row whose keys/values it receives."""
    write_index: torch.Tensor | None = None
    """Decode: where each row's new key/value goes in a layer's cache seen as
    ``[slots * kv_heads * capacity, head_dim]``, [B * kv_heads] (row b is slot b)."""
    key_bias: torch.Tensor | None = None
    """Decode: additive mask [B, 1, 1, length], -inf past each row's end (broadcast over heads)."""
    length: int = 0
    """Decode: positions attended (the longest sequence in the batch)."""
    short_length: int = 0
    """Decode, split (:func:`decode_split`): every row but ``long_rows`` ends within this many
    positions, so the batch attends over only these and the long rows again over ``length``."""
    long_rows: torch.Tensor | None = None
    """Decode, split: the rows longer than ``short_length``, [n] (None: no split)."""
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
    pack_index: torch.Tensor | None = None
    """Packed prefill: where each of the pass's T tokens sits in the prompts right-padded to
    ``[G, L]`` (``pack_shape``), as a flat row index ``g * L + position``, [T]."""
    pack_shape: tuple[int, int] = (0, 0)
    """Packed prefill: ``(G, L)``, the prompts and the longest prompt."""
    kernel: Callable | None = None
    """Decode: the compiled CPU kernel (`tokenflow.engine.builtin.kernels.DecodeAttention`); it
    reads each row's own positions, ``row_starts[b] <= j < row_ends[b]``, instead of the masks."""
    row_ends: torch.Tensor | None = None
    """Decode, kernel: each row's length after this step's token, int64 [B]."""
    row_starts: torch.Tensor | None = None
    """Decode, kernel: zeros, int64 [B] (every position from the first)."""
    window_starts: torch.Tensor | None = None
    """Decode, kernel, windowed layers: each row's first position inside the window, int64 [B]."""


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


def packed_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext,
                             layer: int, scale: float) -> torch.Tensor:
    """A prefill whose prompts come packed, one token after another (no padding in the products
    around attention): ``q`` [T, H, D], ``k``/``v`` [T, KVH, D] -> [T, H * D].

    Attention itself runs as `prefill_attention` on the prompts right-padded to ``[G, L]``, each
    prompt causal on its own: spreading the tokens into that grid (zeros elsewhere, so the
    padding the cache receives is finite and masks cleanly) costs two copies a layer, where
    attention over the packed tokens with a block-diagonal mask would cost T² per head."""
    grid = [_unpack(x, ctx) for x in (q, k, v)]
    out = prefill_attention(*grid, ctx, layer, scale)  # [G, H, L, D]
    heads, dim = q.shape[1], q.shape[2]
    return out.transpose(1, 2).reshape(-1, heads * dim).index_select(0, ctx.pack_index)


def _unpack(x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """[T, heads, D] packed tokens -> [G, heads, L, D], right-padded with zeros."""
    groups, length = ctx.pack_shape
    grid = x.new_zeros(groups * length, x.shape[1], x.shape[2])
    grid.index_copy_(0, ctx.pack_index, x)
    return grid.view(groups, length, x.shape[1], x.shape[2]).transpose(1, 2)


def decode_split(lengths: list[int]) -> tuple[int, list[int]] | None:
    """Where to split a decode batch whose lengths are long-tailed: ``(short_length, long_rows)``
    or None.

    Attention over the strided cache view costs B × L_max, however short most rows are; with a
    few long samples in a batch of short ones (reasoning RL's straggler tail) most of it is spent
    on masked positions. Splitting off the j longest rows costs B × l_j for the batch plus about
    2 × j × L_max for those rows (a copy of their keys/values, then their attention); take the j
    that costs least, if it saves at least a quarter."""
    batch = len(lengths)
    if batch < 8:
        return None
    order = sorted(range(batch), key=lengths.__getitem__, reverse=True)
    longest = lengths[order[0]]
    full = batch * longest
    best, best_j = full, 0
    for j in range(1, batch // 4 + 1):
        cost = batch * lengths[order[j]] + 2 * j * longest
        if cost < best:
            best, best_j = cost, j
    if best_j == 0 or best > 0.75 * full:
        return None
    return lengths[order[best_j]], sorted(order[:best_j])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext,
                     layer: int, scale: float) -> torch.Tensor:
    """``q`` [B, H, D], ``k``/``v`` [B, KVH, D] (the new token) -> [B, H * D]."""
    k_cache, v_cache = ctx.cache.k[layer], ctx.cache.v[layer]
    batch, heads, dim = q.shape
    kv_heads = k.shape[1]
    if ctx.kernel is not None:  # writes the new keys/values itself, then reads each row's own positions
        starts = ctx.window_starts if layer in ctx.windowed else ctx.row_starts
        q = q.view(batch, kv_heads, heads // kv_heads, dim)
        return ctx.kernel(q, k_cache, v_cache, k, v, starts, ctx.row_ends, scale).view(batch, heads * dim)
    # The new keys/values go in through a flat view, one row per (slot, kv head): an index_copy_
    # with indices computed once per step, not advanced indexing in every layer.
    k_cache.view(-1, dim).index_copy_(0, ctx.write_index, k.reshape(-1, dim))
    v_cache.view(-1, dim).index_copy_(0, ctx.write_index, v.reshape(-1, dim))
    # Grouped-query attention without repeating K/V: query head h uses kv head h // group, so
    # [B, KVH, group, D] queries meet [B, KVH, L, D] keys head for head.
    q = q.view(batch, kv_heads, heads // kv_heads, dim)
    windowed = layer in ctx.windowed
    bias = ctx.window_bias if windowed else ctx.key_bias
    split = ctx.long_rows is not None and not windowed
    length = ctx.short_length if split else ctx.length
    # A strided view of the cache (no gather, no copy).
    out = _attend(q, k_cache[:batch, :, :length], v_cache[:batch, :, :length], bias[..., :length], scale)
    if split:
        # The long rows again, over every position (their keys gathered: a few rows).
        rows = ctx.long_rows
        keys = k_cache[:, :, : ctx.length].index_select(0, rows)
        values = v_cache[:, :, : ctx.length].index_select(0, rows)
        out.index_copy_(0, rows, _attend(q.index_select(0, rows), keys, values, bias.index_select(0, rows), scale))
    return out.reshape(batch, heads * dim)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """``q`` [B, KVH, group, D], ``keys``/``values`` [B, KVH, L, D] (strided views), ``bias``
    [B, 1, 1, L] -> [B, KVH, group, D]. In bfloat16 the fused kernel reads the views in place
    and keeps the probabilities in float32: 2.1-2.2x faster than two batched products around a
    softmax on SmolLM2's decode shapes (64 rows, 80 positions), which copied both views first.
    In float32 on the CPU the products read the views in place too, and are the faster way:
    SmolLM2's shapes, two threads, AVX2: 327 against 566 µs (40 rows, 100 positions), 631
    against 1,071 µs (64 rows, 128 positions)."""
    if q.dtype == torch.float32 and q.device.type == "cpu":
        scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(scale).add_(bias)
        return torch.matmul(torch.softmax(scores, -1), values)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)


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

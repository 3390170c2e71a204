"""The KV cache: slot bookkeeping (plain Python) and the per-layer key/value tensors.

Layout: one contiguous tensor per layer for keys and one for values, shaped
``[slots, kv_heads, capacity, head_dim]``. A running sequence owns one slot. The allocator keeps
the used slots packed at ``0 .. num_used-1`` (a freed slot is refilled by moving the last used
slot into it), so that the decode batch is exactly the first ``num_used`` slots: attention reads
a view ``k[:B, :, :L]`` instead of gathering scattered slots, and no compute is spent on holes.

The tensors start small and grow (slots and positions) to what live sequences need, so a large
``max_model_len`` costs no memory until a sequence actually gets that long.
"""

from __future__ import annotations

import torch


class SlotAllocator:
    """Hands out cache slots, keeping the used ones packed at ``0 .. num_used-1``."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.num_used = 0

    @property
    def num_free(self) -> int:
        return self.num_slots - self.num_used

    def allocate(self, n: int) -> list[int]:
        """Take the ``n`` lowest free slots."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} cache slots, only {self.num_free} free")
        slots = list(range(self.num_used, self.num_used + n))
        self.num_used += n
        return slots

    def free(self, slot: int) -> tuple[int, int] | None:
        """Release ``slot``. Returns the move ``(src, dst)`` that keeps the slots packed: the
        sequence in the last used slot ``src`` must now live in ``dst`` (None if ``slot`` was last).
        """
        if not 0 <= slot < self.num_used:
            raise RuntimeError(f"slot {slot} is not in use (used: 0..{self.num_used - 1})")
        self.num_used -= 1
        last = self.num_used
        return None if slot == last else (last, slot)


def grown(needed: int, current: int, limit: int, step: int) -> int:
    """New size for a buffer that must hold ``needed``: at least double (amortised O(1) growth),
    rounded up to ``step``, never above ``limit``."""
    if needed <= current:
        return current
    if needed > limit:
        raise RuntimeError(f"KV cache needs {needed} but the limit is {limit}")
    size = max(needed, 2 * current)
    size = -(-size // step) * step
    return min(size, limit)


class KVCache:
    """Per-layer key/value tensors ``[slots, kv_heads, capacity, head_dim]``, grown on demand."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_slots: int,
                 max_len: int, dtype: torch.dtype, device: torch.device, growth: int = 64) -> None:
        self.num_layers = num_layers
        self.shape_tail = (num_kv_heads, head_dim)
        self.max_slots = max_slots
        self.max_len = max_len
        self.dtype = dtype
        self.device = device
        self.growth = growth
        self.slots = 0
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.ensure(1, min(growth, max_len))

    def ensure(self, num_slots: int, length: int, longest: int | None = None) -> None:
        """Make room for ``num_slots`` slots of ``length`` positions, keeping the contents.
        ``longest``, the most positions any live sequence can reach, caps the doubling."""
        slots = grown(num_slots, self.slots, self.max_slots, 8)
        limit = self.max_len if longest is None else min(self.max_len, max(longest, length))
        cap = grown(length, self.capacity, limit, self.growth)
        if slots == self.slots and cap == self.capacity:
            return
        kvh, hd = self.shape_tail
        old_slots, old_cap = self.slots, self.capacity

        def bigger(old: torch.Tensor | None) -> torch.Tensor:
            # Positions never written must hold finite values (masked scores meet them as
            # 0 * value), so the new part is zeroed; the old part is copied, not zeroed first.
            new = torch.empty(slots, kvh, cap, hd, dtype=self.dtype, device=self.device)
            new[old_slots:].zero_()
            new[:old_slots, :, old_cap:].zero_()
            if old is not None:
                new[:old_slots, :, :old_cap].copy_(old)
            return new

        # One tensor at a time, each old one dropped as soon as it is copied: growing then takes
        # the new cache and one old tensor, not the old cache and the new one whole (SmolLM2's
        # cache for 64 sequences of 183 positions is 0.27 GB).
        if not self.k:
            self.k, self.v = [None] * self.num_layers, [None] * self.num_layers
        for layer in range(self.num_layers):
            self.k[layer] = bigger(self.k[layer])
            self.v[layer] = bigger(self.v[layer])
        self.slots, self.capacity = slots, cap

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        for k, v in zip(self.k, self.v):
            k[dst, :, :length].copy_(k[src, :, :length])
            v[dst, :, :length].copy_(v[src, :, :length])

    def decode_index(self, positions: torch.Tensor) -> torch.Tensor:
        """Where slot b's new token goes for each kv head, as rows of a layer's tensor seen as
        ``[slots * kv_heads * capacity, head_dim]``: ``(b * kv_heads + h) * capacity + positions[b]``,
        [B * kv_heads] (slot b is decode row b)."""
        kvh = self.shape_tail[0]
        rows = torch.arange(positions.shape[0] * kvh, device=positions.device)
        return rows * self.capacity + positions.repeat_interleave(kvh)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

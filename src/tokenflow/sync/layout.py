"""Flat layouts of a model's weights: where each named tensor sits in a byte buffer or a bucket.

Both ends of a weight sync agree on one ``WeightLayout`` at start (it is a small picklable
object), then move bytes only: the sender packs tensors into flat buffers, the receiver reads
zero-copy views out of its own copies of those buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # torch loads on first use: the orchestrator unpickles layouts (in a SyncSpec) without it
    import torch

_ALIGN = 64  # bytes; keeps every view aligned for vectorised copies


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    bucket: int
    offset: int  # bytes from the start of the bucket
    nbytes: int


@dataclass(frozen=True)
class WeightLayout:
    slots: tuple[TensorSlot, ...]
    bucket_sizes: tuple[int, ...]  # bytes

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_sizes)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slots]


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)


def plan_layout(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None) -> WeightLayout:
    """Assign every tensor a (bucket, offset). ``bucket_bytes=None`` puts everything in one bucket.

    A tensor larger than the bucket size gets a bucket of its own.
    """
    slots: list[TensorSlot] = []
    sizes: list[int] = []
    cur, used = 0, 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        padded = -(-nbytes // _ALIGN) * _ALIGN
        if bucket_bytes is not None and used > 0 and used + padded > bucket_bytes:
            sizes.append(used)
            cur, used = cur + 1, 0
        slots.append(TensorSlot(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), cur, used, nbytes))
        used += padded
    sizes.append(used)
    return WeightLayout(tuple(slots), tuple(sizes))


def views(layout: WeightLayout, buckets: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Named tensor views into uint8 ``buckets`` laid out by ``layout`` (no copies)."""
    out = {}
    for s in layout.slots:
        raw = buckets[s.bucket][s.offset : s.offset + s.nbytes]
        out[s.name] = raw.view(torch_dtype(s.dtype)).view(s.shape)
    return out


def bucket_views(layout: WeightLayout, bucket: int, buf: torch.Tensor) -> list[tuple[TensorSlot, torch.Tensor]]:
    """The slots of one bucket, in layout order, with their views into ``buf`` (that bucket's bytes)."""
    out = []
    for s in layout.slots:
        if s.bucket == bucket:
            out.append((s, buf[s.offset : s.offset + s.nbytes].view(torch_dtype(s.dtype)).view(s.shape)))
    return out


def pack(layout: WeightLayout, named_tensors: Iterable[tuple[str, torch.Tensor]], buckets: list[torch.Tensor]) -> None:
    """Copy tensors into their places in ``buckets``; refuses names or shapes the layout lacks."""
    targets = views(layout, buckets)
    seen = set()
    for name, t in named_tensors:
        dst = targets.get(name)
        if dst is None or tuple(dst.shape) != tuple(t.shape):
            raise ValueError(f"tensor {name!r} {tuple(t.shape)} is not in the agreed weight layout")
        dst.copy_(t.detach())
        seen.add(name)
    missing = set(targets) - seen
    if missing:
        raise ValueError(f"weight sync missing tensors: {sorted(missing)[:5]}")


def in_place_bytes(layout: WeightLayout, bucket: int, tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The bytes of ``bucket`` as one uint8 view, if ``tensors`` (that bucket's, in slot order)
    already sit in one storage exactly where the layout puts them — as a trainer's parameters do
    once ``allocate_in_buckets`` placed them; None otherwise, and the bucket must be packed."""
    slots = [s for s in layout.slots if s.bucket == bucket]
    first = tensors[0]
    storage = first.untyped_storage()
    base = first.data_ptr() - slots[0].offset - storage.data_ptr()  # bucket start, bytes into storage
    size = layout.bucket_sizes[bucket]
    if base < 0 or base + size > storage.nbytes():
        return None
    for s, t in zip(slots, tensors):
        if (not t.is_contiguous() or t.untyped_storage().data_ptr() != storage.data_ptr()
                or t.data_ptr() - storage.data_ptr() != base + s.offset or str(t.dtype).removeprefix("torch.") != s.dtype):
            return None
    import torch

    raw = torch.empty(0, dtype=torch.uint8, device=first.device).set_(storage)
    return raw[base : base + size]


def allocate_in_buckets(layout: WeightLayout, named_tensors: Iterable[tuple[str, torch.Tensor]],
                        device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Fresh bucket buffers holding copies of ``named_tensors``; returns the views by name.

    A trainer points its parameters at these views (``param.data = view``), so its weights live
    in the broadcast's buckets, as Megatron's contiguous parameter buffers do: a weight push
    then sends them without packing. A name that appears twice (tied weights) keeps its first
    place; the bucket holding the second is packed as usual."""
    import torch

    buckets = [torch.zeros(n, dtype=torch.uint8, device=device) for n in layout.bucket_sizes]
    placed = views(layout, buckets)
    out = {}
    for name, t in named_tensors:
        dst = placed.get(name)
        if dst is None or tuple(dst.shape) != tuple(t.shape):
            raise ValueError(f"tensor {name!r} {tuple(t.shape)} is not in the agreed weight layout")
        dst.copy_(t.detach())
        out[name] = dst
    return out

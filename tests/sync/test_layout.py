"""Weight layouts on cases with known answers: where each tensor lands, what pack and
allocate_in_buckets refuse (and say), and when a bucket's bytes are already in place."""

from __future__ import annotations

import pytest
import torch

from tokenflow.sync.layout import allocate_in_buckets, in_place_bytes, pack, plan_layout, views


def f32(*shape: int) -> torch.Tensor:
    return torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape)


def test_plan_layout_pads_to_64_bytes_and_opens_a_bucket_only_past_the_limit():
    # 40 B -> 64 padded, 64 B -> 64, 4 B -> 64, 600 B -> 640 (larger than a bucket: its own)
    tensors = [("a", f32(10)), ("b", f32(16)), ("c", f32(1)), ("big", f32(150)), ("d", f32(2))]
    layout = plan_layout(tensors, bucket_bytes=128)
    where = {s.name: (s.bucket, s.offset, s.nbytes) for s in layout.slots}
    assert where == {"a": (0, 0, 40), "b": (0, 64, 64),  # 64 + 64 = 128 fits exactly
                     "c": (1, 0, 4), "big": (2, 0, 600), "d": (3, 0, 8)}
    assert layout.bucket_sizes == (128, 64, 640, 64) and layout.total_bytes == 896
    assert layout.names == ["a", "b", "c", "big", "d"]
    one = plan_layout(tensors)  # no limit: one bucket
    assert one.bucket_sizes == (896,) and {s.bucket for s in one.slots} == {0}
    assert [s.offset for s in one.slots] == [0, 64, 128, 192, 832]
    s = one.slots[3]
    assert (s.shape, s.dtype) == ((150,), "float32")


def test_pack_round_trips_through_views():
    tensors = [("a", f32(3, 2)), ("h", f32(5).to(torch.bfloat16)), ("i", torch.arange(7, dtype=torch.int64))]
    layout = plan_layout(tensors, bucket_bytes=64)
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in layout.bucket_sizes]
    pack(layout, tensors, buckets)
    got = views(layout, buckets)
    for name, t in tensors:
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)


@pytest.mark.parametrize("fill", ["pack", "allocate"])
def test_unknown_names_and_wrong_shapes_are_refused_by_name(fill):
    layout = plan_layout([("a", f32(2, 3)), ("b", f32(4))])
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in layout.bucket_sizes]

    def put(items):
        return pack(layout, items, buckets) if fill == "pack" else allocate_in_buckets(layout, items)

    with pytest.raises(ValueError, match=r"tensor 'x' \(4,\) is not in the agreed weight layout"):
        put([("a", f32(2, 3)), ("x", f32(4))])
    with pytest.raises(ValueError, match=r"tensor 'a' \(3, 2\) is not in the agreed weight layout"):
        put([("a", f32(3, 2)), ("b", f32(4))])


def test_pack_names_the_first_five_missing_tensors():
    names = [f"t{i}" for i in range(7)]
    layout = plan_layout([(n, f32(1)) for n in names])
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in layout.bucket_sizes]
    with pytest.raises(ValueError) as e:
        pack(layout, [], buckets)
    assert str(e.value) == f"weight sync missing tensors: {names[:5]}"


def test_allocate_in_buckets_places_copies_on_the_device_asked():
    tensors = [("a", f32(2, 3)), ("b", f32(4))]
    layout = plan_layout(tensors)
    placed = allocate_in_buckets(layout, tensors)
    assert all(torch.equal(placed[n], t) and placed[n].data_ptr() != t.data_ptr() for n, t in tensors)
    on_meta = allocate_in_buckets(layout, tensors, device="meta")  # a device that is not the default
    assert {t.device.type for t in on_meta.values()} == {"meta"}


def _placed(tensors, bucket_bytes=None):
    layout = plan_layout(tensors, bucket_bytes=bucket_bytes)
    return layout, allocate_in_buckets(layout, tensors)


def test_in_place_bytes_of_placed_tensors_is_the_bucket_itself():
    tensors = [("a", f32(4, 4)), ("b", f32(10)), ("c", f32(16))]
    layout, placed = _placed(tensors, bucket_bytes=128)
    for bucket, size in enumerate(layout.bucket_sizes):
        mine = [placed[s.name] for s in layout.slots if s.bucket == bucket]
        raw = in_place_bytes(layout, bucket, mine)
        assert raw is not None and raw.dtype == torch.uint8 and raw.numel() == size
        assert raw.data_ptr() == mine[0].data_ptr()
    assert in_place_bytes(layout, 0, [t.clone() for _, t in tensors[:1]]) is None  # elsewhere: pack it


def test_in_place_bytes_refuses_tensors_not_exactly_where_the_layout_puts_them():
    tensors = [("a", f32(4, 4)), ("b", f32(4, 4))]
    layout, placed = _placed(tensors)
    a, b = placed["a"], placed["b"]
    assert in_place_bytes(layout, 0, [a, b]) is not None
    assert in_place_bytes(layout, 0, [a, a]) is None  # the same storage, the wrong offset
    assert in_place_bytes(layout, 0, [a, b.t()]) is None  # the right place, not contiguous
    assert in_place_bytes(layout, 0, [a, b.view(torch.int32)]) is None  # the right bytes, another dtype
    assert in_place_bytes(layout, 0, [a, f32(4, 4)]) is None  # another storage


def test_in_place_bytes_refuses_a_storage_shorter_than_the_bucket():
    # a at 0 (64 B), b at 64 (40 B, padded to 64): a 104-byte storage holds both where the
    # layout puts them, but not the bucket's 128 bytes.
    layout = plan_layout([("a", f32(16)), ("b", f32(10))])
    assert layout.bucket_sizes == (128,)
    storage = torch.zeros(26, dtype=torch.float32)
    a, b = storage[:16], storage[16:]
    assert in_place_bytes(layout, 0, [a, b]) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_in_place_bytes_and_allocation_on_a_gpu():
    tensors = [("a", f32(4, 4)), ("b", f32(10))]
    layout = plan_layout(tensors)
    placed = allocate_in_buckets(layout, tensors, device="cuda")
    assert {t.device.type for t in placed.values()} == {"cuda"}
    raw = in_place_bytes(layout, 0, [placed["a"], placed["b"]])
    assert raw is not None and raw.device.type == "cuda" and raw.numel() == layout.bucket_sizes[0]

"""Both weight-sync transports move exact bytes between real processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tokenflow.sync.factory import make_receiver, make_sender
from tokenflow.sync.layout import allocate_in_buckets, in_place_bytes, pack, plan_layout, views


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(50, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g),
        "model.layers.0.input_layernorm.weight": torch.randn(16, generator=g),
        "lm_head.weight": torch.randn(50, 16, generator=g).to(torch.bfloat16),
    }


def _engine(spec, in_q, out_q):
    recv = make_receiver(spec)
    recv.connect()
    while True:
        msg = in_q.get()
        if msg is None:
            break
        recv.begin(msg)
        while not recv.ready():
            pass
        got = {k: v.clone() for k, v in recv.tensors().items()}
        recv.done(msg)
        out_q.put((msg.version, got))
    recv.close()


def test_layout_packs_and_unpacks_exactly():
    w = _weights(0)
    layout = plan_layout(w.items(), bucket_bytes=4096)
    assert len(layout.bucket_sizes) > 1  # the 50x16 float32 tensors force several buckets
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in layout.bucket_sizes]
    pack(layout, w.items(), buckets)
    for name, t in views(layout, buckets).items():
        assert torch.equal(t, w[name]), name
    with pytest.raises(ValueError, match="missing"):
        pack(layout, list(w.items())[:2], buckets)


def _big_weights(seed: int) -> dict[str, torch.Tensor]:
    """~6 MiB: buckets large enough to be striped across connections (≥ 1 MiB a stripe)."""
    g = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(1000, 600, generator=g),
            "model.layers.0.mlp.up_proj.weight": torch.randn(900, 600, generator=g),
            "model.norm.weight": torch.randn(600, generator=g),
            "lm_head.weight": torch.randn(1000, 600, generator=g).to(torch.bfloat16)}


def test_placed_weights_are_sent_in_place_and_others_are_not():
    w = _weights(0)
    layout = plan_layout(w.items(), bucket_bytes=4096)
    placed = allocate_in_buckets(layout, w.items())
    for name in w:
        assert torch.equal(placed[name], w[name]) and placed[name].data_ptr() != w[name].data_ptr()
    for b in range(len(layout.bucket_sizes)):
        names = [s.name for s in layout.slots if s.bucket == b]
        raw = in_place_bytes(layout, b, [placed[n] for n in names])
        assert raw is not None and raw.numel() == layout.bucket_sizes[b]
        assert raw.data_ptr() == placed[names[0]].data_ptr() - layout.slots[layout.names.index(names[0])].offset
        multi = len(names) > 1 or layout.slots[layout.names.index(names[0])].nbytes != layout.bucket_sizes[b]
        if multi:  # separate tensors (or a copy) are not where the layout puts them
            assert in_place_bytes(layout, b, [w[n] for n in names]) is None
            assert in_place_bytes(layout, b, [placed[n].clone() for n in names]) is None
    # A tied weight keeps one place: the other slot's bucket is no longer in place.
    tied = dict(placed)
    tied["lm_head.weight"] = tied["model.embed_tokens.weight"].to(torch.bfloat16)
    last = layout.slots[-1].bucket
    assert in_place_bytes(layout, last, [tied[s.name] for s in layout.slots if s.bucket == last]) is None


@pytest.mark.parametrize("transport,opts,weights,placed", [
    ("shared_memory", {}, _weights, False),
    ("shared_memory", {"slots": 1}, _weights, False),
    ("broadcast", {"bucket_mb": 0.004}, _weights, False),
    ("broadcast", {"bucket_mb": 0.004}, _weights, True),
    ("broadcast", {"per_param": True}, _weights, False),
    ("broadcast", {"bucket_mb": 3, "streams": 3}, _big_weights, False),
    ("broadcast", {"bucket_mb": 3, "streams": 2}, _big_weights, True),
])
def test_transport_delivers_every_version(transport, opts, weights, placed):
    ctx = mp.get_context("spawn")
    w0 = weights(0)
    sender = make_sender(transport, w0.items(), **opts)
    held = allocate_in_buckets(sender.spec.layout, w0.items()) if placed else None
    in_q, out_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_engine, args=(sender.spec, in_q, out_q), daemon=True)
    proc.start()
    try:
        sender.connect()
        for version in (1, 2, 3):
            w = weights(version)
            if held is not None:  # a trainer updating its placed parameters in place
                for name, t in w.items():
                    held[name].copy_(t)
                w = held
            timings = sender.send(w.items(), version, notify=in_q.put)
            assert timings["sync/bytes"] > 0
            if placed:
                assert timings["sync/pack_s"] == 0.0  # nothing was copied: sent where it lives
            got_version, got = out_q.get(timeout=60)
            assert got_version == version
            assert set(got) == set(w)
            for name in w:
                assert got[name].dtype == w[name].dtype
                assert torch.equal(got[name], w[name]), name
        in_q.put(None)
        proc.join(timeout=30)
        assert proc.exitcode == 0
    finally:
        sender.close()
        if proc.is_alive():
            proc.kill()


def test_buckets_are_striped_by_size_alone():
    from tokenflow.sync.broadcast import _stripes

    buf = torch.zeros(3 * 2**20 + 5, dtype=torch.uint8)
    parts = _stripes(buf, 2)
    assert len(parts) == 2 and sum(p.numel() for p in parts) == buf.numel()
    assert parts[1].data_ptr() == parts[0].data_ptr() + parts[0].numel()  # contiguous views, no copy
    assert len(_stripes(buf, 8)) == 3  # never a stripe under 1 MiB
    assert len(_stripes(buf[: 2**20], 4)) == 1


@pytest.mark.parametrize("slots", [1, 2])
def test_a_slot_is_rewritten_only_after_every_engine_loaded_what_it_held(slots):
    """With ``slots`` slots the sender runs ``slots - 1`` versions ahead of a receiver that has
    not loaded: the next send waits for its acknowledgement, and times out naming the slot."""
    sender = make_sender("shared_memory", _weights(0).items(), timeout_s=0.3, slots=slots)
    recv = make_receiver(sender.spec)
    notices = []
    try:
        assert len(sender.spec.options["slots"]) == slots
        for version in range(1, slots + 1):  # the free slots take a version each, unread
            sender.send(_weights(version).items(), version, notify=notices.append)
        with pytest.raises(TimeoutError, match="did not release weight slot"):
            sender.send(_weights(9).items(), slots + 1, notify=notices.append)
        first = notices[0]
        recv.begin(first)
        assert torch.equal(recv.tensors()["model.embed_tokens.weight"], _weights(1)["model.embed_tokens.weight"])
        recv.done(first)  # loaded: its slot may be written again
        sender.send(_weights(slots + 1).items(), slots + 1, notify=notices.append)
        recv.begin(notices[-1])
        assert torch.equal(recv.tensors()["model.embed_tokens.weight"],
                           _weights(slots + 1)["model.embed_tokens.weight"])
    finally:
        recv.close()
        sender.close()


def test_a_sender_whose_run_is_gone_stops_waiting_for_a_slot():
    """A trainer whose orchestrator was killed must not wait ``timeout_s`` for engines that
    exited with it: once ``abandon()`` says so, the wait for a slot ends within about a second."""
    import time

    from tokenflow.sync.shared_memory import SlotAbandoned

    gone_at = time.monotonic() + 0.5
    sender = make_sender("shared_memory", _weights(0).items(), timeout_s=60, slots=1,
                         abandon=lambda: time.monotonic() > gone_at)
    try:
        sender.send(_weights(1).items(), 1, notify=lambda notice: None)  # nobody loads it
        t0 = time.monotonic()
        with pytest.raises(SlotAbandoned, match="weight slot 0 .version 1.: the run is gone"):
            sender.send(_weights(2).items(), 2, notify=lambda notice: None)
        # asked once a second: gone 0.5 s in, noticed at the first question after it (1 s)
        assert time.monotonic() - t0 < 5
    finally:
        sender.close()

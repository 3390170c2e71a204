"""Both weight-sync transports move exact bytes between real processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tokenflow.sync.base import make_receiver, make_sender
from tokenflow.sync.layout import pack, plan_layout, views


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


@pytest.mark.parametrize("transport,opts", [
    ("shared_memory", {}),
    ("broadcast", {"bucket_mb": 0.004}),
    ("broadcast", {"per_param": True}),
])
def test_transport_delivers_every_version(transport, opts):
    ctx = mp.get_context("spawn")
    w0 = _weights(0)
    sender = make_sender(transport, w0.items(), **opts)
    in_q, out_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_engine, args=(sender.spec, in_q, out_q), daemon=True)
    proc.start()
    try:
        sender.connect()
        for version in (1, 2, 3):
            w = _weights(version)
            timings = sender.send(w.items(), version, notify=in_q.put)
            assert timings["sync/bytes"] > 0
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

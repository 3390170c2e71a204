"""`tokenflow bench sync`: weight-sync transports on a ~50 MB model across 2 processes.

The model is a small Llama's state dict (embeddings, output head, and per layer q/k/v/o,
gate/up/down projections and two norms: ~100 tensors of varied shapes), in float32, sized to
``--size-mb``. This process is the sender (the trainer); one spawned process is the receiver
(an engine). Per transport, one update is timed from the sender's ``send()`` call to the moment
the receiver reports back, as the median over ``--repeats`` updates after one warm-up:

* ``per_param_ms``  one parameter at a time: a blocking gloo broadcast per tensor, as a loop
  over the parameters does, received;
* ``packed_ms``     the packed bucket broadcast (``--bucket-mb``) end to end: packing into the
  two staging buffers included (it overlaps the wire), received;
* ``shared_memory_ms``  the shared-memory path end to end: pack into the slot, notify, and the
  receiver's load (copying the weights out of the slot into its own tensors).

Two references: ``flat_ms`` is one broadcast of the same bytes already in one buffer (no
packing: the floor for any broadcast), and ``receiver_load_ms`` is the receiver's load on its own
(what an engine spends applying received weights, whatever carried them).
``packed_speedup = per_param_ms / packed_ms``. The machine's load average is printed with the
numbers: on a shared machine it moves them.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import statistics
import time

MODES = {"per_param": ("broadcast", {"per_param": True}), "packed": ("broadcast", {}),
         "shared_memory": ("shared_memory", {}), "flat": ("broadcast", {"per_param": True})}


def register(subparsers) -> None:
    p = subparsers.add_parser("sync", help="weight sync: per-parameter vs packed broadcast vs shared memory")
    p.add_argument("--size-mb", type=float, default=50.0, help="model size in MiB (float32)")
    p.add_argument("--repeats", type=int, default=7, help="timed updates per transport (median reported)")
    p.add_argument("--bucket-mb", type=float, default=None, help="packed bucket size (default: sync.bucket_mb)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def llama_like(size_mb: float, hidden: int = 256, intermediate: int = 704, vocab: int = 8192):
    """Named float32 tensors shaped like a small Llama's state dict, at least ``size_mb`` MiB."""
    import torch

    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    fixed = 2 * vocab * hidden + hidden
    layers = max(1, math.ceil((size_mb * 2**20 / 4 - fixed) / per_layer))
    g = torch.Generator().manual_seed(0)
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + f"self_attn.{n}_proj.weight", (hidden, hidden)) for n in "qkvo"]
        shapes += [(p + "mlp.gate_proj.weight", (intermediate, hidden)), (p + "mlp.up_proj.weight", (intermediate, hidden)),
                   (p + "mlp.down_proj.weight", (hidden, intermediate)),
                   (p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return {name: torch.randn(shape, generator=g) for name, shape in shapes}


def _receiver(cmd_q, out_q) -> None:
    """The engine side: attach to each transport, then per notice receive, load, report."""
    import torch

    from tokenflow.sync.base import make_receiver

    torch.set_num_threads(1)
    while True:
        cmd = cmd_q.get()
        if cmd is None:
            return
        if isinstance(cmd, tuple) and cmd[0] == "attach":
            recv = make_receiver(cmd[1])
            recv.connect()
            model = {s.name: torch.empty(s.shape, dtype=getattr(torch, s.dtype)) for s in cmd[1].layout.slots}
            out_q.put("attached")
            continue
        if isinstance(cmd, tuple) and cmd[0] == "close":
            recv.close()
            out_q.put("closed")
            continue
        msg = cmd
        recv.begin(msg)
        while not recv.ready():
            time.sleep(0.0005)
        t_ready = time.time()
        for name, t in recv.tensors().items():
            model[name].copy_(t)
        t_loaded = time.time()
        recv.done(msg)
        out_q.put((msg.version, t_ready, t_loaded))


def _time_mode(name: str, weights: dict, cmd_q, out_q, repeats: int, bucket_mb: float) -> dict:
    import torch

    from tokenflow.sync.base import make_sender

    transport, opts = MODES[name]
    if name == "flat":  # the same bytes as one tensor: one broadcast, nothing to pack
        weights = {"flat": torch.cat([t.reshape(-1) for t in weights.values()])}
    if transport == "broadcast":
        opts = {**opts, "bucket_mb": bucket_mb}
    sender = make_sender(transport, weights.items(), num_receivers=1, timeout_s=60, **opts)
    cmd_q.put(("attach", sender.spec))
    sender.connect()
    assert out_q.get(timeout=120) == "attached"
    times, loads, sends = [], [], []
    try:
        for version in range(1, repeats + 2):  # the first is a warm-up
            t0 = time.time()
            timings = sender.send(weights.items(), version, notify=cmd_q.put)
            t_sent = time.time()
            v, t_ready, t_loaded = out_q.get(timeout=120)
            assert v == version
            if version > 1:
                end = t_loaded if transport == "shared_memory" else t_ready
                times.append((end - t0) * 1e3)
                loads.append((t_loaded - t_ready) * 1e3)
                sends.append((t_sent - t0) * 1e3)
        cmd_q.put(("close",))
        assert out_q.get(timeout=60) == "closed"
    finally:
        sender.close()
    return {"ms": statistics.median(times), "load_ms": statistics.median(loads),
            "sender_ms": statistics.median(sends), "messages": int(timings.get("sync/messages", 1))}


def run(args, overrides: list[str] | None = None) -> int:
    import torch

    from tokenflow.config.sections import SyncConfig

    torch.set_num_threads(1)
    bucket_mb = args.bucket_mb or SyncConfig().bucket_mb
    weights = llama_like(args.size_mb)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    ctx = mp.get_context("spawn")
    cmd_q, out_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(cmd_q, out_q), daemon=True)
    proc.start()
    load_before = os.getloadavg()[0]
    try:
        res = {name: _time_mode(name, weights, cmd_q, out_q, args.repeats, bucket_mb) for name in MODES}
    finally:
        cmd_q.put(None)
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    result = {
        "size_mb": round(size / 2**20, 2), "tensors": len(weights), "bucket_mb": bucket_mb,
        "repeats": args.repeats, "per_param_ms": res["per_param"]["ms"], "packed_ms": res["packed"]["ms"],
        "shared_memory_ms": res["shared_memory"]["ms"],
        "packed_speedup": res["per_param"]["ms"] / res["packed"]["ms"], "flat_ms": res["flat"]["ms"],
        "receiver_load_ms": res["packed"]["load_ms"], "packed_buckets": res["packed"]["messages"],
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"weight sync, {result['size_mb']} MiB in {len(weights)} float32 tensors, sender → 1 receiver process "
          f"(median of {args.repeats}; load average {result['loadavg_1m'][0]} → {result['loadavg_1m'][1]} "
          f"on {result['cpus']} CPUs)")
    print(f"  broadcast, one per parameter  {result['per_param_ms']:8.1f} ms   ({len(weights)} messages)")
    print(f"  broadcast, packed buckets     {result['packed_ms']:8.1f} ms   ({result['packed_buckets']} buckets of "
          f"≤ {bucket_mb:g} MiB)   speedup ×{result['packed_speedup']:.1f}")
    print(f"  shared memory, end to end     {result['shared_memory_ms']:8.1f} ms   (pack + notify + receiver load)")
    print(f"  reference: one flat buffer    {result['flat_ms']:8.1f} ms   (same bytes pre-packed, one broadcast)")
    print(f"  reference: receiver load      {result['receiver_load_ms']:8.1f} ms")
    return 0

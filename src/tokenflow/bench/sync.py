"""`tokenflow bench sync`: weight-sync transports on a ~50 MB model across 2 processes.

The model is a small Llama's state dict (embeddings, output head, and per layer q/k/v/o,
gate/up/down projections and two norms: ~100 tensors of varied shapes), in float32, sized to
``--size-mb``. This process is the sender (the trainer); one spawned process is the receiver
(an engine). Every transport is connected at once and the updates are interleaved — one per
transport per round, in a rotating order — so a change of machine load hits all of them alike;
each number is the median over ``--repeats`` rounds after one warm-up round. One update is timed
from the sender's ``send()`` call to the moment the receiver reports back:

* ``per_param_ms``  one parameter at a time: a blocking broadcast per tensor on both sides, as a
  loop over the parameters does;
* ``packed_ms``     the packed bucket broadcast (``--bucket-mb``, ``--streams``) as the trainer
  runs it: its parameters live in the buckets (``Trainer.place_weights``), so nothing is
  packed, and each bucket is striped across the group's connections;
* ``packed_copy_ms`` the same, from separate tensors packed into the two staging buffers as
  they go (a sharded trainer, whose full tensors are gathered one by one at each push);
* ``shared_memory_ms``  the shared-memory path end to end: pack into the slot, notify, and the
  receiver's load (copying the weights out of the slot into its own tensors).

Two references: ``flat_ms`` is one broadcast of the same bytes from one buffer over one
connection (a single message), and ``receiver_load_ms`` is the receiver's load on its own (what
an engine spends applying received weights, whatever carried them).
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

# mode -> (transport, sender options, how the sender holds the weights)
MODES = {
    "per_param": ("broadcast", {"per_param": True}, "tensors"),
    "packed": ("broadcast", {}, "placed"),
    "packed_copy": ("broadcast", {}, "tensors"),
    "shared_memory": ("shared_memory", {}, "tensors"),
    "flat": ("broadcast", {"per_param": True}, "flat"),
}


def register(subparsers) -> None:
    p = subparsers.add_parser("sync", help="weight sync: per-parameter vs packed broadcast vs shared memory")
    p.add_argument("--size-mb", type=float, default=50.0, help="model size in MiB (float32)")
    p.add_argument("--repeats", type=int, default=15, help="timed rounds, one update per transport each (median)")
    p.add_argument("--bucket-mb", type=float, default=None, help="packed bucket size (default: sync.bucket_mb)")
    p.add_argument("--streams", type=int, default=None, help="connections per peer (default: sync.streams)")
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

    from tokenflow.sync.factory import make_receiver

    torch.set_num_threads(1)
    receivers, models = {}, {}
    while True:
        cmd = cmd_q.get()
        if cmd is None:
            for recv in receivers.values():
                recv.close()
            return
        mode, msg = cmd
        if mode == "attach":
            mode, spec = msg
            receivers[mode] = make_receiver(spec)
            receivers[mode].connect()
            models[mode] = {s.name: torch.empty(s.shape, dtype=getattr(torch, s.dtype)) for s in spec.layout.slots}
            out_q.put("attached")
            continue
        recv = receivers[mode]
        recv.begin(msg)
        while not recv.ready():
            time.sleep(0.0002)
        t_ready = time.time()
        for name, t in recv.tensors().items():
            models[mode][name].copy_(t)
        t_loaded = time.time()
        recv.done(msg)
        out_q.put((mode, msg.version, t_ready, t_loaded))


def _sender(mode: str, weights: dict, bucket_mb: float, streams: int):
    """The mode's sender, connected-to-be, and the weights as that mode's trainer holds them."""
    import torch

    from tokenflow.sync.factory import make_sender
    from tokenflow.sync.layout import allocate_in_buckets

    transport, opts, holding = MODES[mode]
    if holding == "flat":  # the same bytes as one tensor: one broadcast, nothing to pack
        weights = {"flat": torch.cat([t.reshape(-1) for t in weights.values()])}
    if transport == "broadcast":
        opts = {**opts, "bucket_mb": bucket_mb, "streams": streams}
    sender = make_sender(transport, weights.items(), num_receivers=1, timeout_s=60, **opts)
    if holding == "placed":  # the trainer's parameters live in the buckets: nothing to pack
        weights = allocate_in_buckets(sender.spec.layout, weights.items())
    return sender, weights


def _rounds(senders: dict, cmd_q, out_q, repeats: int) -> dict[str, dict]:
    """``repeats`` + 1 rounds, one update per mode each in a rotating order; the first is a warm-up."""
    times = {m: [] for m in senders}
    loads = {m: [] for m in senders}
    messages = {}
    order = list(senders)
    for version in range(1, repeats + 2):
        k = version % len(order)
        for mode in order[k:] + order[:k]:
            sender, weights = senders[mode]
            t0 = time.time()
            timings = sender.send(weights.items(), version, notify=lambda m, mode=mode: cmd_q.put((mode, m)))
            got_mode, v, t_ready, t_loaded = out_q.get(timeout=120)
            assert (got_mode, v) == (mode, version)
            messages[mode] = int(timings.get("sync/messages", 1))
            if version > 1:
                end = t_loaded if MODES[mode][0] == "shared_memory" else t_ready
                times[mode].append((end - t0) * 1e3)
                loads[mode].append((t_loaded - t_ready) * 1e3)
    return {m: {"ms": statistics.median(times[m]), "load_ms": statistics.median(loads[m]),
                "messages": messages[m]} for m in senders}


def run(args, overrides: list[str] | None = None) -> int:
    import torch

    from tokenflow.config.sync import SyncConfig

    torch.set_num_threads(1)
    bucket_mb = args.bucket_mb or SyncConfig().bucket_mb
    streams = args.streams or SyncConfig().streams
    weights = llama_like(args.size_mb)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    ctx = mp.get_context("spawn")
    cmd_q, out_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(cmd_q, out_q), daemon=True)
    proc.start()
    senders = {}
    load_before = os.getloadavg()[0]
    try:
        for mode in MODES:
            sender, held = _sender(mode, weights, bucket_mb, streams)
            senders[mode] = (sender, held)
            cmd_q.put(("attach", (mode, sender.spec)))
            sender.connect()
            assert out_q.get(timeout=120) == "attached"
        res = _rounds(senders, cmd_q, out_q, args.repeats)
    finally:
        cmd_q.put(None)
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        for sender, _ in senders.values():
            sender.close()
    result = {
        "size_mb": round(size / 2**20, 2), "tensors": len(weights), "bucket_mb": bucket_mb, "streams": streams,
        "repeats": args.repeats, "per_param_ms": res["per_param"]["ms"], "packed_ms": res["packed"]["ms"],
        "packed_copy_ms": res["packed_copy"]["ms"], "shared_memory_ms": res["shared_memory"]["ms"],
        "packed_speedup": res["per_param"]["ms"] / res["packed"]["ms"], "flat_ms": res["flat"]["ms"],
        "receiver_load_ms": res["packed"]["load_ms"], "packed_buckets": res["packed"]["messages"],
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"weight sync, {result['size_mb']} MiB in {len(weights)} float32 tensors, sender → 1 receiver process "
          f"(median of {args.repeats} interleaved rounds; load average {result['loadavg_1m'][0]} → "
          f"{result['loadavg_1m'][1]} on {result['cpus']} CPUs)")
    print(f"  broadcast, one per parameter  {result['per_param_ms']:8.1f} ms   ({len(weights)} messages)")
    print(f"  broadcast, packed buckets     {result['packed_ms']:8.1f} ms   ({result['packed_buckets']} buckets of "
          f"≤ {bucket_mb:g} MiB, {streams} stream(s); weights placed in them)   speedup ×{result['packed_speedup']:.1f}")
    print(f"  broadcast, packed as it goes  {result['packed_copy_ms']:8.1f} ms   (separate tensors copied into "
          f"two staging buffers)")
    print(f"  shared memory, end to end     {result['shared_memory_ms']:8.1f} ms   (pack + notify + receiver load)")
    print(f"  reference: one flat buffer    {result['flat_ms']:8.1f} ms   (one message, one connection)")
    print(f"  reference: receiver load      {result['receiver_load_ms']:8.1f} ms")
    return 0

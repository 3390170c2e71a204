"""Weight sync by torch.distributed broadcast, packed into preallocated buckets.

The sender (trainer rank 0) and the receivers (engines, ranks 1..M) form a standalone process
group of their own — built from a TCP store, not the default group — so it coexists with the
trainer's FSDP group. Gloo carries it on CPU, NCCL on GPU. Weights travel as a few large flat
buckets (``bucket_mb`` each) instead of one message per parameter: per-message latency, not
bandwidth, dominates small models. ``per_param=True`` sends one blocking broadcast per tensor,
as a loop over the parameters does: the baseline ``tokenflow bench sync`` compares against.

The sender streams: it announces the version, then packs bucket k into one of two preallocated
staging buffers while bucket k − 1 is on the wire. On CPU the wire is TCP over loopback or a
network, and one connection does not fill it: with ``streams`` > 1 the group opens that many gloo
connections per peer and every bucket travels as ``streams`` stripes, one per connection, in
parallel (NCCL stripes across its own channels, so it gets one). Stripes are cut by size alone,
so both ends agree on them without a message. A sharded trainer's ``named_weights()``
gathers one full tensor at a time, so the sender never holds more than two buckets, and the
gathers overlap the broadcasts. Receivers hold the whole model (they are engines) and run the
receive in a background thread so the engine keeps decoding; the engine swaps the weights in
between two decode steps once ``ready()``.

Every wait is bounded by ``timeout_s`` and names the engine that did not answer: each receiver
writes ``joined/<rank>`` when it attaches and ``began/<rank>`` / ``done/<rank>`` per version in
the group's TCP store, and the sender reads them back when something times out.
"""

from __future__ import annotations

import datetime
import secrets
import socket
import threading
import time

import torch
import torch.distributed as dist

from tokenflow.metrics import trace
from tokenflow.sync.base import NamedTensors, SyncSpec, WeightsReady
from tokenflow.sync.layout import bucket_views, in_place_bytes, plan_layout, views
from tokenflow.sync.rendezvous import tcp_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(rank: int, world: int, host: str, port: int, timeout_s: float, backend: str, streams: int = 1):
    """The standalone group; rank 0 fails naming the receivers that did not attach in time.

    Gloo gets one device (one TCP connection per peer) and one worker thread per stream: the
    group hands consecutive collectives to consecutive connections, which is what stripes a
    bucket across them."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = tcp_store(host, port, world, is_master=(rank == 0), timeout_s=timeout_s)
    store.set(f"joined/{rank}", b"1")
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        keys = [f"joined/{r}" for r in range(1, world)]
        while not store.check(keys):
            if time.monotonic() > deadline:
                late = [r - 1 for r in range(1, world) if not store.check([f"joined/{r}"])]
                raise TimeoutError(f"engine receiver(s) {late} did not attach to the weight-sync group "
                                   f"within {timeout_s:g}s (sync.timeout_s)")
            time.sleep(0.01)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout  # noqa: SLF001 - torch sets a group's timeout only here
        return dist.ProcessGroupNCCL(store, rank, world, opts), store
    # torch's Gloo options (timeout, devices, threads) have no public setters
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout  # noqa: SLF001 - as above
    opts._devices = [_device(host) for _ in range(streams)]  # noqa: SLF001 - as above
    opts._threads = max(2, streams)  # noqa: SLF001 - as above
    return dist.ProcessGroupGloo(store, rank, world, opts), store


def _device(host: str):
    """This process's end of one gloo connection: loopback when the whole group is on this
    machine, else this node's own address (``GLOO_SOCKET_IFNAME`` picks the interface)."""
    if host in ("127.0.0.1", "localhost"):
        return dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
    return dist.ProcessGroupGloo.create_default_device()


def _late_receivers(store, world: int, version: int) -> str:
    """Which engines had not started / finished receiving ``version`` (for error messages)."""
    def seen(key: str) -> int:
        return int(store.get(key)) if store.check([key]) else -1

    never = [r - 1 for r in range(1, world) if seen(f"began/{r}") < version]
    unfinished = [r - 1 for r in range(1, world) if seen(f"done/{r}") < version and r - 1 not in never]
    return (f"engine receiver(s) {never} never started receiving version {version}; "
            f"receiver(s) {unfinished} started but did not finish")


def _wait_all(works, what: str, timeout_s: float, on_fail=lambda: "") -> None:
    try:
        for w in works:
            w.wait()
    except RuntimeError as e:
        how = (f"timed out after {timeout_s:g}s (sync.timeout_s)" if "timed out" in str(e).lower()
               else "failed: a peer dropped out")
        raise TimeoutError(f"weight broadcast ({what}) {how}: {on_fail()} ({e})") from None


def _broadcast(pg, t: torch.Tensor):
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return pg.broadcast([t], opts)


_MIN_STRIPE = 1 << 20  # bytes; below this a second connection costs more latency than it saves


def _stripes(buf: torch.Tensor, streams: int) -> list[torch.Tensor]:
    """``buf`` (flat uint8) cut into at most ``streams`` contiguous views of ≥ 1 MiB each."""
    n = max(1, min(streams, buf.numel() // _MIN_STRIPE))
    return list(buf.chunk(n))


def _broadcast_striped(pg, buf: torch.Tensor, streams: int) -> list:
    return [_broadcast(pg, s) for s in _stripes(buf, streams)]


class _Buffers:
    """A receiver's landing buffers: one per bucket (packed) or one per tensor (per_param)."""

    def __init__(self, layout, per_param: bool, device: str) -> None:
        self.per_param = per_param
        if per_param:
            self.tensors = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=device) for s in layout.slots]
            self.named = {s.name: t for s, t in zip(layout.slots, self.tensors)}
        else:
            self.tensors = [torch.empty(n, dtype=torch.uint8, device=device) for n in layout.bucket_sizes]
            self.named = views(layout, self.tensors)


class BroadcastSender:
    def __init__(self, named_tensors: NamedTensors, num_receivers: int = 1, bucket_mb: float = 32.0,
                 per_param: bool = False, timeout_s: float = 120.0, device: str = "cpu",
                 host: str = "127.0.0.1", port: int | None = None, streams: int = 2) -> None:
        layout = plan_layout(named_tensors, int(bucket_mb * 2**20))
        self.timeout_s = timeout_s
        self.per_param = per_param
        self.device = device
        self.backend = "nccl" if device.startswith("cuda") else "gloo"
        if streams < 1:
            raise ValueError(f"sync.streams must be ≥ 1, got {streams}")
        self.streams = 1 if self.backend == "nccl" or per_param else streams
        port = port or free_port()
        # The group's name only tells one group's notices from another's (`owns`). A re-formed
        # group can get the port a dead one had (free_port hands a released port out again), so
        # the address alone would let a late notice of the old group pass for the new one's.
        self.spec = SyncSpec("broadcast", layout, {
            "host": host, "port": port, "group": f"{host}:{port}#{secrets.token_hex(4)}", "world": 1 + num_receivers,
            "per_param": per_param, "timeout_s": timeout_s, "backend": self.backend, "streams": self.streams,
        })
        if not per_param:  # two staging buffers: pack one while the other is on the wire
            biggest = max(layout.bucket_sizes)
            self._staging = [torch.empty(biggest, dtype=torch.uint8, device=device) for _ in range(2)]
        self._pg = None

    def connect(self) -> None:
        o = self.spec.options
        with trace.span("sync/connect"):
            self._pg, self._store = _group(0, o["world"], o["host"], o["port"], self.timeout_s, self.backend,
                                           self.streams)

    def send(self, named_tensors: NamedTensors, version: int, notify, checksum: str | None = None) -> dict[str, float]:
        if self._pg is None:
            raise RuntimeError("BroadcastSender.send() before connect()")
        t0 = time.perf_counter()
        notify(WeightsReady(version, "broadcast", 0, checksum, time.time(), group=self.spec.options["group"]))
        with trace.span("sync/broadcast", version=version):
            send = self._send_per_param if self.per_param else self._send_packed
            pack_s, messages = send(iter(named_tensors), version)
        total = time.perf_counter() - t0
        return {"sync/pack_s": pack_s, "sync/broadcast_s": total - pack_s,
                "sync/bytes": float(self.spec.layout.total_bytes), "sync/messages": float(messages)}

    def _fail(self, version: int):
        return lambda: _late_receivers(self._store, self.spec.options["world"], version)

    def _send_packed(self, named, version: int) -> tuple[float, int]:
        """Bucket by bucket, in layout order; returns (seconds spent packing, messages).

        A bucket whose tensors already sit in one buffer exactly as the layout places them goes
        out straight from that buffer: a trainer whose parameters live in the buckets
        (``allocate_in_buckets``), or one tensor that fills its bucket (a tensor larger than
        ``bucket_mb`` gets a bucket of its own). Copying would only cost CPU time, which the
        wire is short of on a busy machine."""
        layout, fail = self.spec.layout, self._fail(version)
        in_flight: dict[int, tuple] = {}  # staging buffer (or -1 - bucket for a direct send) -> (work, tensor)
        pack_s = 0.0
        for b, size in enumerate(layout.bucket_sizes):
            slots = bucket_views(layout, b, self._staging[b % 2][:size])
            incoming = [(slot, dst, *next(named)) for slot, dst in slots]
            for slot, _, name, tensor in incoming:
                if name != slot.name or tuple(tensor.shape) != slot.shape:
                    raise ValueError(f"tensor {name!r} {tuple(tensor.shape)} arrives where the agreed weight "
                                     f"layout has {slot.name!r} {slot.shape}")
            tensors = [t.detach().to(self.device) for _, _, _, t in incoming]
            raw = in_place_bytes(layout, b, tensors)
            if raw is not None:
                in_flight[-1 - b] = (_broadcast_striped(self._pg, raw, self.streams), raw)
                continue
            if b % 2 in in_flight:  # this staging buffer's previous bucket must be out
                _wait_all(in_flight.pop(b % 2)[0], f"version {version}", self.timeout_s, fail)
            t = time.perf_counter()
            for (_, dst, _, _), tensor in zip(incoming, tensors):
                dst.copy_(tensor)
            pack_s += time.perf_counter() - t
            in_flight[b % 2] = (_broadcast_striped(self._pg, self._staging[b % 2][:size], self.streams), None)
        if next(named, None) is not None:
            raise ValueError("more tensors than the agreed weight layout holds")
        _wait_all([w for works, _ in in_flight.values() for w in works], f"version {version}", self.timeout_s, fail)
        return pack_s, len(layout.bucket_sizes)

    def _send_per_param(self, named, version: int) -> tuple[float, int]:
        """The baseline packing is measured against: a loop over the parameters, one blocking
        broadcast each, straight from the trainer's tensors."""
        n = 0
        for slot, (name, tensor) in zip(self.spec.layout.slots, named):
            if name != slot.name:
                raise ValueError(f"tensor {name!r} arrives where the agreed weight layout has {slot.name!r}")
            work = _broadcast(self._pg, tensor.detach().to(self.device).contiguous())
            _wait_all([work], f"version {version}", self.timeout_s, self._fail(version))
            n += 1
        return 0.0, n

    def close(self) -> None:
        self._pg = None


class BroadcastReceiver:
    collective = True  # the sender waits for every receiver in every broadcast

    def __init__(self, spec: SyncSpec, receiver_index: int = 0, device: str = "cpu") -> None:
        self.spec = spec
        self.rank = 1 + receiver_index
        self._buf = _Buffers(spec.layout, spec.options["per_param"], device)
        self._pg = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._recv_s = 0.0

    def connect(self) -> None:
        o = self.spec.options
        self._pg, self._store = _group(self.rank, o["world"], o["host"], o["port"], o["timeout_s"], o["backend"],
                                       o.get("streams", 1))

    def _receive(self, version: int) -> None:
        t0 = time.perf_counter()
        try:
            self._store.set(f"began/{self.rank}", str(version).encode())
            what, timeout_s = f"version {version} from the trainer (rank 0)", self.spec.options["timeout_s"]
            with trace.span("sync/receive", version=version):
                if self._buf.per_param:  # the baseline: one blocking receive per tensor, as a loop does
                    for t in self._buf.tensors:
                        _wait_all([_broadcast(self._pg, t)], what, timeout_s)
                else:
                    streams = self.spec.options.get("streams", 1)
                    works = [w for t in self._buf.tensors for w in _broadcast_striped(self._pg, t, streams)]
                    _wait_all(works, what, timeout_s)
            self._store.set(f"done/{self.rank}", str(version).encode())
        except BaseException as e:  # noqa: BLE001 - surfaced to the engine loop by ready()
            self._error = e
        self._recv_s = time.perf_counter() - t0

    def begin(self, msg: WeightsReady) -> None:
        self._error = None
        self._thread = threading.Thread(target=self._receive, args=(msg.version,), daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        if self._thread is None or self._thread.is_alive():
            return False
        if self._error is not None:
            raise self._error
        return True

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def latest(self, version: int) -> WeightsReady | None:
        """A broadcast cannot be replayed to a late joiner: nothing newer to load at attach."""
        return None

    def tensors(self) -> dict[str, torch.Tensor]:
        return self._buf.named

    def done(self, msg: WeightsReady) -> dict[str, float]:
        self._thread = None
        return {"sync/receive_s": self._recv_s}

    def close(self) -> None:
        self._pg = None

"""Weight sync by torch.distributed broadcast, packed into preallocated buckets.

The sender (trainer rank 0) and the receivers (engines, ranks 1..M) form a standalone process
group of their own — built from a TCP store, not the default group — so it coexists with the
trainer's FSDP group. Gloo carries it on CPU, NCCL on GPU. Weights travel as a few large flat
buckets (``bucket_mb`` each) instead of one message per parameter: per-message latency, not
bandwidth, dominates small models. ``per_param=True`` sends one message per tensor, for
comparison (``tokenflow bench sync``).

Receivers run the receive in a background thread so the engine keeps decoding; the engine swaps
the weights in between two decode steps once ``ready()``.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time

import torch
import torch.distributed as dist

from tokenflow.metrics import trace
from tokenflow.sync.base import NamedTensors, SyncSpec, WeightsReady
from tokenflow.sync.layout import pack, plan_layout, views


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(rank: int, world: int, host: str, port: int, timeout_s: float, backend: str):
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, is_master=(rank == 0), timeout=timeout)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts), store
    return dist.ProcessGroupGloo(store, rank, world, timeout), store


def _broadcast_all(pg, tensors: list[torch.Tensor], what: str, timeout_s: float) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    works = [pg.broadcast([t], opts) for t in tensors]
    try:
        for w in works:
            w.wait()
    except RuntimeError as e:
        raise TimeoutError(f"weight broadcast ({what}) failed or timed out after {timeout_s:g}s: "
                           f"a peer did not answer ({e})") from None


class _Buffers:
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
                 host: str = "127.0.0.1", port: int | None = None) -> None:
        layout = plan_layout(named_tensors, int(bucket_mb * 2**20))
        self.timeout_s = timeout_s
        self.backend = "nccl" if device.startswith("cuda") else "gloo"
        self.spec = SyncSpec("broadcast", layout, {
            "host": host, "port": port or free_port(), "world": 1 + num_receivers,
            "per_param": per_param, "timeout_s": timeout_s, "backend": self.backend,
        })
        self._buf = _Buffers(layout, per_param, device)
        self._pg = None

    def connect(self) -> None:
        o = self.spec.options
        with trace.span("sync/connect"):
            self._pg, self._store = _group(0, o["world"], o["host"], o["port"], self.timeout_s, self.backend)

    def send(self, named_tensors: NamedTensors, version: int, notify, checksum: str | None = None) -> dict[str, float]:
        if self._pg is None:
            raise RuntimeError("BroadcastSender.send() before connect()")
        t0 = time.perf_counter()
        with trace.span("sync/pack", version=version):
            if self._buf.per_param:
                for name, t in named_tensors:
                    self._buf.named[name].copy_(t.detach())
            else:
                pack(self.spec.layout, named_tensors, self._buf.tensors)
        t1 = time.perf_counter()
        notify(WeightsReady(version, "broadcast", 0, checksum, time.time()))
        with trace.span("sync/broadcast", version=version, messages=len(self._buf.tensors)):
            _broadcast_all(self._pg, self._buf.tensors, f"version {version}", self.timeout_s)
        t2 = time.perf_counter()
        return {"sync/pack_s": t1 - t0, "sync/broadcast_s": t2 - t1,
                "sync/bytes": float(self.spec.layout.total_bytes),
                "sync/messages": float(len(self._buf.tensors))}

    def close(self) -> None:
        self._pg = None


class BroadcastReceiver:
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
        self._pg, self._store = _group(self.rank, o["world"], o["host"], o["port"], o["timeout_s"], o["backend"])

    def _receive(self, version: int) -> None:
        t0 = time.perf_counter()
        try:
            with trace.span("sync/receive", version=version):
                _broadcast_all(self._pg, self._buf.tensors, f"version {version} from the trainer (rank 0)",
                               self.spec.options["timeout_s"])
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

    def tensors(self) -> dict[str, torch.Tensor]:
        return self._buf.named

    def done(self, msg: WeightsReady) -> dict[str, float]:
        self._thread = None
        return {"sync/receive_s": self._recv_s}

    def close(self) -> None:
        self._pg = None

"""Weight sync through POSIX shared memory: one machine, no copies through pipes.

The sender owns two slots (double buffering), each one flat segment holding every tensor at a
fixed offset, plus a small control block. Version v goes to slot ``v % 2``; before overwriting a
slot the sender waits until every receiver has acknowledged the version it last held there, so a
reader never sees torn weights while the trainer can run one update ahead of the slowest engine.
With one slot (``sync.slots = 1``) the weights take half the shared memory and the sender waits
for every receiver to have loaded version v before it writes v + 1: free where a step takes far
longer than a load (a laptop: tens of seconds against a fraction of one), a stall where it does not.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from multiprocessing import shared_memory

import numpy as np
import torch

from tokenflow.metrics import trace
from tokenflow.sync.base import NamedTensors, SyncSpec, WeightsReady
from tokenflow.sync.layout import pack, plan_layout, views
from tokenflow.sync.names import shm_prefix

SLOTS = 2  # the default: double buffering


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing segment without registering it with this process's resource tracker.
    The sender owns the segments; before Python 3.13 every attach registers too, and a process
    with its own tracker (a Ray actor) would have the trainer's segments unlinked when it dies."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    from multiprocessing import resource_tracker

    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


def _bytes_view(shm: shared_memory.SharedMemory, size: int) -> torch.Tensor:
    return torch.frombuffer(shm.buf, dtype=torch.uint8, count=size) if size else torch.empty(0, dtype=torch.uint8)


class SlotAbandoned(RuntimeError):
    """The sender gave up waiting for a slot because ``abandon()`` said the run is gone."""


class SharedMemorySender:
    def __init__(self, named_tensors: NamedTensors, num_receivers: int = 1, timeout_s: float = 120.0,
                 slots: int = SLOTS, abandon: Callable[[], bool] | None = None) -> None:
        if slots not in (1, 2):
            raise ValueError(f"shared-memory weight sync takes 1 or 2 slots, not {slots}")
        layout = plan_layout(named_tensors)
        # Named after the run (tokenflow.sync.names): a killed run's segments are found and
        # removed when it resumes.
        tag = f"{shm_prefix()}_{uuid.uuid4().hex[:8]}"
        size = max(1, layout.total_bytes)
        self._slots = [shared_memory.SharedMemory(name=f"{tag}_{i}", create=True, size=size) for i in range(slots)]
        # control[slot] = [version written, version acked by receiver 0, receiver 1, ...]
        self._ctl_shm = shared_memory.SharedMemory(name=f"{tag}_ctl", create=True,
                                                   size=8 * slots * (1 + num_receivers))
        self._ctl = np.ndarray((slots, 1 + num_receivers), dtype=np.int64, buffer=self._ctl_shm.buf)
        self._ctl[:] = -1
        self._buckets = [[_bytes_view(s, layout.total_bytes)] for s in self._slots]
        self.timeout_s = timeout_s
        # Asked about once a second while waiting for a slot: a trainer whose orchestrator was
        # killed must not wait out ``timeout_s`` for engines that exited with it.
        self.abandon = abandon
        self.spec = SyncSpec("shared_memory", layout, {
            "slots": [s.name for s in self._slots], "control": self._ctl_shm.name,
            "num_receivers": num_receivers,
        })

    def connect(self) -> None:
        """Nothing to wait for: receivers attach to the segments by name."""

    def send(self, named_tensors: NamedTensors, version: int, notify, checksum: str | None = None) -> dict[str, float]:
        slot = version % len(self._slots)
        t0 = time.perf_counter()
        with trace.span("sync/wait_slot", version=version):
            now = time.monotonic()
            deadline, ask_at = now + self.timeout_s, now + 1.0
            while (self._ctl[slot, 1:] < self._ctl[slot, 0]).any():
                now = time.monotonic()
                if self.abandon is not None and now > ask_at:
                    ask_at = now + 1.0
                    if self.abandon():
                        raise SlotAbandoned(f"stopped waiting for weight slot {slot} (version "
                                            f"{int(self._ctl[slot, 0])}): the run is gone")
                if now > deadline:
                    late = [i for i, a in enumerate(self._ctl[slot, 1:]) if a < self._ctl[slot, 0]]
                    raise TimeoutError(
                        f"engine(s) {late} did not release weight slot {slot} (version "
                        f"{int(self._ctl[slot, 0])}) within {self.timeout_s:g}s")
                time.sleep(0.0005)
        t1 = time.perf_counter()
        with trace.span("sync/pack", version=version):
            pack(self.spec.layout, named_tensors, self._buckets[slot])
        self._ctl[slot, 0] = version
        t2 = time.perf_counter()
        notify(WeightsReady(version, "shared_memory", slot, checksum, time.time()))
        return {"sync/wait_slot_s": t1 - t0, "sync/pack_s": t2 - t1,
                "sync/bytes": float(self.spec.layout.total_bytes)}

    def close(self) -> None:
        self._buckets = []
        for shm in [*self._slots, self._ctl_shm]:
            try:
                shm.close()
                shm.unlink()
            except (FileNotFoundError, BufferError):
                pass


class SharedMemoryReceiver:
    collective = False  # each engine reads the newest slot on its own

    def __init__(self, spec: SyncSpec, receiver_index: int = 0) -> None:
        self.spec = spec
        self.index = receiver_index
        opts = spec.options
        self._slots = [_attach(n) for n in opts["slots"]]
        self._ctl_shm = _attach(opts["control"])
        self._ctl = np.ndarray((len(self._slots), 1 + opts["num_receivers"]), dtype=np.int64, buffer=self._ctl_shm.buf)
        self._views = [views(spec.layout, [_bytes_view(s, spec.layout.total_bytes)]) for s in self._slots]
        self._msg: WeightsReady | None = None

    def connect(self) -> None:
        """Attached in the constructor already."""

    def busy(self) -> bool:
        return False  # nothing runs in the background

    def begin(self, msg: WeightsReady) -> None:
        if int(self._ctl[msg.slot, 0]) != msg.version:
            raise RuntimeError(f"shared-memory slot {msg.slot} holds version {int(self._ctl[msg.slot, 0])}, "
                               f"expected {msg.version}: sender and receiver are out of step")
        self._msg = msg

    def ready(self) -> bool:
        return self._msg is not None

    def latest(self, version: int) -> WeightsReady | None:
        """For an engine that (re)attaches mid-run holding ``version``: a notice for the newest
        version in the slots if that is newer, else None. A restarted engine inherits the
        acknowledgements its predecessor never sent, so every slot it will not read is released
        here; the newest is released by ``done`` once loaded (the sender only rewrites it two
        versions later, after that acknowledgement)."""
        n = len(self._slots)
        written = [int(self._ctl[s, 0]) for s in range(n)]
        newest = max(range(n), key=lambda s: written[s])
        load = written[newest] > version
        for s in range(n):
            if not (load and s == newest):
                self._ctl[s, 1 + self.index] = max(int(self._ctl[s, 1 + self.index]), written[s])
        return WeightsReady(written[newest], "shared_memory", newest, sent_at=time.time()) if load else None

    def tensors(self) -> dict[str, torch.Tensor]:
        assert self._msg is not None, "tensors() before begin()"
        return self._views[self._msg.slot]

    def done(self, msg: WeightsReady) -> dict[str, float]:
        # Never lowers an acknowledgement: a notice dropped late may be older than one loaded.
        self._ctl[msg.slot, 1 + self.index] = max(int(self._ctl[msg.slot, 1 + self.index]), msg.version)
        self._msg = None
        return {}

    def close(self) -> None:
        self._views = []
        for shm in [*self._slots, self._ctl_shm]:
            try:
                shm.close()
            except BufferError:
                pass

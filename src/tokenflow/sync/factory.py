"""The one place a transport is chosen: ``transport`` (the trainer) or ``spec.transport`` (an
engine) to a sender or receiver. Each transport's module is imported only when it is chosen."""

from __future__ import annotations

from tokenflow.sync.base import NamedTensors, SyncSpec, WeightReceiver, WeightSender


def make_sender(transport: str, named_tensors: NamedTensors, **options) -> WeightSender:
    if transport == "shared_memory":
        from tokenflow.sync.shared_memory import SharedMemorySender

        return SharedMemorySender(named_tensors, **options)
    if transport == "broadcast":
        from tokenflow.sync.broadcast import BroadcastSender

        return BroadcastSender(named_tensors, **options)
    raise ValueError(f"unknown sync transport {transport!r}; choose shared_memory or broadcast")


def make_receiver(spec: SyncSpec, **options) -> WeightReceiver:
    if spec.transport == "shared_memory":
        from tokenflow.sync.shared_memory import SharedMemoryReceiver

        return SharedMemoryReceiver(spec, **options)
    if spec.transport == "broadcast":
        from tokenflow.sync.broadcast import BroadcastReceiver

        return BroadcastReceiver(spec, **options)
    raise ValueError(f"unknown sync transport {spec.transport!r}")

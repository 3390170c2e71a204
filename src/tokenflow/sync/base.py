"""Weight sync from trainer to engines: one small interface, several transports
(built by ``tokenflow.sync.factory``).

The trainer holds a ``WeightSender``, each engine a ``WeightReceiver``; they agree at start on a
``SyncSpec`` that the sender builds (layout, shared-memory names or a rendezvous address) and the
runtime forwards to the engines. An update is:

1. ``sender.send(named_tensors, version, notify)`` — the sender packs the weights and calls
   ``notify(WeightsReady)``, which the runtime delivers to the engines' command queues;
2. the engine loop calls ``receiver.begin(msg)`` when it reads the message, keeps decoding while
   ``receiver.ready()`` is false (a broadcast lands in a background thread), then loads
   ``receiver.tensors()`` between two decode steps and calls ``receiver.done(msg)``.

Every phase is timed; the timings come back as flat ``sync/...`` metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from tokenflow.sync.layout import WeightLayout

if TYPE_CHECKING:  # the orchestrator unpickles a SyncSpec (and forwards it) without loading torch
    import torch

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]


@dataclass(frozen=True)
class WeightsReady:
    """Sender → engine: the weights of ``version`` are ready to be loaded."""

    version: int
    transport: str
    slot: int = 0
    checksum: str | None = None
    sent_at: float = 0.0
    group: str = ""
    """The sender's group (a broadcast group's address), so that a receiver of a re-formed group
    can tell a notice of the old one (delivered late to a restarted engine) from its own; empty
    where the transport tells its own apart (shared memory checks the slot's version)."""


@dataclass(frozen=True)
class SyncSpec:
    """What a receiver needs to attach to a sender; built by the sender, picklable."""

    transport: str
    layout: WeightLayout
    options: dict = field(default_factory=dict)


class WeightSender(Protocol):
    spec: SyncSpec

    def connect(self) -> None:
        """Called once after ``spec`` reached every receiver; blocks until all have attached."""
        ...

    def send(self, named_tensors: NamedTensors, version: int,
             notify: Callable[[WeightsReady], None], checksum: str | None = None) -> dict[str, float]:
        """Called by the trainer after an optimizer step when a sync is due; returns timings."""
        ...

    def close(self) -> None:
        """Called once when the trainer shuts down; frees buffers and groups."""
        ...


def owns(spec: SyncSpec, msg: WeightsReady) -> bool:
    """Whether ``msg`` announces a transfer of the sync ``spec`` describes."""
    return not msg.group or msg.group == spec.options.get("group", "")


class WeightReceiver(Protocol):
    spec: SyncSpec
    """What it attached to (a notice whose ``group`` is another's is not for it: `owns`)."""
    collective: bool
    """True when every receiver must take part in every transfer (a broadcast): the engine then
    receives even an update it is already past, and discards it."""

    def connect(self) -> None:
        """Called once by the engine at start, after building the receiver from the spec."""
        ...

    def begin(self, msg: WeightsReady) -> None:
        """Called by the engine loop when it reads ``msg``; may start a background receive."""
        ...

    def ready(self) -> bool:
        """Polled between decode steps; true once the weights can be loaded."""
        ...

    def tensors(self) -> dict[str, torch.Tensor]:
        """The received weights by Hugging Face name (views; load them before ``done``)."""
        ...

    def done(self, msg: WeightsReady) -> dict[str, float]:
        """Called after the engine loaded the weights; frees the buffers; returns timings."""
        ...

    def close(self) -> None:
        ...

    def busy(self) -> bool:
        """True while a transfer still runs in the background (after ``close`` too)."""
        ...

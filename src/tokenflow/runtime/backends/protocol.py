"""The surface every backend gives the orchestrator, typed: ``Backend`` (where the workers run)
and ``Worker`` (one worker's handle).

The orchestrator and its helpers are written against these two protocols only; the local and Ray
backends subclass ``Backend``, and a test checks that each defines every member itself (a
Protocol's own bodies do nothing, so a forgotten method would otherwise fail silently mid-run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Worker(Protocol):
    """One worker process (engine or trainer rank) as the orchestrator sees it."""

    name: str
    pid: int | None
    load: int  # samples in flight on this engine, kept by the orchestrator for routing
    accepting: bool  # False while a joining engine has not loaded the current weights

    def send(self, msg) -> None:
        """Put one command on the worker's queue; never blocks on the worker."""


class Backend(Protocol):
    """Where the workers run: spawned processes (``local``) or Ray actors (``ray``)."""

    engines: list[Worker]
    trainer: Worker  # rank 0: the one the orchestrator talks to
    restarts_engines: bool  # a dead engine comes back (WorkerRestarted) instead of failing the run
    engines_start_unattached: bool  # engines generate with version 0 before the trainer is up
    trainer_start_step: int  # the step this run's trainer started from (0, or a resume's)

    @property
    def all_workers(self) -> list[Worker]:
        """Every worker, engines and trainer ranks."""

    def recv(self, timeout: float):
        """The next ``Envelope`` from any worker, or None after ``timeout`` seconds."""

    def broadcast(self, msg) -> None:
        """``msg`` to every engine."""

    def check(self) -> None:
        """Raise ``WorkerDied`` for a worker that died (the healer may replace it)."""

    def replace_engine(self, name: str) -> int:
        """A new process for engine ``name``; its index in ``engines``."""

    def replace_trainer(self, checkpoint: Path | None = None) -> None:
        """New trainer rank(s), restored from ``checkpoint`` (None: where this run started)."""

    def locked_engines(self) -> list[str]:
        """Engines whose command queue a killed trainer left locked."""

    def lend_trainer_threads(self, lend: bool = True) -> None:
        """The trainer is idle (waiting for a batch, or done): its CPU threads go to the engines;
        ``lend=False`` gives them back before it trains."""

    def shutdown(self) -> None:
        """Stop every worker and release what the backend holds."""

"""Wall-clock marks of where a run's time goes outside its training window.

Each process keeps its own marks (``mark(name)``: seconds since the epoch, the latest call of a
name wins). The orchestrator's process collects the workers' marks (sent with ``WorkerBooted``)
and writes them all to ``summary.json`` under ``"phases"``, as seconds since this process started
(``process_start()``), so that ``tokenflow bench startup`` can lay them out against the process's
wall time, which it measures from outside.

Standard library only: it is imported by the command line before anything heavy.
"""

from __future__ import annotations

import os
import time

_marks: dict[str, float] = {}


def mark(name: str, t: float | None = None) -> float:
    """Record that ``name`` happened now (or at epoch time ``t``); returns the time."""
    t = time.time() if t is None else t
    _marks[name] = t
    return t


def marks() -> dict[str, float]:
    return dict(_marks)


def worker_marks(name: str) -> dict[str, float]:
    """A worker's marks to send home, with its process's start as ``<name>/started``."""
    start = process_start()
    return {**({f"{name}/started": start} if start is not None else {}), **_marks}


def reset(keep: tuple[str, ...] = ()) -> None:
    """Forget the marks (of an earlier run in this process), but those named in ``keep``."""
    for name in [k for k in _marks if k not in keep]:
        del _marks[name]


def process_start(pid: int | None = None) -> float | None:
    """When process ``pid`` (default: this one) started, in seconds since the epoch; None where
    ``/proc`` cannot tell (not Linux)."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5): start time in clock ticks after boot
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def relative(extra: dict[str, float] | None = None) -> dict[str, float]:
    """This process's marks and ``extra`` ones, as seconds after this process started (after the
    earliest mark where the start is unknown), in time order."""
    every = {**_marks, **(extra or {})}
    origin = process_start()
    if origin is None:
        origin = min(every.values(), default=time.time())
    return {k: round(v - origin, 3) for k, v in sorted(every.items(), key=lambda kv: kv[1])}

"""Timeline tracing in Chrome trace-event format (opens in Perfetto / chrome://tracing).

Every process calls :func:`configure` once with its own file and name; instrumented code wraps
work in ``with span("engine/decode", seqs=n): ...``. When tracing is off (the default) a span is
a shared no-op object, so instrumentation costs one attribute lookup and one branch.

Events are buffered in memory and appended to ``<dir>/<process>-<pid>.jsonl`` (one JSON event
per line) every ``flush_every`` events, every ``flush_interval_s`` seconds and at exit (including
a multiprocessing worker's exit on SIGTERM); :func:`merge` joins the per-process files into one
``trace.json``. Timestamps are wall-clock microseconds so spans from different processes line
up on one axis. Serialisation happens only at flush time, so the cost on the hot path is one
dict and one list append per event. Every flush also writes the counter ``trace/self_s``: the
seconds this process has spent building, buffering and writing events, i.e. the trace's own
overhead, which ``tokenflow report`` states.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tokenflow.metrics.safe_files import open_text, write_atomic


class _Tracer:
    def __init__(self, path: Path, process_name: str, flush_every: int = 2000,
                 flush_interval_s: float = 10.0) -> None:
        self.path = path
        self.dir = path.parent
        self.pid = os.getpid()
        self.process_name = process_name
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self.last_flush = time.monotonic()
        self.events: list[dict] = []
        # The tracer's own cost in this process (building, buffering and writing events), written
        # with every flush as the counter "trace/self_s", so a trace states its own overhead.
        self.self_s = 0.0
        self.num_events = 0
        # Re-entrant: a worker's SIGTERM handler may flush while this thread is inside _emit.
        self.lock = threading.RLock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._emit({"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0,
                    "args": {"name": process_name}}, time.perf_counter())
        atexit.register(self.flush)
        # multiprocessing workers leave through os._exit (atexit skipped) after running these.
        from multiprocessing import util

        util.Finalize(None, self.flush, exitpriority=100)

    def _emit(self, event: dict, t0: float) -> None:
        """Buffer ``event`` (built from ``t0``, a perf_counter reading, on) and flush if due."""
        with self.lock:
            self.events.append(event)
            self.num_events += 1
            n = len(self.events)
        self.self_s += time.perf_counter() - t0
        if n >= self.flush_every or time.monotonic() - self.last_flush > self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        t0 = time.perf_counter()
        with self.lock:
            events, self.events = self.events, []
            self.last_flush = time.monotonic()
        if not events:
            return
        with open_text(self.path, "a") as f:
            f.writelines(json.dumps(e, separators=(",", ":"), default=str) + "\n" for e in events)
            self.self_s += time.perf_counter() - t0
            f.write(json.dumps({"name": "trace/self_s", "ph": "C", "ts": time.time() * 1e6, "pid": self.pid,
                                "tid": 0, "args": {"self_s": self.self_s, "events": self.num_events}}) + "\n")

    def complete(self, name: str, start_s: float, dur_s: float, args: dict | None) -> None:
        t0 = time.perf_counter()
        ev = {"name": name, "ph": "X", "ts": start_s * 1e6, "dur": dur_s * 1e6,
              "pid": self.pid, "tid": threading.get_ident() % 1_000_000, "cat": name.split("/", 1)[0]}
        if args:
            ev["args"] = args
        self._emit(ev, t0)

    def counter(self, name: str, values: dict) -> None:
        t0 = time.perf_counter()
        self._emit({"name": name, "ph": "C", "ts": time.time() * 1e6, "pid": self.pid,
                    "tid": 0, "args": values}, t0)

    def thread_name(self, pid: int, tid: int, name: str) -> None:
        self._emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}},
                   time.perf_counter())


_tracer: _Tracer | None = None


def configure(trace_dir: str | os.PathLike | None, process_name: str, **options) -> None:
    """Turn tracing on for this process (``trace_dir`` set) or off (``None``).

    ``options`` go to the tracer: ``flush_every`` (events) and ``flush_interval_s``.
    """
    global _tracer
    if _tracer is not None:
        _tracer.flush()
    if trace_dir is None:
        _tracer = None
        return
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in process_name)
    _tracer = _Tracer(Path(trace_dir) / f"{safe}-{os.getpid()}.jsonl", process_name, **options)


def enabled() -> bool:
    return _tracer is not None


def trace_dir() -> Path | None:
    """The folder this process traces into (to hand to child processes), or None when off."""
    return _tracer.dir if _tracer is not None else None


class _Span:
    __slots__ = ("args", "name", "start")

    def __init__(self, name: str, args: dict) -> None:
        self.name = name
        self.args = args

    def __enter__(self) -> _Span:
        self.start = time.time()
        return self

    def __exit__(self, *exc) -> None:
        tracer = _tracer
        if tracer is not None:
            tracer.complete(self.name, self.start, time.time() - self.start, self.args)


class _NoSpan:
    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc) -> None:
        return None


_NO_SPAN = _NoSpan()


def span(name: str, **args):
    """Context manager recording a complete ("X") event named ``name`` (``category/what``)."""
    if _tracer is None:
        return _NO_SPAN
    return _Span(name, args)


def record(name: str, start_s: float, dur_s: float, **args) -> None:
    """Record a span measured elsewhere (start in ``time.time()`` seconds)."""
    if _tracer is not None:
        _tracer.complete(name, start_s, dur_s, args)


def record_on(name: str, start_s: float, dur_s: float, pid: int, tid: int, **args) -> None:
    """Record a span on another process's or a named thread's track (e.g. the trainer's idle
    time, which only the orchestrator sees); name the track once with :func:`name_thread`."""
    if _tracer is not None:
        t0 = time.perf_counter()
        _tracer._emit({"name": name, "cat": name.split("/", 1)[0], "ph": "X", "ts": start_s * 1e6,
                       "dur": dur_s * 1e6, "pid": pid, "tid": tid, "args": args}, t0)


def name_thread(pid: int, tid: int, name: str) -> None:
    """Give a track (pid, tid) a name in the viewer."""
    if _tracer is not None:
        _tracer.thread_name(pid, tid, name)


def counter(name: str, **values: float) -> None:
    """Record a counter sample (a line in the trace viewer), e.g. buffer fill."""
    if _tracer is not None:
        _tracer.counter(name, values)


def add_self_time(seconds: float) -> None:
    """Count time spent on tracing outside the tracer (e.g. the orchestrator's wait bookkeeping)
    in this process's "trace/self_s"."""
    if _tracer is not None:
        _tracer.self_s += seconds


def flush() -> None:
    if _tracer is not None:
        _tracer.flush()


def merge(trace_dir: str | os.PathLike, out_path: str | os.PathLike) -> int:
    """Join every per-process ``*.jsonl`` under ``trace_dir`` into one trace-event JSON file."""
    from tokenflow.metrics.sinks import read_jsonl  # skips the torn line of a killed process

    events = [e for f in sorted(Path(trace_dir).glob("*.jsonl")) for e in read_jsonl(f)]
    write_atomic(out_path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return len(events)


@contextmanager
def suspended():
    """Temporarily disable tracing (e.g. while measuring tracing overhead)."""
    global _tracer
    saved, _tracer = _tracer, None
    try:
        yield
    finally:
        _tracer = saved

"""A worker's own stdout and stderr, turned into log records.

Whatever a worker writes straight to its file descriptors 1 and 2 (a library's print or
warning, a C++ extension's message, a user's reward function printing) would land on the
terminal wherever the parent's cursor happens to be, and tear its live view: the bar's next
refresh redraws below the stray text and leaves a stale copy above it. So a worker whose logs
are forwarded points both descriptors at pipes, and a thread per pipe turns each line into a log
record on ``tokenflow.worker.output`` (stdout at INFO, stderr at WARNING), which the worker's
``QueueHandler`` sends to the parent like any other record. Python warnings become records too
(``logging.captureWarnings``).

A crash dump (``faulthandler``) is the exception: it goes to the real stderr, since a dying
process takes its reader threads with it and the dump would be lost.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import multiprocessing as mp
import os
import sys
import threading

log = logging.getLogger("tokenflow.worker.output")

MAX_LINE = 8192  # characters kept of one line: a stray binary dump must not make a megabyte record


def _clean(raw: bytes) -> str:
    # A carriage return rewrites the line in place (a progress bar): what the terminal would
    # show is the last piece.
    text = raw.decode("utf-8", errors="replace").split("\r")
    line = next((piece for piece in reversed(text) if piece.strip()), "").rstrip()
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " …"


class OutputCapture:
    """Descriptors 1 and 2 of this process redirected into log records until :meth:`close`."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        for fd, stream, level in ((1, "stdout", logging.INFO), (2, "stderr", logging.WARNING)):
            read_end, write_end = os.pipe()
            self._saved[fd] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)  # descriptor fd is now the pipe's only writer: restoring it ends the pipe
            thread = threading.Thread(target=self._pump, args=(read_end, stream, level), daemon=True,
                                      name=f"tokenflow-{stream}-capture")
            thread.start()
            self._threads.append(thread)
        # At start-up the descriptors were a terminal, so Python buffered stdout by line; keep it so.
        for stream in (sys.stdout, sys.stderr):
            if stream is not None and hasattr(stream, "reconfigure"):
                stream.reconfigure(line_buffering=True)
        self._crash_file = os.fdopen(os.dup(self._saved[2]), "w")
        faulthandler.enable(file=self._crash_file)
        logging.captureWarnings(True)

    def _pump(self, read_end: int, stream: str, level: int) -> None:
        pending = b""
        with open(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    self._emit(raw, stream, level)
        if pending:
            self._emit(pending, stream, level)

    def _emit(self, raw: bytes, stream: str, level: int) -> None:
        line = _clean(raw)
        if line:
            log.log(level, "%s %s: %s", self.worker, stream, line)

    def close(self, timeout: float = 5.0) -> None:
        """Put the descriptors back and wait for the last lines to become records."""
        for stream in (sys.stdout, sys.stderr):
            # A stream the worker closed itself has nothing left to flush.
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes the pipe's write end: its reader sees the end
            os.close(saved)
        self._saved = {}
        for thread in self._threads:
            thread.join(timeout)
        logging.captureWarnings(False)


def capture_worker_output() -> OutputCapture:
    """Start capturing this worker's output, named after its process (``tokenflow-engine-0``
    reads ``engine-0``)."""
    return OutputCapture(mp.current_process().name.removeprefix("tokenflow-"))

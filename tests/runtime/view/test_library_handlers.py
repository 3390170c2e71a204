"""Log records print above the live view, not through it: a library's own stderr handler
(transformers keeps one, with propagation off), a Python warning, records from another thread
while the view changes height. A real pseudo-terminal, replayed into a terminal emulator."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import struct
import sys
import termios
import threading
import time

import pyte

from tokenflow.runtime.view.progress import Progress


def _terminal(monkeypatch):
    """An 80 × 24 pseudo-terminal as sys.stderr: (a thread reading all it is sent, the file the view
    writes to). Read as it is written: a full pty buffer would block the writer."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    terminal = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    raw = bytearray()

    def read():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's file closed
                break
            if not chunk:
                break
            raw.extend(chunk)
        os.close(master)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.raw = raw
    return reader, terminal


def _screen(reader, rows: int = 24) -> list[str]:
    """The non-blank lines of the screen, once everything written is replayed into an emulator
    (``rows`` tall: rich moves the cursor only relative to itself, so a taller screen keeps what
    scrolled off an 80 × 24 one)."""
    reader.join(timeout=10)
    screen = pyte.Screen(80, rows)
    pyte.ByteStream(screen).feed(bytes(reader.raw))
    return [line.rstrip() for line in screen.display if line.strip()]


def test_a_library_logger_with_its_own_handler_prints_above_the_bar(monkeypatch):
    master, terminal = _terminal(monkeypatch)
    library = logging.getLogger("some_library")
    own = logging.StreamHandler()  # bound to sys.stderr (the terminal) when the library loaded
    library.addHandler(own)
    library.propagate = False
    try:
        view = Progress(3, description="train")
        assert view.live
        view.update(1)
        time.sleep(0.6)  # a refresh (4 a second) draws the bar
        library.warning("a library's warning")
        view.update(2)
        time.sleep(0.6)
        view.close()
        assert library.handlers == [own]  # put back
    finally:
        library.removeHandler(own)
        terminal.close()
    lines = _screen(master)
    assert sum(line.startswith("train") for line in lines) == 1, lines
    assert sum("a library's warning" in line for line in lines) == 1, lines
    assert lines[-1].startswith("train") and "2/3" in lines[-1], lines


def test_a_python_warning_in_the_parent_prints_above_the_bar(monkeypatch):
    """warnings.showwarning writes to stderr itself; while the bar is live a warning must become a
    log record (printed above the bar), and the original showwarning comes back after."""
    import warnings

    master, terminal = _terminal(monkeypatch)
    root = logging.getLogger()
    cli = logging.StreamHandler()  # as the CLI sets up logging: bound to sys.stderr, the terminal
    root.addHandler(cli)
    before = warnings.showwarning
    try:
        view = Progress(3, description="train")
        assert view.live
        view.update(1)
        time.sleep(0.6)  # a refresh (4 a second) draws the bar
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a parent's warning", UserWarning, stacklevel=1)
        view.update(2)
        time.sleep(0.6)
        view.close()
        assert warnings.showwarning is before  # put back
    finally:
        root.removeHandler(cli)
        terminal.close()
    lines = _screen(master)
    assert sum(line.startswith("train") for line in lines) == 1, lines
    # the record (its message, then the warning's source line) sits above the bar, as a log line
    assert any("WARNING" in line and "UserWarning" in "".join(lines[k:k + 2]) for k, line in enumerate(lines[:-1])), lines
    assert lines[-1].startswith("train") and "2/3" in lines[-1], lines


def test_records_from_another_thread_while_the_view_changes_height(monkeypatch):
    """The workers' records print from the log forwarder's thread while the view refreshes and its
    height changes (the figures or status line comes and goes). A print that reads the view's height
    before a refresh and writes after it erases one line too few: a torn copy of the bar stays."""
    master, terminal = _terminal(monkeypatch)
    root = logging.getLogger()
    cli = logging.StreamHandler()
    root.addHandler(cli)
    worker = logging.getLogger("tokenflow.test_worker")
    level = root.level
    root.setLevel(logging.INFO)
    done = threading.Event()

    def forward():
        for i in range(300):
            worker.info("a worker's record %d", i)
            time.sleep(0.002)
        done.set()

    try:
        view = Progress(3, description="train")
        assert view.live
        sender = threading.Thread(target=forward)
        sender.start()
        toggles = 0
        while not done.is_set():  # the height changes between refreshes, as fast as they come
            view.status("evaluating" if toggles % 2 else None)
            view.refresh()
            toggles += 1
            time.sleep(0.001)  # let the sender take the lock
        sender.join()
        view.status(None)
        view.update(2)
        view.close()
    finally:
        root.removeHandler(cli)
        root.setLevel(level)
        terminal.close()
    lines = _screen(master, rows=2000)
    assert sum(line.startswith("train") for line in lines) == 1, "\n".join(lines)
    assert sum("a worker's record" in line for line in lines) == 300
    assert lines[-1].startswith("train") and "2/3" in lines[-1], lines

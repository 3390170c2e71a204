"""A library that keeps its own stderr handler (transformers does, with propagation off) prints
above the live view, not through it: a real pseudo-terminal, replayed into a terminal emulator."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import struct
import sys
import termios
import time

import pyte

from tokenflow.runtime.view.progress import Progress


def _terminal(monkeypatch):
    """An 80 × 24 pseudo-terminal as sys.stderr: (its master end, the file the view writes to)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    terminal = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    return master, terminal


def _screen(master) -> list[str]:
    """The non-blank lines of the screen, once everything written is replayed into an emulator."""
    raw = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    screen = pyte.Screen(80, 24)
    pyte.ByteStream(screen).feed(raw)
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

"""A worker's direct writes to stdout and stderr reach the parent as log records, never its
terminal (where they would tear the live view): a real spawned worker, a real LogForwarder."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import subprocess
import sys
import warnings

from tokenflow.runtime.workers.process import LogForwarder, WorkerHandle


def _noisy_worker() -> None:
    print("printed to stdout")
    sys.stderr.write("written to sys.stderr\n")
    os.write(2, b"written to descriptor 2\n")
    os.write(1, b"progress 10%\rprogress 100%\n")
    warnings.warn("a library's warning", UserWarning)
    subprocess.run(["sh", "-c", "echo from a child shell >&2"], check=True)
    sys.stdout.write("the last line, unflushed, without a newline")


def test_direct_output_becomes_records_and_never_reaches_the_terminal(capfd, caplog):
    caplog.set_level(logging.INFO)
    logs = LogForwarder(mp.get_context("spawn"))
    worker = WorkerHandle("engine-0", _noisy_worker, (), mp.get_context("spawn"), logs=logs).start()
    worker.process.join(60)
    assert worker.process.exitcode == 0
    logs.stop()

    terminal = capfd.readouterr()
    assert terminal.out == "" and terminal.err == "", terminal
    records = {(r.levelno, r.getMessage()) for r in caplog.records}
    expected = {
        (logging.INFO, "engine-0 stdout: printed to stdout"),
        (logging.WARNING, "engine-0 stderr: written to sys.stderr"),
        (logging.WARNING, "engine-0 stderr: written to descriptor 2"),
        (logging.INFO, "engine-0 stdout: progress 100%"),  # what the terminal would have shown
        (logging.WARNING, "engine-0 stderr: from a child shell"),
        (logging.INFO, "engine-0 stdout: the last line, unflushed, without a newline"),
    }
    assert expected <= records, records - expected
    assert any(r.name == "py.warnings" and "a library's warning" in r.getMessage() for r in caplog.records)

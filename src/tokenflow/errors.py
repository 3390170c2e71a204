"""Errors every layer may raise, so that none has to import a higher one to raise them.

* `ConfigError`: a config that cannot be used (a bad key, value or file; exit 2 too).
* `CheckpointError`: a checkpoint that cannot be written, or a run folder's file that does not
  read as what it should be (damaged or tampered with); exit 2 on resume.
* `InputError`: bad user input found before a run started (``tokenflow train`` exits 2 on it,
  printing the one-line message, which names the problem and the fix). `RunFolderError`, one
  kind of it: a folder that is not a tokenflow run folder, or holds a link where tokenflow writes.
* `WorkerDied`: a worker process (engine, trainer rank, scorer) ended while the run needed it.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad key and what would be valid."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the file and what to do."""


class InputError(ValueError):
    """Bad input found before the run started; the message names the problem and the fix."""


class RunFolderError(InputError):
    """A folder tokenflow will not write in as a run folder (no marker, a symbolic link inside);
    the message names the path, what is wrong and what to do."""


class WorkerDied(RuntimeError):
    """A worker process died; the message names it and how it ended. ``worker`` is its name
    ("engine0", "trainer", "scorer") where the raiser knows it, so the run can replace it
    (``runtime.max_worker_restarts``)."""

    def __init__(self, message: str, worker: str | None = None, *, cause: str | None = None,
                 peak_rss_gb: float | None = None) -> None:
        super().__init__(message)
        self.worker = worker
        # How it ended ("oom_killer", "sigkill", "signal", "exit_code") and its peak resident
        # memory, where the raiser knows them (tokenflow.runtime.workers.memory_watch).
        self.cause, self.peak_rss_gb = cause, peak_rss_gb

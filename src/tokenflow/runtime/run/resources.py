"""What a run holds outside its folder, named after the run so that it can be found again.

A process killed with SIGKILL runs no clean-up: the weight slots and control block in
``/dev/shm`` and the POSIX semaphores behind every ``multiprocessing`` queue and lock stay
behind (the resource tracker that would unlink them is killed with the process tree). Every such
object of a run is named with the run's tag (a hash of its folder's absolute path, so the same
across resumes), and a run that starts or resumes removes whatever carries its tag first.

That is safe only while no other process uses the same run folder, so the run also holds an
exclusive lock on ``<run>/.lock`` for as long as it lives (the kernel drops it when the process
dies, however it dies).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import logging
import multiprocessing.process as mp_process
import multiprocessing.synchronize as mp_sync
import os
from pathlib import Path

from tokenflow.metrics.safe_files import open_fd
from tokenflow.sync.names import RUN_TAG_ENV

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")


class RunInUse(RuntimeError):
    pass


def run_tag(run_dir: str | Path) -> str:
    return "tf" + hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]


def leftovers(tag: str) -> list[Path]:
    """The ``/dev/shm`` entries (segments and semaphores) that carry ``tag``."""
    if not SHM_DIR.is_dir():
        return []
    return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith((f"{tag}_", f"sem.{tag}-")))


def remove_leftovers(tag: str) -> int:
    n = 0
    for p in leftovers(tag):
        try:
            p.unlink()
            n += 1
        except FileNotFoundError:
            pass
    if n:
        log.info("removed %d shared-memory segment(s) and semaphore(s) a killed run left in %s", n, SHM_DIR)
    return n


def release_segments(tag: str) -> int:
    """Unlink the run's shared-memory segments once its workers are gone (a killed trainer never
    unlinks its weight slots), and tell the resource tracker, which would otherwise warn about them."""
    from multiprocessing import resource_tracker

    n = 0
    for p in leftovers(tag):
        if p.name.startswith("sem."):
            continue  # this process's own queues still hold theirs; they go at exit
        try:
            p.unlink()
            n += 1
        except FileNotFoundError:
            continue
        try:
            resource_tracker.unregister(f"/{p.name}", "shared_memory")
        except Exception:  # noqa: BLE001 - no tracker running: nothing to tell
            pass
    return n


def _tagged_name() -> str:
    """CPython's semaphore name (the process's semprefix and a random part): what a run's
    queues and locks are created under, so start-up can find a killed run's."""
    prefix = mp_process.current_process()._config["semprefix"]  # noqa: SLF001
    return f"{prefix}-{next(mp_sync.SemLock._rand)}"  # noqa: SLF001


@contextlib.contextmanager
def run_resources(run_dir: Path):
    """Hold the run's lock, clear what a killed run left, and name what this one creates after it."""
    lock_path = Path(run_dir) / ".lock"
    fd = open_fd(lock_path, "r+")  # never through a link: it is truncated and written below
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunInUse(f"run folder {run_dir} is in use by another tokenflow process (pid {holder}); "
                           "wait for it to finish or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        tag = run_tag(run_dir)
        # An earlier run of the same folder in this process (train, then resume, in one notebook)
        # may still own semaphores in unreachable cycles: collected now, their finalizers unlink
        # and unregister them. Removed below instead, each finalizer and the resource tracker
        # would later fail on the missing file and print a warning apiece at exit.
        gc.collect()
        remove_leftovers(tag)
        config = mp_process.current_process()._config  # noqa: SLF001 - the only hook for semaphore names
        old_prefix, old_env = config.get("semprefix"), os.environ.get(RUN_TAG_ENV)
        old_namer = mp_sync.SemLock.__dict__["_make_name"]
        config["semprefix"] = f"/{tag}"
        # joblib's loky backend (imported by scikit-learn, nltk, ... in a reward function) replaces
        # the class's namer process-wide with one that ignores semprefix; the run names its own.
        mp_sync.SemLock._make_name = staticmethod(_tagged_name)  # noqa: SLF001
        os.environ[RUN_TAG_ENV] = tag
        try:
            yield tag
        finally:
            mp_sync.SemLock._make_name = old_namer  # noqa: SLF001
            config["semprefix"] = old_prefix
            if old_env is None:
                os.environ.pop(RUN_TAG_ENV, None)
            else:
                os.environ[RUN_TAG_ENV] = old_env
    finally:
        os.close(fd)  # releases the lock

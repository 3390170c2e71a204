"""A per-run pids cgroup: the one process cap that binds root too, and the list of every
process of the run, which is how the parent makes sure none outlives it.

RLIMIT_NPROC is not applied to root, and scorers often run as root in containers, so where the
pids controller is writable (cgroup v1 ``/sys/fs/cgroup/pids`` or a v2 hierarchy offering
``pids``) each program gets its own cgroup with ``pids.max``. Where it is not, ``create``
returns None and the layer is reported missing (the pid namespace then reaps the processes).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def _pids_root() -> Path | None:
    v1, v2 = _ROOTS
    if (v1 / "cgroup.procs").exists():
        return v1
    controllers = v2 / "cgroup.subtree_control"
    if controllers.exists() and "pids" in controllers.read_text().split():
        return v2
    return None


@dataclass
class PidsCgroup:
    path: str

    @classmethod
    def create(cls, max_pids: int, name: str | None = None) -> "PidsCgroup | None":
        """``name``: the run's work dir name, so a leftover could be traced to its run."""
        root = _pids_root()
        if root is None or not os.access(root, os.W_OK):
            return None
        path = root / (name or f"tokenflow-sandbox-{uuid.uuid4().hex[:12]}")
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
            return None
        return cls(str(path))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in Path(self.path, "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process still in the group until it is empty (pids.max bounds how many
        a fork bomb can add meanwhile); cgroup v2's cgroup.kill does it in one write."""
        kill_file = Path(self.path, "cgroup.kill")
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            if kill_file.exists():
                try:
                    kill_file.write_text("1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        """rmdir once the group is empty (the kernel frees killed tasks shortly after)."""
        for _ in range(250):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)

"""A per-run pids cgroup: the one process cap that binds root too.

RLIMIT_NPROC is not applied to root, and scorers often run as root in containers, so where the
pids controller is writable (cgroup v1 ``/sys/fs/cgroup/pids`` or a v2 hierarchy offering
``pids``) each program gets its own cgroup with ``pids.max``. Where it is not, ``create``
returns None and the layer is reported missing.
"""

from __future__ import annotations

import os
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
    def create(cls, max_pids: int) -> "PidsCgroup | None":
        root = _pids_root()
        if root is None or not os.access(root, os.W_OK):
            return None
        path = root / f"tokenflow-sandbox-{uuid.uuid4().hex[:12]}"
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

    def remove(self) -> None:
        """rmdir once the group is empty (the kernel frees killed tasks shortly after)."""
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)

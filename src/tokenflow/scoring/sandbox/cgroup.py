"""A per-run cgroup: the process cap and the memory cap that bind root too and count every
process of the run together, and the list of those processes, which is how the parent makes
sure none outlives it.

RLIMIT_NPROC is not applied to root, and RLIMIT_AS bounds one process's address space only
(four children may each hold nearly all of it, and a memfd's pages are no address space at all),
so where the controllers are writable (cgroup v1 ``/sys/fs/cgroup/pids`` and
``/sys/fs/cgroup/memory``, or a v2 hierarchy offering ``pids`` and ``memory``) each program gets
its own group with ``pids.max`` and a memory limit (v1 ``memory.limit_in_bytes``, v2
``memory.max``; swap off where the files exist). Page cache and tmpfs pages, memfds and the work
dir's files included, are charged to it. A controller that is not writable is left out and its
layer (``cgroup_pids``, ``cgroup_memory``) reported missing.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

_V1 = {"cgroup_pids": Path("/sys/fs/cgroup/pids"), "cgroup_memory": Path("/sys/fs/cgroup/memory")}
_V2 = Path("/sys/fs/cgroup")
_V2_CONTROLLERS = {"cgroup_pids": "pids", "cgroup_memory": "memory"}


def _roots() -> dict[str, Path]:
    """Writable hierarchy per layer: v1 where that controller is mounted, else v2."""
    controllers = _V2 / "cgroup.subtree_control"
    v2 = controllers.read_text().split() if controllers.exists() else []
    roots = {}
    for layer, v1 in _V1.items():
        if (v1 / "cgroup.procs").exists():
            roots[layer] = v1
        elif _V2_CONTROLLERS[layer] in v2:
            roots[layer] = _V2
    return {layer: root for layer, root in roots.items() if os.access(root, os.W_OK)}


def _limits(max_pids: int, memory_bytes: int) -> dict[str, dict[str, str]]:
    """Files to write per layer, each where it exists (v1 and v2 names both are listed)."""
    mem = str(memory_bytes)
    return {"cgroup_pids": {"pids.max": str(max_pids)},
            # v1: memsw (memory + swap) may only be set at or above the memory limit, so after it
            "cgroup_memory": {"memory.limit_in_bytes": mem, "memory.memsw.limit_in_bytes": mem,
                              "memory.max": mem, "memory.swap.max": "0"}}


@dataclass
class RunCgroup:
    paths: dict[str, str] = field(default_factory=dict)
    """Layer (``cgroup_pids``, ``cgroup_memory``) -> the run's cgroup directory for it (one
    directory for both on cgroup v2)."""

    @classmethod
    def create(cls, max_pids: int, memory_bytes: int, name: str | None = None) -> "RunCgroup | None":
        """``name``: the run's work dir name, so a leftover could be traced to its run."""
        name = name or f"tokenflow-sandbox-{uuid.uuid4().hex[:12]}"
        group, made = cls(), []
        for layer, root in _roots().items():
            path = root / name
            try:
                if path not in made:
                    path.mkdir()
                    made.append(path)
                for fname, value in _limits(max_pids, memory_bytes)[layer].items():
                    if (path / fname).exists():
                        (path / fname).write_text(value)
                group.paths[layer] = str(path)
            except OSError:
                group.paths.pop(layer, None)
                if path in made and not any(p == str(path) for p in group.paths.values()):
                    _rmdir(path)
                    made.remove(path)
        return group if group.paths else None

    @property
    def directories(self) -> list[str]:
        return sorted(set(self.paths.values()))

    def pids(self) -> list[int]:
        found = set()
        for d in self.directories:
            try:
                found |= {int(p) for p in Path(d, "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(found)

    def oom_kills(self) -> int:
        """Processes the memory limit killed (v1 ``memory.oom_control``, v2 ``memory.events``)."""
        d = self.paths.get("cgroup_memory")
        for fname in ("memory.events", "memory.oom_control"):
            try:
                for line in Path(d, fname).read_text().splitlines() if d else ():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except OSError:
                continue
        return 0

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process still in the group until it is empty (pids.max bounds how many
        a fork bomb can add meanwhile); cgroup v2's cgroup.kill does it in one write."""
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for d in self.directories:
                kill_file = Path(d, "cgroup.kill")
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
        for d in self.directories:
            _rmdir(Path(d))


def _rmdir(path: Path) -> None:
    for _ in range(250):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def available_mb() -> int | None:
    """MemAvailable of the machine, in MB (None where /proc/meminfo does not say)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    return None

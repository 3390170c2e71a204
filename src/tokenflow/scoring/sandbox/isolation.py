"""Which isolation layers this machine grants, probed once per process by running a no-op."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# The layers that keep a hostile program off the network and the file system. Without them the
# sandbox bounds resources only.
CONTAINMENT = ("network_namespace", "pid_namespace", "read_only_fs")


@dataclass(frozen=True)
class Isolation:
    layers: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def contained(self) -> bool:
        """Network off, read-only file system and a pid namespace all took effect."""
        return all(layer in self.layers for layer in CONTAINMENT)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(layer for layer in CONTAINMENT + ("cgroup_pids",) if layer not in self.layers)


@functools.lru_cache(maxsize=4)
def probe_isolation(namespaces: bool = True, cgroup: bool = True) -> Isolation:
    """Run ``pass`` in the sandbox and report the layers that took effect."""
    from tokenflow.scoring.sandbox.runner import SandboxLimits, run_program

    result = run_program("pass", limits=SandboxLimits(wall_s=30), namespaces=namespaces, cgroup=cgroup)
    if not result.ok:
        raise RuntimeError(f"the sandbox cannot run even an empty program ({result.reason}): "
                           f"{'; '.join(result.notes)} {result.stderr[-300:]}")
    return Isolation(result.layers, result.notes)

"""``Sandbox``: the probed isolation plus limits, as one object a reward function keeps."""

from __future__ import annotations

import logging

from tokenflow.scoring.sandbox.isolation import Isolation, probe_isolation
from tokenflow.scoring.sandbox.runner import SandboxLimits, SandboxResult, run_program

log = logging.getLogger(__name__)


class Sandbox:
    """Runs programs under ``limits``; probes the isolation on creation and warns when the
    network/file-system containment is missing (then only rlimits stand between the program
    and the machine)."""

    def __init__(self, limits: SandboxLimits | None = None, *, namespaces: bool = True,
                 cgroup: bool = True) -> None:
        self.limits = limits or SandboxLimits()
        self.namespaces, self.cgroup = namespaces, cgroup
        self.isolation: Isolation = probe_isolation(namespaces, cgroup)
        if not self.isolation.contained:
            log.warning(
                "SANDBOX NOT CONTAINED: only %s took effect (missing %s%s). Untrusted programs "
                "can reach the network and write the file system; enable unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root.",
                ", ".join(self.isolation.layers), ", ".join(self.isolation.missing),
                f"; {'; '.join(self.isolation.notes)}" if self.isolation.notes else "")
        elif "cgroup_pids" not in self.isolation.layers:
            log.info("sandbox: no writable pids cgroup; processes are capped by RLIMIT_NPROC and "
                     "the pid namespace")

    @property
    def isolated(self) -> bool:
        return self.isolation.contained

    def run(self, code: str, *, stdin: str = "", files: dict[str, str] | None = None,
            limits: SandboxLimits | None = None) -> SandboxResult:
        return run_program(code, stdin=stdin, files=files, limits=limits or self.limits,
                           namespaces=self.namespaces, cgroup=self.cgroup)

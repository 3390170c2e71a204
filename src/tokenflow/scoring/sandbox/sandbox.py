"""``Sandbox``: the probed isolation plus limits, as one object a reward function keeps."""

from __future__ import annotations

import logging

from tokenflow.scoring.sandbox.isolation import Isolation, probe_isolation, run_program
from tokenflow.scoring.sandbox.runner import SandboxLimits, SandboxResult

log = logging.getLogger(__name__)


class Sandbox:
    """Runs programs under ``limits``. Probes the isolation on creation and, when any layer of
    the containment is missing, logs a warning naming each missing layer and how to get it."""

    def __init__(self, limits: SandboxLimits | None = None, *, namespaces: bool = True,
                 cgroup: bool = True, bwrap: bool = True) -> None:
        self.limits = limits or SandboxLimits()
        self.namespaces, self.cgroup = namespaces, cgroup
        self.isolation: Isolation = probe_isolation(namespaces, cgroup, bwrap)
        if not self.isolation.contained:
            log.warning(
                "SANDBOX NOT CONTAINED: untrusted programs may undo or reach outside the sandbox. "
                "Took effect: %s. Missing: %s.%s", ", ".join(self.isolation.layers),
                self.isolation.report(),
                f" Notes: {'; '.join(self.isolation.notes)}" if self.isolation.notes else "")
        elif "cgroup_pids" not in self.isolation.layers:
            log.info("sandbox: no writable pids cgroup; processes are capped by RLIMIT_NPROC and "
                     "the pid namespace")

    @property
    def isolated(self) -> bool:
        return self.isolation.contained

    def run(self, code: str, *, stdin: str = "", files: dict[str, str] | None = None,
            limits: SandboxLimits | None = None) -> SandboxResult:
        return run_program(code, stdin=stdin, files=files, limits=limits or self.limits,
                           namespaces=self.namespaces, cgroup=self.cgroup, bwrap=self.isolation.bwrap)

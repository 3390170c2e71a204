"""``Sandbox``: the probed isolation plus limits, as one object a reward function keeps."""

from __future__ import annotations

import logging
import os

from tokenflow.scoring.sandbox.isolation import HINTS, Isolation, probe_isolation, run_program
from tokenflow.scoring.sandbox.runner import SandboxLimits, SandboxResult

log = logging.getLogger(__name__)

FALLBACK_ENV = "TOKENFLOW_SANDBOX_FALLBACK"
"""Set to 1 (``scorer.sandbox_fallback = true`` does, for the scorer processes of a run): a
``Sandbox()`` without bubblewrap runs the launcher's own layers instead of raising."""


class SandboxUnavailable(RuntimeError):
    """bubblewrap could not run here, so programs would see the host's file tree; raised unless
    the fallback was asked for."""


class Sandbox:
    """Runs programs under ``limits``. Probes the isolation on creation; where bubblewrap cannot
    run (no private root) it raises :class:`SandboxUnavailable` unless the fallback is asked
    for (``fallback=True``, ``bwrap=False`` or ``namespaces=False``, or the environment variable
    :data:`FALLBACK_ENV`, which the config key ``scorer.sandbox_fallback = true`` sets); when
    any layer of the containment is missing, it logs a warning naming each and how to get it."""

    def __init__(self, limits: SandboxLimits | None = None, *, namespaces: bool = True,
                 cgroup: bool = True, bwrap: bool = True, fallback: bool | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.namespaces, self.cgroup = namespaces, cgroup
        self.isolation: Isolation = probe_isolation(namespaces, cgroup, bwrap)
        if fallback is None:
            fallback = not (bwrap and namespaces) or os.environ.get(FALLBACK_ENV, "") not in ("", "0")
        if not self.isolation.bwrap and not fallback:
            raise SandboxUnavailable(
                "the code sandbox has no private root here: bubblewrap could not run "
                f"({'; '.join(self.isolation.notes) or 'not found'}). Fix: {HINTS['private_root']}. "
                "Or run without it, the program seeing the host's file tree read-only: set "
                f"`scorer.sandbox_fallback = true` in the run's config ({FALLBACK_ENV}=1 in the "
                "environment, Sandbox(fallback=True) in code).")
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

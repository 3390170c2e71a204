"""A sandbox for code rewards: run untrusted model-written Python with limits, no containers.

    from tokenflow.scoring.sandbox import Sandbox
    result = Sandbox().run("print(sum(range(10)))")   # SandboxResult(ok=True, stdout="45\n", ...)

Layers, each probed rather than assumed (``Sandbox.isolation`` says which took effect here):

* always: ``python -I`` in its own session, a scrubbed environment, rlimits (CPU seconds,
  address space, file size, open files, processes, no core dumps), a wall-clock kill of every
  process of the run (stdin is fed inside that loop), capped output, no_new_privs, and a seccomp
  filter (:mod:`.syscall_filter`) refusing mount, umount2, pivot_root, chroot, setns, unshare,
  namespace clones, ptrace, process_vm_readv/writev, bpf, keyctl, open_by_handle_at, module and
  kexec loading, io_uring and more;
* with bubblewrap (``apt-get install bubblewrap``): a private root holding only /usr, the
  interpreter's prefix (site-packages hidden), a fresh /proc, a read-only minimal /dev and the
  work dir; every namespace; uid 65534 in a user namespace, started from root under a uid of the
  run's own; no capabilities;
* where the kernel allows: the work dir is a tmpfs with size and inode quotas; without
  bubblewrap, network/pid/mount namespaces, every mount read-only, a read-only private /proc,
  capabilities dropped by the launcher (:mod:`.hand_layers`);
* where writable: a pids cgroup (a process cap that binds root too; emptied after each run).

A missing layer is reported loudly: ``Sandbox()`` logs **SANDBOX NOT CONTAINED** naming each
missing layer and how to get it, and ``Sandbox.isolated`` is false.

May import: the standard library and its own modules only (no other tokenflow package): it also
runs as a bare launcher beside untrusted code.
"""

from tokenflow.scoring.sandbox.isolation import Isolation, probe_isolation, run_program
from tokenflow.scoring.sandbox.runner import SandboxLimits, SandboxResult
from tokenflow.scoring.sandbox.sandbox import Sandbox

__all__ = ["Isolation", "Sandbox", "SandboxLimits", "SandboxResult", "probe_isolation", "run_program"]

"""The launcher's own layers, for machines without bubblewrap (or with namespaces off): network,
pid and IPC namespaces, a minimal /dev (null, zero, full, random, urandom, a private pts), every
mount read-only, a read-only private /proc, then the program with no capabilities, no_new_privs
and the seccomp filter. There is no private root on this path: the
host's file tree stays visible (read-only), which the probe reports as ``private_root`` missing.

Standard library only (imported by path by the launcher)::

    launcher (already in its mount [+ user] namespace, work dir on a quota'd tmpfs)
      ├─ unshare(net, pid, ipc)                      -- best effort; what worked is reported
      ├─ a tmpfs /dev with null, zero, full, random, urandom and a private devpts
      ├─ remount every mount read-only except the work dir
      └─ fork → reaper (pid 1 of the new pid namespace; mounts /proc; dies with the launcher)
                 └─ fork → program: rlimits → drop capabilities → no_new_privs → seccomp → execve

The reaper exists so that the program is not pid 1 (pid 1 ignores default-action signals such
as SIGXCPU) and so that every process the program starts dies with it. The process that waits
for the program writes its verdict to the status fd, which the program never holds.
"""

import json
import os
import signal

import kernel
import syscall_filter


def status(fd: int, **event) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


def _read_only_except(workdir: str, notes: list[str]) -> bool:
    # the private devpts stays writable: ptys are made in it (it is this run's own instance)
    # (the host's mounts under /dev lie hidden below the minimal /dev)
    refused = [p for p in kernel.mount_points()
               if p != workdir and not p.startswith("/dev/") and not kernel.remount_read_only(p)]
    if "/" in refused:
        notes.append("the root mount refused a read-only remount")
        return False
    if refused:
        notes.append(f"mounts left writable: {', '.join(refused)}")
    return True


def _program(cfg: dict, status_fd: int, filter_bytes: bytes | None) -> None:
    """In the forked child: the last layers, reported, then execve (never returns)."""
    try:
        os.chdir(cfg["workdir"])
        kernel.set_limits(cfg["limits"])
        applied, notes = [], []
        try:
            kernel.drop_capabilities()
        except OSError as e:
            notes.append(str(e))
        caps = kernel.capability_sets()
        if not (caps["CapEff"] or caps["CapPrm"] or caps["CapBnd"] or caps["CapAmb"]):
            applied.append("no_capabilities")
        else:
            notes.append(f"capabilities left: CapEff={caps['CapEff']:x} CapBnd={caps['CapBnd']:x}")
        kernel.set_no_new_privs()
        applied.append("no_new_privs")
        if filter_bytes:
            try:
                syscall_filter.install(filter_bytes)
                applied.append("seccomp")
            except OSError as e:
                notes.append(str(e))
        if cfg["caller_uid"] != 0:  # uid 65534 inside maps to the caller's uid outside
            applied.append("unprivileged_uid")
        else:
            notes.append("the program's uid maps to root outside its namespaces")
        status(status_fd, layers=applied, notes=notes)
        os.close(status_fd)
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    finally:
        os._exit(127)


def _run(cfg: dict, status_fd: int, filter_bytes: bytes | None) -> int:
    """Fork the program, wait for it (reaping any orphans meanwhile), report how it ended."""
    pid = os.fork()
    if pid == 0:
        _program(cfg, status_fd, filter_bytes)
    while True:
        try:
            done, st = os.wait()
        except ChildProcessError:
            return 1
        if done == pid:
            break
    if os.WIFSIGNALED(st):
        status(status_fd, signal=os.WTERMSIG(st))
    else:
        status(status_fd, exit=os.WEXITSTATUS(st))
    return 0


def run(cfg: dict, status_fd: int, filter_bytes: bytes | None, layers: list[str], notes: list[str],
        own_mounts: bool) -> int:
    """``own_mounts``: the launcher is in a mount namespace of its own (so remounting is safe)."""
    in_pid_ns = False
    if cfg["namespaces"]:
        try:
            kernel.unshare(kernel.CLONE_NEWNET | kernel.CLONE_NEWPID | kernel.CLONE_NEWIPC, "net, pid, ipc")
            layers += ["network_namespace", "pid_namespace", "ipc_namespace"]
            in_pid_ns = True
        except OSError as e:
            notes.append(str(e))
        if own_mounts:
            try:
                kernel.minimal_dev()
                layers.append("minimal_dev")
            except OSError as e:
                notes.append(str(e))
        if own_mounts and _read_only_except(cfg["workdir"], notes):
            layers.append("read_only_fs")
    status(status_fd, layers=layers, notes=notes)
    if not in_pid_ns:
        return _run(cfg, status_fd, filter_bytes)
    reaper = os.fork()
    if reaper == 0:
        kernel.set_pdeathsig(signal.SIGKILL)
        # A /proc of this namespace only: the host's would show (and, to the same uid, open)
        # other processes' environments, memory and namespaces.
        try:
            kernel.mount_proc()
            status(status_fd, layers=["private_proc"])
        except OSError as e:
            status(status_fd, notes=[str(e)])
        os._exit(_run(cfg, status_fd, filter_bytes))
    _, st = os.waitpid(reaper, 0)
    return os.WEXITSTATUS(st) if os.WIFEXITED(st) else 1

"""The sandbox's exec wrapper: isolate, limit, then ``execv`` the untrusted program.

Run by the parent as ``python -I -S launcher.py <config json> <status fd>`` in a fresh session.
It imports nothing from tokenflow (it runs before any isolation that could hide the package) and
does its work in plain syscalls, not in ``preexec_fn`` (unsafe in a threaded parent)::

    launcher (host pid namespace)
      ├─ join the run's cgroup (pids.max)            -- if the parent made one
      ├─ unshare(mount, net, pid [, user])           -- best effort; what worked is reported
      ├─ remount every mount read-only except the work dir
      └─ fork → reaper (pid 1 of the new pid namespace; dies with the launcher)
                 └─ fork → program: setrlimit(...) → no_new_privs → execv(python -I main.py)

The reaper exists so that the program is not pid 1 (pid 1 ignores default-action signals such
as SIGXCPU) and so that every process the program starts dies with it: when pid 1 of a pid
namespace exits, the kernel kills the rest of the namespace. The process that waits for the
program writes one JSON line per event to the status fd, which the program never sees (it is
closed before exec), so the program cannot forge its own verdict.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits → the mount flags a bind remount must repeat (locked flags otherwise EPERM)
_ST_TO_MS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME,
             4096: MS_RELATIME}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


def _call(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _status(fd: int, **event) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            raw = line.split()[4]
            # mountinfo escapes space, tab, newline and backslash as \ooo
            points.append(raw.encode().decode("unicode_escape"))
    return points


def _read_only_except(workdir: str) -> list[str]:
    """Remount every mount read-only, the work dir (bound onto itself first) excepted; returns
    the mount points that refused."""
    _call(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    w = workdir.encode()
    _call(_libc.mount(w, w, None, MS_BIND | MS_REC, None), "bind the work dir")
    refused = []
    for point in _mount_points():
        if point == workdir:
            continue
        try:
            st = os.statvfs(point)
        except OSError:
            continue
        keep = 0
        for st_bit, ms_bit in _ST_TO_MS.items():
            if st.f_flag & st_bit:
                keep |= ms_bit
        if _libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep, None) != 0:
            refused.append(point)
    return refused


def _enter_namespaces(workdir: str, layers: list[str], notes: list[str]) -> bool:
    """unshare mount+net+pid (plus user when not root); True when a pid namespace was entered."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (CLONE_NEWUSER if uid != 0 else 0)
    try:
        _call(_libc.unshare(flags), "unshare(mount, net, pid)")
    except OSError as e:
        notes.append(str(e))
        return False
    if uid != 0:
        # Map ourselves to root of the new user namespace: it grants mount rights inside it
        # and nothing outside it. A kernel that confines unprivileged user namespaces (AppArmor)
        # refuses this; the network and pid namespaces still hold then.
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                    f.write(text)
            layers.append("user_namespace")
        except OSError as e:
            notes.append(f"user namespace mapping refused: {e}")
    layers += ["network_namespace", "pid_namespace"]
    try:
        refused = _read_only_except(workdir)
        if "/" in refused:
            notes.append("the root mount refused a read-only remount")
        else:
            layers.append("read_only_fs")
            if refused:
                notes.append(f"mounts left writable: {', '.join(refused)}")
    except OSError as e:
        notes.append(str(e))
    return True


def _set_limits(limits: dict) -> None:
    def cap(res, value, hard_extra=0):
        if value is not None:
            resource.setrlimit(res, (value, value + hard_extra))

    cap(resource.RLIMIT_CORE, 0)
    # SIGXCPU at the soft limit names the cause; SIGKILL a second later if it is caught.
    cap(resource.RLIMIT_CPU, limits["cpu_s"], hard_extra=1)
    cap(resource.RLIMIT_AS, limits["address_space_bytes"])
    cap(resource.RLIMIT_FSIZE, limits["file_size_bytes"])
    cap(resource.RLIMIT_NOFILE, limits["open_files"])
    cap(resource.RLIMIT_NPROC, limits["processes"])


def _run_program(cfg: dict, status_fd: int) -> int:
    """Fork the program, wait for it (reaping any orphans meanwhile), report how it ended."""
    pid = os.fork()
    if pid == 0:
        try:
            os.close(status_fd)
            os.chdir(cfg["workdir"])
            _set_limits(cfg["limits"])
            _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
        finally:
            os._exit(127)
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            return 1
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        _status(status_fd, signal=os.WTERMSIG(status))
    else:
        _status(status_fd, exit=os.WEXITSTATUS(status))
    return 0


def main() -> int:
    cfg = json.loads(sys.argv[1])
    status_fd = int(sys.argv[2])
    layers, notes = ["session", "rlimits", "scrubbed_env"], []
    if cfg.get("cgroup"):
        try:
            with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
            layers.append("cgroup_pids")
        except OSError as e:
            notes.append(f"cgroup: {e}")
    in_pid_ns = cfg["namespaces"] and _enter_namespaces(cfg["workdir"], layers, notes)
    _status(status_fd, layers=layers, notes=notes)
    if not in_pid_ns:
        return _run_program(cfg, status_fd)
    reaper = os.fork()
    if reaper == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # A /proc of this namespace only: the host's would show (and, to the same uid, open)
        # other processes' environments and command lines.
        proc = _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        _status(status_fd, layers=["private_proc"] if proc == 0 else [],
                notes=[] if proc == 0 else [f"mount /proc: {os.strerror(ctypes.get_errno())}"])
        os._exit(_run_program(cfg, status_fd))
    _, status = os.waitpid(reaper, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    sys.exit(main())

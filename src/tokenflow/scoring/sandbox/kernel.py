"""Plain system calls the launcher needs (ctypes over libc): namespaces, mounts, capabilities,
rlimits. Standard library only, no tokenflow imports: the launcher imports this file by path in
a ``python -I -S`` process, before any isolation is in place."""

from __future__ import annotations

import ctypes
import os
import resource

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits -> the mount flags a bind remount must repeat (locked flags otherwise EPERM)
_ST_TO_MS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME,
             4096: MS_RELATIME}
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 36, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int, what: str) -> None:
    check(libc.unshare(flags), f"unshare({what})")


def map_ids(inside: int, uid: int, gid: int) -> None:
    """After unshare(CLONE_NEWUSER): map uid/gid ``inside`` of the new namespace to this process's
    own ``uid``/``gid`` outside (the one mapping any process may write for itself; read them
    before the unshare, after it they read as the overflow id)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{inside} {uid} 1"), ("gid_map", f"{inside} {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
            f.write(text)


def make_mounts_private() -> None:
    """Nothing mounted from here on propagates back to the host's mount namespace."""
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")


def mount_tmpfs(path: str, size_mb: int, inodes: int, owner: int | None = None) -> None:
    """A tmpfs over ``path``: both quotas at once (size= bytes, nr_inodes= files and dirs),
    owned by uid/gid ``owner`` when given."""
    opts = f"size={size_mb}m,nr_inodes={inodes},mode=0700"
    opts = (opts + (f",uid={owner},gid={owner}" if owner is not None else "")).encode()
    check(libc.mount(b"tokenflow-sandbox", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts),
          f"mount a tmpfs on {path}")


def bind_read_only(source: str, target: str) -> None:
    check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {source}")
    if not remount_read_only(target):
        raise OSError(1, f"read-only remount of {target} refused")


def switch_user(uid: int) -> None:
    """Become ``uid``/gid ``uid`` with no supplementary groups; a root process leaving uid 0
    this way loses every capability."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def mount_proc() -> None:
    """This pid namespace's /proc, read-only (no /proc/sys writes even for uid 0)."""
    check(libc.mount(b"proc", b"/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
          "mount /proc")


# The device nodes a program gets (what bubblewrap's --dev gives, less the host's /dev/tty):
# a read-only /dev otherwise still opens every node of the host (KVM, userfaultfd, loop control,
# consoles, disks), since a mount's read-only flag guards inodes, not devices.
DEV_NODES = ("null", "zero", "full", "random", "urandom")


def minimal_dev() -> None:
    """A tmpfs over /dev holding only :data:`DEV_NODES` (bound from the host's), a private devpts
    instance (/dev/pts, /dev/ptmx), /dev/shm and the fd links. In the launcher's mount
    namespace; remounted read-only with everything else."""
    nodes = {name: os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC) for name in DEV_NODES}
    try:
        check(libc.mount(b"tokenflow-dev", b"/dev", b"tmpfs", MS_NOSUID | MS_NOEXEC,
                         b"size=64k,nr_inodes=64,mode=0755"), "mount a tmpfs on /dev")
        for name, fd in nodes.items():
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            check(libc.mount(f"/proc/self/fd/{fd}".encode(), f"/dev/{name}".encode(), None, MS_BIND, None),
                  f"bind /dev/{name}")
    finally:
        for fd in nodes.values():
            os.close(fd)
    for d in ("pts", "shm"):
        os.mkdir(f"/dev/{d}", 0o755)
    check(libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC,
                     b"newinstance,ptmxmode=0666,mode=0620"), "mount a private devpts")
    for link, target in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{link}")


def mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            # mountinfo escapes space, tab, newline and backslash as \ooo
            points.append(line.split()[4].encode().decode("unicode_escape"))
    return points


def remount_read_only(point: str) -> bool:
    try:
        st = os.statvfs(point)
    except OSError:
        return True  # gone or unreachable: nothing to write through
    keep = 0
    for st_bit, ms_bit in _ST_TO_MS.items():
        if st.f_flag & st_bit:
            keep |= ms_bit
    return libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep, None) == 0


def set_child_subreaper() -> None:
    """Orphans of this process's descendants become its children (not init's), to be reaped."""
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def set_pdeathsig(sig: int) -> None:
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def drop_capabilities() -> None:
    """Empty the bounding, ambient, permitted, effective and inheritable sets, so that not even
    an exec as uid 0 gets capabilities back."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: checked below
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} words, all zero
    check(libc.capset(header, data), "capset")


def capability_sets() -> dict[str, int]:
    with open("/proc/self/status", encoding="ascii") as f:
        return {k: int(v, 16) for k, v in (line.split(":\t") for line in f if line.startswith("Cap"))}


def set_no_new_privs() -> None:
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def set_limits(limits: dict) -> None:
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

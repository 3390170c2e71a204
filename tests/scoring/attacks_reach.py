"""Attacks that reach past the sandbox without undoing it: host sockets (unix, abstract, TCP),
host files (/etc/shadow, the project, /tmp, /dev/shm, raw disks), writes outside the work dir,
the work dir's quotas (inodes, total size), a fork bomb, signals to host processes. Each prints
``ESCAPED: ...`` when it gets through (see attack_syscalls.py)."""
import os
import socket
import time

from attack_syscalls import escaped, note, read, tcp_try


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
    tcp_try(P, "127.0.0.1")
    if P.get("host_ip"):
        tcp_try(P, P["host_ip"])


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


def raw_block_device(P):
    names = os.listdir("/sys/block") if os.path.isdir("/sys/block") else []
    for dev in set(names) | {P["root_device"]}:
        data = read(f"/dev/{dev}", 512)
        if data:
            escaped(f"read raw device /dev/{dev}")
    if read("/dev/kmsg", 1):
        escaped("read the kernel log")


ATTACKS = {name: fn for name, fn in dict(globals()).items()
           if callable(fn) and getattr(fn, "__module__", None) == __name__ and not name.startswith("_")}

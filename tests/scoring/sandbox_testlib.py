"""Host side of the sandbox attack suite: the things an attack tries to reach (listeners, a decoy
process, secret files), running an attack as root or as an unprivileged user, and the check that
a run left nothing behind (processes, work dirs, cgroups, mounts, /dev/shm entries)."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.scoring import sandbox_bait

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
# Not 65534: right after unshare(CLONE_NEWUSER) a process's uid reads as the overflow id 65534,
# so a bug that maps that id instead of the real one would pass unseen as "nobody".
UNPRIVILEGED = 54321


def _listener(family, address) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(address)
    s.listen(8)
    s.setblocking(False)
    return s


def _host_ip() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


@dataclass
class HostBait:
    """Everything an attack may try to reach; ``breaches()`` lists what it did reach."""

    secret: str = field(default_factory=lambda: "tf-secret-" + secrets.token_hex(8))
    marker: str = field(default_factory=lambda: "tf-attack-" + secrets.token_hex(4))

    def __post_init__(self) -> None:
        self.tmp_dir = Path("/tmp") / self.marker
        self.tmp_dir.mkdir(mode=0o777)
        os.chmod(self.tmp_dir, 0o777)  # writable by the unprivileged uid too, so its escape would show
        self.tmp_secret = self.tmp_dir / "secret.txt"
        self.tmp_secret.write_text(self.secret)
        os.chmod(self.tmp_secret, 0o644)
        self.shm = Path("/dev/shm") / self.marker
        self.shm.write_text(self.secret)
        os.chmod(self.shm, 0o644)
        self.tcp = _listener(socket.AF_INET, ("0.0.0.0", 0))
        self.unix_path = str(self.tmp_dir / "sock")
        self.unix = _listener(socket.AF_UNIX, self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.abstract = _listener(socket.AF_UNIX, "\0" + self.marker)
        self.decoy = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                      user=UNPRIVILEGED if os.geteuid() == 0 else None)
        self.host_file = self.tmp_dir / "escaped-write.txt"
        self.vsock_port = 20000 + secrets.randbelow(40000)
        self.sysv_key, self.sysv_id = _root_only_segment(self.secret)

    def params(self, limits_kw: dict) -> dict:
        return {"secret": self.secret, "tcp_port": self.tcp.getsockname()[1], "host_ip": _host_ip(),
                "unix_path": self.unix_path, "abstract_name": self.marker,
                "project_file": str(ROOT / "pyproject.toml"), "project_dir": str(ROOT),
                "tmp_secret_file": str(self.tmp_secret), "tmp_marker": self.marker,
                "host_file": str(self.host_file), "shm_name": self.marker, "decoy_pid": self.decoy.pid,
                "root_device": "vda", "file_mb": limits_kw.get("file_mb", 4),
                "quota_bytes": limits_kw.get("workdir_mb", 16) << 20,
                "inode_quota": limits_kw.get("workdir_files", 2000),
                "processes": limits_kw.get("processes", 16), "open_files": limits_kw.get("open_files", 64),
                "memory_mb": limits_kw.get("memory_mb", 512),
                "total_memory_bytes": limits_kw.get("total_memory_mb", limits_kw.get("memory_mb", 512)) << 20,
                "vsock_port": self.vsock_port, "sysv_key": self.sysv_key}

    def breaches(self) -> list[str]:
        found = []
        for name, s in (("tcp", self.tcp), ("unix", self.unix), ("abstract unix", self.abstract)):
            try:
                conn, _ = s.accept()
                conn.close()
                found.append(f"{name} listener accepted a connection")
            except BlockingIOError:
                pass
        if self.decoy.poll() is not None:
            found.append("the decoy host process was killed")
        for p in (self.host_file, self.tmp_dir / "written", Path("/usr/tf-attack"), Path("/etc/tf-attack"),
                  Path("/var/tmp/tf-attack"), Path(f"/dev/shm/{self.marker}-w")):
            if p.exists():
                found.append(f"{p} was written on the host")
                p.unlink()
        return found

    def close(self) -> None:
        for s in (self.tcp, self.unix, self.abstract):
            s.close()
        self.decoy.kill()
        self.decoy.wait()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.shm.unlink(missing_ok=True)
        _libc.shmctl(self.sysv_id, 0, None)  # IPC_RMID


_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p


def _root_only_segment(secret: str) -> tuple[int, int]:
    """A SysV shared memory segment of this (root) process, mode 0600, holding the secret: the
    key and id. Only a run that shares the host's IPC namespace (and its uid) can reach it."""
    key = 0x7F000000 + secrets.randbelow(1 << 20)
    shmid = _libc.shmget(key, 4096, 0o1000 | 0o2000 | 0o600)  # IPC_CREAT | IPC_EXCL
    if shmid < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    addr = _libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, secret.encode(), len(secret))
    _libc.shmdt(ctypes.c_void_p(addr))
    return key, shmid


# --- what a run may leave behind ---------------------------------------------------------

_HOST_PIDNS = os.readlink("/proc/self/ns/pid")


def sandbox_processes() -> set[int]:
    """Processes of some sandbox run: in a tokenflow-sandbox cgroup, running the launcher or
    bwrap, or living in a pid namespace other than the host's."""
    found = set()
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            pidns = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        if ("tokenflow-sandbox" in cgroups or b"launcher.py" in cmdline or b"bwrap" in cmdline
                or pidns != _HOST_PIDNS):
            found.add(pid)
    return found


def _shm_entries() -> set[str]:
    """/dev/shm entries an attack could have made (Python's shared_memory names them psm_*, the
    attacks use their marker, an unprivileged run owns its files); other processes on a shared machine
    keep making their own semaphores there."""
    found = set()
    for name in os.listdir("/dev/shm"):
        try:
            owner = os.stat(f"/dev/shm/{name}").st_uid
        except OSError:
            continue
        if name.startswith("psm_") or "tf-attack" in name or owner == UNPRIVILEGED:
            found.add(name)
    return found


def _sysv_ipc() -> set[str]:
    """The host's SysV segments, message queues and semaphore sets, by kind, key and id."""
    found = set()
    for kind in ("shm", "msg", "sem"):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        found |= {f"{kind} key={int(line.split()[0]):#x} id={line.split()[1]}" for line in lines if line.strip()}
    return found


def _host_state() -> dict[str, set[str]]:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return {"tmp": set(glob.glob("/tmp/tokenflow-sandbox-*")), "sysv_ipc": _sysv_ipc(),
            "cgroups": set(glob.glob("/sys/fs/cgroup/*/tokenflow-sandbox-*")),
            "shm": _shm_entries(),
            "mounts": {m for m in mounts if "tokenflow-sandbox" in m}}


class Leftovers:
    """Snapshot before a run; ``after(result)`` lists what the run left (waiting a moment for
    the kernel to free killed tasks)."""

    def __init__(self) -> None:
        self.procs, self.state = sandbox_processes(), _host_state()

    def after(self, workdir: str | None, wait_s: float = 3.0) -> list[str]:
        deadline = time.monotonic() + wait_s
        while True:
            left = []
            procs = sandbox_processes() - self.procs
            if procs:
                left.append(f"processes {sorted(procs)}: {[_cmd(p) for p in sorted(procs)][:5]}")
            for key, values in _host_state().items():
                if values - self.state[key]:
                    left.append(f"{key}: {sorted(values - self.state[key])[:5]}")
            if workdir and os.path.exists(workdir):
                left.append(f"work dir {workdir}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def kill_leftovers(before: set[int]) -> None:
    """Clean up after a sandbox that did leave processes (so one failure doesn't cascade)."""
    for pid in sandbox_processes() - before:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


# --- running an attack as root or as an unprivileged uid ------------------------------------

def user_python() -> tuple[str | None, str]:
    """A Python the unprivileged uid can run (this one may live under /root), or why none."""
    if os.geteuid() != 0:
        return None, "the suite is not running as root, so it cannot switch to another uid"
    if not shutil.which("setpriv"):
        return None, "setpriv (util-linux) is not installed"
    why = "no Python interpreter is runnable by the unprivileged uid"
    for python in (sys.executable, "/usr/bin/python3"):
        # it must start itself again (the sandbox runs sys.executable), read this checkout and
        # get the sandbox's probe through: the helper's probe request does all three
        probe = subprocess.run(_as_user(python, str(HERE / "sandbox_as_user.py"), str(ROOT / "src")),
                               input='{"probe": true}', capture_output=True, text=True, timeout=60, cwd="/tmp")
        if probe.returncode == 0:
            return python, ""
        why = f"{python} as uid {UNPRIVILEGED}: {probe.stderr.strip()[-300:]}"
    return None, why


def _as_user(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups", *argv]


def run(mode: str, python: str | None, name: str, bait: HostBait, limits_kw: dict, timeout_s: float = 60,
        sandbox_mode: str | None = None) -> dict:
    """Run attack ``name`` from a helper process (the sandbox's parent, holding the secret in
    its environment and heap), as root or, through setpriv, as the unprivileged uid;
    ``sandbox_mode`` forces one of runner.MODES instead of the probe's choice."""
    argv = [python or sys.executable, str(HERE / "sandbox_as_user.py"), str(ROOT / "src")]
    request = {"name": name, "params": bait.params(limits_kw), "limits": limits_kw, "mode": sandbox_mode}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), sandbox_bait.SECRET_ENV: bait.secret}
    proc = subprocess.run(_as_user(*argv) if mode == "unprivileged" else argv, input=json.dumps(request),
                          capture_output=True, text=True, timeout=timeout_s, cwd="/tmp", env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox_as_user failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])

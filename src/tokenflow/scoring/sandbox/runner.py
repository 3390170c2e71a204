"""Run one untrusted Python program with limits, and say how it ended.

The parent side of the sandbox: it makes an empty host-side work dir (the launcher mounts the
quota'd tmpfs over it, inside its own mount namespace) and, where it may, a pids cgroup; starts
:mod:`launcher` in a new session with its config on a memfd; then, in one wall-clock loop,
feeds stdin without blocking, reads stdout and stderr up to a byte cap and the status pipe. On
the deadline (or the cap) it kills the launcher's process group and everything left in the
cgroup; a killed launcher takes its pid namespace, and so every process the program started,
with it. Afterwards the work dir and the cgroup are removed: nothing of a run outlives it.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import PurePosixPath

from tokenflow.scoring.sandbox import bwrap as bubblewrap
from tokenflow.scoring.sandbox.cgroup import RunCgroup, available_mb
from tokenflow.scoring.sandbox.result import SandboxLimits, SandboxResult, verdict

__all__ = ["MODES", "SandboxLimits", "SandboxResult", "run_in_mode", "scrubbed_env"]

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")


def scrubbed_env(home: str) -> dict[str, str]:
    """Nothing of the parent's environment (no tokens, no proxies), only what Python needs."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
            "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


def _check_names(files: dict[str, str]) -> None:
    for name in files:
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or "\0" in name:
            raise ValueError(f"sandbox file names must be relative, without '..': {name!r}")


# How a run is isolated, strongest first (the probe picks the first that works here):
#   bwrap_uid  bubblewrap, started from root under a uid of the run's own (root callers only)
#   bwrap      bubblewrap as the caller (from root: uid 65534 inside maps to root outside)
#   hand       the launcher's own layers (no private root)
MODES = ("bwrap_uid", "bwrap", "hand")
# Run uids: a range systemd leaves unassigned (0x70000000-0x7FFDFFFF), one uid per run, so a
# program owns nothing on the host and shares no process count or signals with another run.
_RUN_UIDS = (0x70000000, 1 << 24)


def run_in_mode(code: str, mode: str, *, stdin: str = "", files: dict[str, str] | None = None,
                limits: SandboxLimits = SandboxLimits(), namespaces: bool = True,
                cgroup: bool = True) -> SandboxResult:
    files = dict(files or {})
    _check_names(files)
    files["main.py"] = code
    run_uid = _RUN_UIDS[0] + secrets.randbelow(_RUN_UIDS[1]) if mode == "bwrap_uid" else None
    # base/work: the tmpfs's mount point; base/pythonN: where a run uid reaches the interpreter
    base = os.path.realpath(tempfile.mkdtemp(prefix="tokenflow-sandbox-"))
    os.chmod(base, 0o755 if run_uid is not None else 0o700)
    workdir = os.path.join(base, "work")
    os.mkdir(workdir, 0o700)
    binds, sources = [], {}
    if run_uid is not None:
        for i, prefix in enumerate(bubblewrap.prefixes()):
            sources[prefix] = os.path.join(base, f"python{i}")
            os.mkdir(sources[prefix], 0o755)
            binds.append([prefix, sources[prefix]])
    tool = exe = bubblewrap.find() if mode != "hand" and namespaces else None
    if tool and run_uid is not None and (moved := bubblewrap.for_other_uid(tool)):
        # the wheel's bwrap in a virtualenv under /root: bound where the run uid can exec it
        os.mkdir(target := os.path.join(base, "bwrap"), 0o755)
        binds.append([moved[0], target])
        exe = os.path.join(target, moved[1])
    group = (RunCgroup.create(limits.processes, total_memory_mb(limits) << 20, os.path.basename(base))
             if cgroup else None)
    cfg = {
        "workdir": workdir, "files": files, "namespaces": namespaces, "caller_uid": os.getuid(),
        "cgroups": group.paths if group else {}, "run_uid": run_uid, "binds": binds,
        "workdir_mb": limits.workdir_mb, "workdir_files": limits.workdir_files,
        "argv": [bubblewrap.interpreter(), "-I", "-B", "main.py"], "env": scrubbed_env(workdir),
        "bwrap_argv": bubblewrap.argv(exe, workdir, sources) if tool else None,
        "bwrap_env": scrubbed_env(bubblewrap.WORK),
        "limits": {"cpu_s": limits.cpu_s, "address_space_bytes": limits.memory_mb << 20,
                   "file_size_bytes": limits.file_mb << 20, "open_files": limits.open_files,
                   "processes": limits.processes},
    }
    try:
        result = _supervise(cfg, stdin.encode(), limits)
        oom = group.oom_kills() if group else 0
        if oom:
            result.notes += (f"the run's memory limit ({total_memory_mb(limits)} MB) killed {oom} process(es)",)
            if not result.ok:
                result.reason = "memory_limit"
    finally:
        if group:
            group.kill_all()
            group.remove()
        shutil.rmtree(base, ignore_errors=True)
    result.workdir = base
    return result


def total_memory_mb(limits: SandboxLimits) -> int:
    """The run's memory limit: ``limits.total_memory_mb``, at most a quarter of what the machine
    has available now (scorers run several sandboxes at once), and at least 64 MB."""
    available = available_mb()
    share = available // 4 if available else limits.total_memory_mb
    return max(64, min(limits.total_memory_mb, share))


def _config_fd(cfg: dict) -> int:
    """The config on a memfd: no size limit and nothing to block on (a pipe would, past 64 KiB)."""
    fd = os.memfd_create("tokenflow-sandbox-config", 0)
    os.write(fd, json.dumps(cfg).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _supervise(cfg: dict, stdin: bytes, limits: SandboxLimits) -> SandboxResult:
    status_r, status_w = os.pipe()
    config_fd = _config_fd(cfg)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", LAUNCHER, str(config_fd), str(status_w)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=cfg["env"], cwd="/", start_new_session=True, pass_fds=(status_w, config_fd),
        )
    finally:
        os.close(status_w)
        os.close(config_fd)
    reason = None
    out = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    status_file = os.fdopen(status_r, "rb", buffering=0)
    sel.register(status_file, selectors.EVENT_READ, "status")
    pending = memoryview(stdin)
    # stdin is written inside the loop, as the pipe takes it, so a program that never reads
    # it cannot hold the parent past the deadline.
    fcntl.fcntl(proc.stdin, fcntl.F_SETFL, fcntl.fcntl(proc.stdin, fcntl.F_GETFL) | os.O_NONBLOCK)
    if pending:
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
    else:
        proc.stdin.close()
    try:
        deadline = start + limits.wall_s
        while any(key.data != "stdin" for key in sel.get_map().values()):
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                if key.data == "stdin":
                    pending = _feed(sel, proc.stdin, pending)
                    continue
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                out[key.data] += chunk
            if len(out["stdout"]) + len(out["stderr"]) > limits.output_bytes:
                reason = "output_limit"
                break
        else:
            # every pipe is closed, but a program may close its own and keep running
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                reason = "timeout"
    finally:
        _kill_group(proc)
        sel.close()
        for f in (status_file, proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    return verdict(proc.returncode, out, reason, time.monotonic() - start, limits, cfg["workdir"])


def _feed(sel: selectors.BaseSelector, pipe, pending: memoryview) -> memoryview:
    """Write what the pipe takes now; close it once all is written or the reader is gone."""
    try:
        pending = pending[os.write(pipe.fileno(), pending[:65536]):]
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):
        pending = pending[:0]
    if not pending:
        sel.unregister(pipe)
        pipe.close()
    return pending


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session's process group (the launcher or bwrap, the reaper) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()

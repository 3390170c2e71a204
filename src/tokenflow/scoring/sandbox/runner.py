"""Run one untrusted Python program with limits, and say how it ended.

The parent side of the sandbox: it makes a temp work dir (and, where it may, a pids cgroup),
starts :mod:`launcher` in a new session with a scrubbed environment, feeds stdin, reads stdout
and stderr up to a byte cap, and on the wall-clock deadline (or the cap) kills the whole process
group. The launcher's status pipe says which isolation layers took effect and how the program
ended; a killed launcher takes its pid namespace, and so every process the program started,
with it.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tokenflow.scoring.sandbox.cgroup import PidsCgroup

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launcher.py")
_SIGNAL_REASONS = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit",
                   signal.SIGKILL: "killed", signal.SIGSEGV: "crashed"}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Each maps to one rlimit (or the wall clock, or the output pipes)."""

    wall_s: float = 10.0
    """Wall-clock budget; past it the whole process group is killed."""
    cpu_s: int = 5
    """RLIMIT_CPU per process (SIGXCPU, then SIGKILL)."""
    memory_mb: int = 1024
    """RLIMIT_AS: address space per process; allocations beyond it fail (MemoryError)."""
    file_mb: int = 16
    """RLIMIT_FSIZE: largest file a process may write (SIGXFSZ)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    processes: int = 32
    """Processes the program may have at once: pids.max of its cgroup when one can be made,
    and RLIMIT_NPROC (which the kernel does not apply to root)."""
    output_bytes: int = 1 << 20
    """stdout + stderr kept; a program writing more is killed (reason ``output_limit``)."""


@dataclass
class SandboxResult:
    ok: bool
    """The program ran to completion with exit code 0."""
    reason: str | None
    """Why not ok: timeout, cpu_limit, memory_limit, file_size_limit, output_limit, killed,
    crashed, exit_code_N, setup_failed."""
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    wall_s: float
    workdir: str = ""
    """The (since removed) work dir: processes still inside it would be leftovers."""
    layers: tuple[str, ...] = ()
    """Isolation layers that took effect for this run (see :mod:`isolation`)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def scrubbed_env(workdir: str) -> dict[str, str]:
    """Nothing of the parent's environment (no tokens, no proxies), only what Python needs."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir,
            "TMPDIR": workdir, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


def run_program(code: str, *, stdin: str = "", files: dict[str, str] | None = None,
                limits: SandboxLimits = SandboxLimits(), namespaces: bool = True,
                cgroup: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh work dir holding ``files``; see the module doc."""
    workdir = tempfile.mkdtemp(prefix="tokenflow-sandbox-")
    os.chmod(workdir, 0o700)
    (Path(workdir) / "main.py").write_text(code, encoding="utf-8")
    for name, text in (files or {}).items():
        target = Path(workdir) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    pids = PidsCgroup.create(limits.processes) if cgroup else None
    cfg = {
        "workdir": os.path.realpath(workdir),
        "argv": [sys.executable, "-I", "-B", "main.py"],
        "env": scrubbed_env(workdir),
        "namespaces": namespaces,
        "cgroup": pids.path if pids else None,
        "limits": {"cpu_s": limits.cpu_s, "address_space_bytes": limits.memory_mb << 20,
                   "file_size_bytes": limits.file_mb << 20, "open_files": limits.open_files,
                   "processes": limits.processes},
    }
    try:
        return _supervise(cfg, stdin, limits)
    finally:
        if pids:
            pids.remove()
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(cfg: dict, stdin: str, limits: SandboxLimits) -> SandboxResult:
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(LAUNCHER), json.dumps(cfg), str(status_w)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=cfg["env"], cwd=cfg["workdir"], start_new_session=True, pass_fds=(status_w,),
        )
    finally:
        os.close(status_w)
    reason = None
    out = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    status_file = os.fdopen(status_r, "rb", buffering=0)
    sel.register(status_file, selectors.EVENT_READ, "status")
    try:
        if stdin:
            try:
                proc.stdin.write(stdin.encode())
            except BrokenPipeError:
                pass
        proc.stdin.close()
        deadline = start + limits.wall_s
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                out[key.data] += chunk
            if len(out["stdout"]) + len(out["stderr"]) > limits.output_bytes:
                reason = "output_limit"
                break
    finally:
        _kill_group(proc)
        sel.close()
        status_file.close()
        proc.stdout.close()
        proc.stderr.close()
    return _verdict(proc, out, reason, time.monotonic() - start, limits, cfg["workdir"])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session's process group (the launcher, the reaper, the program) and reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _limit_in_traceback(stderr: str) -> str | None:
    """A limit the program met as an exception (Python ignores SIGXFSZ, so an oversized write
    raises EFBIG rather than killing it)."""
    tail = stderr[-2000:]
    if "MemoryError" in tail:
        return "memory_limit"
    if "[Errno 27]" in tail:  # EFBIG: File too large
        return "file_size_limit"
    return None


def _verdict(proc, out: dict, reason: str | None, wall: float, limits: SandboxLimits,
             cfg_workdir: str) -> SandboxResult:
    layers, notes, exit_code, sig = [], [], None, None
    for line in bytes(out["status"]).decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        layers += event.get("layers", [])
        notes += event.get("notes", [])
        exit_code = event.get("exit", exit_code)
        sig = event.get("signal", sig)
    cap = limits.output_bytes
    stdout = bytes(out["stdout"][:cap]).decode(errors="replace")
    stderr = bytes(out["stderr"][:cap]).decode(errors="replace")
    if reason is None:
        if sig is not None:
            reason = _SIGNAL_REASONS.get(sig, f"signal_{sig}")
        elif exit_code is None:
            reason = "setup_failed"
            notes.append(f"launcher exited {proc.returncode} without a verdict: {stderr[-500:]}")
        elif exit_code != 0:
            reason = _limit_in_traceback(stderr) or f"exit_code_{exit_code}"
    return SandboxResult(ok=reason is None, reason=reason, exit_code=exit_code, signal=sig,
                         stdout=stdout, stderr=stderr, wall_s=wall, workdir=cfg_workdir, layers=tuple(layers), notes=tuple(notes))

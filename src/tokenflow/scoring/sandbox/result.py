"""What a run is given (``SandboxLimits``) and what it returns (``SandboxResult``), and the
verdict: how the program ended, from the launcher's status pipe and the launcher's exit."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field

_SIGNAL_REASONS = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit",
                   signal.SIGKILL: "killed", signal.SIGSEGV: "crashed"}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Each maps to one rlimit, a tmpfs quota, the wall clock or the pipes."""

    wall_s: float = 10.0
    """Wall-clock budget; past it every process of the run is killed."""
    cpu_s: int = 5
    """RLIMIT_CPU per process (SIGXCPU, then SIGKILL)."""
    memory_mb: int = 1024
    """RLIMIT_AS: address space per process; allocations beyond it fail (MemoryError)."""
    total_memory_mb: int = 2048
    """All processes of the run together, memfds and the work dir's files included: the memory
    limit of its cgroup (the kernel kills a process of the run past it; reason
    ``memory_limit``). Capped at a quarter of the machine's MemAvailable when the run starts."""
    file_mb: int = 16
    """RLIMIT_FSIZE: largest file a process may write (EFBIG)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    processes: int = 32
    """Processes the program may have at once: pids.max of its cgroup when one can be made,
    and RLIMIT_NPROC (which the kernel does not apply to root)."""
    output_bytes: int = 1 << 20
    """stdout + stderr kept; a program writing more is killed (reason ``output_limit``)."""
    workdir_mb: int = 64
    """Total size of the work dir (a tmpfs ``size=``), all files together (ENOSPC)."""
    workdir_files: int = 4096
    """Files and directories the work dir may hold (the tmpfs's ``nr_inodes=``; ENOSPC)."""


@dataclass
class SandboxResult:
    ok: bool
    """The program ran to completion with exit code 0."""
    reason: str | None
    """Why not ok: timeout, cpu_limit, memory_limit, file_size_limit, workdir_full,
    output_limit, killed, crashed, signal_N, exit_code_N, setup_failed."""
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    wall_s: float
    workdir: str = ""
    """The (since removed) host-side work dir: the tmpfs's mount point."""
    layers: tuple[str, ...] = ()
    """Isolation layers that took effect for this run (see :mod:`isolation`)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def _events(raw: bytes) -> list[dict]:
    events = []
    for line in raw.decode(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _limit_in_traceback(stderr: str) -> str | None:
    """A limit the program met as an exception (Python ignores SIGXFSZ, so an oversized write
    raises EFBIG rather than killing it; a full tmpfs raises ENOSPC)."""
    tail = stderr[-2000:]
    if "MemoryError" in tail:
        return "memory_limit"
    if "[Errno 27]" in tail:  # EFBIG: File too large
        return "file_size_limit"
    if "[Errno 28]" in tail:  # ENOSPC: the work dir's size or inode quota
        return "workdir_full"
    return None


def verdict(returncode: int, out: dict, reason: str | None, wall: float, limits: SandboxLimits,
            workdir: str) -> SandboxResult:
    """``out``: the bytes read from stdout, stderr and the status pipe. Under bubblewrap the
    launcher reports bwrap's exit status, which is the program's, 128 + N when signal N killed
    it; on the hand-written path the reaper reports exit or signal."""
    layers, notes, exit_code, sig, bwrap_exit = [], [], None, None, None
    for event in _events(bytes(out["status"])):
        layers += event.get("layers", [])
        notes += event.get("notes", [])
        exit_code = event.get("exit", exit_code)
        sig = event.get("signal", sig)
        bwrap_exit = event.get("bwrap_exit", bwrap_exit)
    cap = limits.output_bytes
    stdout = bytes(out["stdout"][:cap]).decode(errors="replace")
    stderr = bytes(out["stderr"][:cap]).decode(errors="replace")
    if bwrap_exit is not None and not (bwrap_exit == 1 and stderr.startswith("bwrap: ")):
        # else bwrap refused to set up and the program never ran: setup_failed below
        if bwrap_exit > 128:
            sig = bwrap_exit - 128
        else:
            exit_code = bwrap_exit
    if reason is None:
        if sig is not None:
            reason = _SIGNAL_REASONS.get(sig, f"signal_{sig}")
        elif exit_code is None:
            reason = "setup_failed"
            notes.append(f"launcher exited {returncode} without a verdict: {stderr[-500:]}")
        elif exit_code != 0:
            reason = _limit_in_traceback(stderr) or f"exit_code_{exit_code}"
    return SandboxResult(ok=reason is None, reason=reason, exit_code=exit_code, signal=sig,
                         stdout=stdout, stderr=stderr, wall_s=wall, workdir=workdir,
                         layers=tuple(dict.fromkeys(layers)), notes=tuple(notes))

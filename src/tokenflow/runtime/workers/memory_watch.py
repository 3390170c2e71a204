"""A worker's memory, watched from the parent: its peak resident memory, and whether the kernel's
out-of-memory killer ended it.

    WorkerHandle.check (every turn of the loop) ─► RssPeak.sample: /proc/<pid>/status VmHWM, at
        most once a second (the kernel's own high-water mark: a sample misses nothing but the
        last second before a death, and the figure outlives the process here)
    a worker dead by SIGKILL ─► OomCounters.moved(): the cgroup's ``oom_kill`` counter (v2
        ``memory.events``, v1 ``memory.oom_control``) or /proc/vmstat ``oom_kill``, against
        their values when the backend started ─► describe_death: "killed by the kernel's
        out-of-memory killer" only when one moved, its peak, the settings that bound it

Standard library only: this runs in the orchestrator, which never imports torch.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tokenflow.host_memory import read_status_kb

GB = 1e9
SAMPLE_EVERY_S = 1.0


class RssPeak:
    """One worker's peak resident memory in bytes, over every process it has had (``run_peak``)
    and for its current process (``process_peak``); sampled, never more than once a second."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S, clock=time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.run_peak = 0
        self.process_peak = 0
        self._next = 0.0

    def new_process(self) -> None:
        self.process_peak, self._next = 0, 0.0

    def sample(self, pid: int | None, force: bool = False) -> None:
        now = self.clock()
        if pid is None or (not force and now < self._next):
            return
        self._next = now + self.every_s
        kb = read_status_kb(pid)
        if kb:
            self.process_peak = max(self.process_peak, kb * 1024)
            self.run_peak = max(self.run_peak, self.process_peak)

    @staticmethod
    def gb(n: int) -> float | None:
        return round(n / GB, 3) if n else None


# ---- the kernel's out-of-memory counters ---------------------------------------------------------
def cgroup_memory_dir(self_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> tuple[Path, int] | None:
    """The memory cgroup this process (and so its workers) runs in, and its version (1 or 2)."""
    try:
        lines = Path(self_cgroup).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    base = Path(root)
    for line in lines:  # v1: "4:memory:/path" (a memory controller of its own)
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            for mount in (base / "memory", base / "memory,cpuset"):
                d = mount / parts[2].lstrip("/")
                if (d / "memory.oom_control").is_file():
                    return d, 1
    for line in lines:  # v2: "0::/path"
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            for mount in (base, base / "unified"):
                d = mount / parts[2].lstrip("/")
                if (d / "memory.events").is_file():
                    return d, 2
    return None


def read_counter(path: Path | str, key: str = "oom_kill") -> int | None:
    """``key``'s value in a "name value" file (``memory.events``, ``memory.oom_control``, /proc/vmstat)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == key:
                    return int(parts[1])
    except (OSError, ValueError):
        return None
    return None


def cgroup_limit_bytes(found: tuple[Path, int] | None = None) -> int | None:
    """The memory limit of this process's cgroup (None: none set, or unreadable)."""
    found = found if found is not None else cgroup_memory_dir()
    if found is None:
        return None
    d, version = found
    try:
        text = (d / ("memory.max" if version == 2 else "memory.limit_in_bytes")).read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        n = int(text)
    except ValueError:
        return None
    return n if n < 2 ** 62 else None  # v1's "no limit" is a page-rounded 2^63


class OomCounters:
    """The kernel's ``oom_kill`` counter when the run started; ``moved()`` says whether it rose.

    The workers' own cgroup's counter when it is readable (v2 ``memory.events.local``: kills of
    processes in exactly that cgroup, not in sandboxes below it; else ``memory.events``; v1
    ``memory.oom_control``); only without one the machine-wide /proc/vmstat, which also counts
    kills in every other cgroup of the machine."""

    def __init__(self, cgroup: tuple[Path, int] | None | str = "find", vmstat: str = "/proc/vmstat") -> None:
        found = cgroup_memory_dir() if cgroup == "find" else cgroup
        self.files: dict[str, Path] = {}
        if found is not None:
            d, version = found
            names = ("memory.events.local", "memory.events") if version == 2 else ("memory.oom_control",)
            path = next((d / n for n in names if read_counter(d / n) is not None), None)
            if path is not None:
                self.files["cgroup"] = path
        if not self.files:
            self.files["vmstat"] = Path(vmstat)
        self.start = {k: read_counter(p) for k, p in self.files.items()}

    def readable(self) -> bool:
        return any(v is not None for v in self.start.values())

    def moved(self) -> list[str]:
        """E.g. ["cgroup memory.events oom_kill 0 → 1"]; empty when none rose."""
        out = []
        for k, path in self.files.items():
            before, now = self.start[k], read_counter(path)
            if before is not None and now is not None and now > before:
                out.append(f"{path} oom_kill {before} → {now}")
        return out


# ---- what a worker's death says --------------------------------------------------------------------
def memory_settings(name: str, cfg) -> tuple[str, str]:
    """The settings that bound ``name``'s memory, and what to change."""
    if cfg is None:
        return "", ""
    if name.startswith("trainer"):
        t = cfg.trainer
        bound = (f"trainer.micro_batch_tokens = {t.micro_batch_tokens}, trainer.logprob_chunk_tokens = "
                 f"{t.logprob_chunk_tokens}, trainer.gradient_checkpointing = {str(t.gradient_checkpointing).lower()}, "
                 f"trainer.keep_host_memory = {str(t.keep_host_memory).lower()}, model.path = {cfg.model.path!r}")
        fix = ("lower trainer.micro_batch_tokens, turn on trainer.gradient_checkpointing (or trainer.lora_rank), "
               "set trainer.keep_host_memory = false, or use a smaller model")
    else:
        e = cfg.engine
        bound = (f"engine.max_num_seqs = {e.max_num_seqs}, engine.max_model_len = {e.max_model_len}, "
                 f"engine.max_num_batched_tokens = {e.max_num_batched_tokens}, sampling.max_tokens = "
                 f"{cfg.sampling.max_tokens}, model.path = {cfg.model.path!r}")
        fix = "lower engine.max_num_seqs or sampling.max_tokens / engine.max_model_len, or use a smaller model"
    return bound, fix


def describe_death(name: str, pid: int | None, code: int, peak: int, oom: OomCounters | None,
                   cfg=None) -> tuple[str, str]:
    """(message, cause) for a worker that exited with ``code`` (negative: killed by that signal).
    cause: "oom_killer", "sigkill", "signal" or "exit_code"."""
    who = f"the {name} process (pid {pid})"
    peak_txt = f"its peak resident memory was {peak / GB:.2f} GB" if peak else "its peak resident memory is unknown"
    if code != -signal.SIGKILL:
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
            return f"{who} died with exit code {code} ({sig}; {peak_txt})", "signal"
        return f"{who} died with exit code {code}", "exit_code"
    bound, fix = memory_settings(name, cfg)
    moved = oom.moved() if oom is not None else []
    limits = _machine_memory()
    if moved:
        msg = (f"{who} was killed by the kernel's out-of-memory killer ({'; '.join(moved)}); {peak_txt}{limits}. "
               f"What bounds it: {bound}. To fit: {fix}" if bound else
               f"{who} was killed by the kernel's out-of-memory killer ({'; '.join(moved)}); {peak_txt}{limits}")
        return msg, "oom_killer"
    why = ("no out-of-memory counter moved" if oom is not None and oom.readable()
           else "the kernel's out-of-memory counters are not readable here")
    msg = f"{who} died with exit code -9: killed by SIGKILL (maybe the out-of-memory killer: {why}); {peak_txt}{limits}"
    if bound:
        msg += f". If it was memory, what bounds it: {bound}; to fit: {fix}"
    return msg, "sigkill"


def _machine_memory() -> str:
    """" (machine: 15.6 GB total, cgroup limit 8.0 GB)" — what the worker had to fit in."""
    total = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    limit = cgroup_limit_bytes()
    parts = ([f"{total / GB:.1f} GB total"] if total else []) + ([f"cgroup limit {limit / GB:.1f} GB"] if limit else [])
    return f" (machine: {', '.join(parts)})" if parts else ""


def peaks_gb(workers) -> dict[str, float]:
    """``{worker name: peak resident GB}`` of the workers whose peak is known (local ones)."""
    out = {}
    for w in workers:
        peak = getattr(w, "rss", None)
        if peak is not None and peak.run_peak:
            out[w.name] = RssPeak.gb(peak.run_peak)
    return out


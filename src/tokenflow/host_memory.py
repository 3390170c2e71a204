"""Host memory a process holds but does not use: glibc's free heap pages, handed back.

Standard library only (ctypes), so any worker can call it: a CPU trainer after each step
(``trainer.keep_host_memory = false``), after a step that leaves it above
``trainer.keep_host_memory_gb`` (:func:`read_status_kb`) and after its last one, an engine
after each weight update. The other way, freed memory kept for the next step
(:func:`keep_freed_memory`: a CPU trainer's ``trainer.keep_host_memory``, a CPU engine's
``engine.keep_host_memory_mb``). And the memory oneDNN's kernel cache holds, bounded in a CPU
trainer or engine (:func:`limit_onednn_cache`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import sys

log = logging.getLogger(__name__)


def libc_function(name: str):
    """The C library's function ``name``, or None off Linux or where it has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The process's own symbols, libc's among them (find_library would run ldconfig).
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None  # not glibc (musl)


# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's ceiling on ``M_MMAP_THRESHOLD`` on 64-bit systems (half its heap size)."""

_kept = 0.0
"""Bytes of freed memory this process's heap keeps, as set by :func:`keep_freed_memory` (inf: all)."""


def keep_freed_memory(up_to: int | None = None) -> bool:
    """Keep the memory a step frees for the next step instead of handing it back to the kernel:
    glibc's trimming and its mmap for large blocks off (``up_to`` None: a CPU trainer's
    ``trainer.keep_host_memory``), or bounded (a CPU engine's ``engine.keep_host_memory_mb``:
    blocks under 32 MB from the heap, whose top keeps up to ``up_to`` bytes free). True when
    done, or when this process already keeps as much (a trainer and an engine in one process:
    the more generous setting stays); False where the C library is not glibc (macOS, musl) and
    nothing changed.

    A step allocates and frees the same blocks every time. glibc gives large freed blocks back
    to the kernel (``munmap``, trimming the top of the heap), so the next step touches fresh
    pages and pays a page fault per 4 KB; where faults are dear (a virtual machine: 6-35 µs each
    here) that adds up. A trainer: SmolLM2-135M, 4,096 tokens under bfloat16 autocast, one
    thread: the forward took 13-19 s while the heap grew (2M faults) and 4 s after (none). An
    engine: SmolLM2-135M's decode steps make and drop [rows, 49,152] float32 logits and the
    sampler's buffers of the same size (12.6 MB each at 64 rows), and the bench's workload took
    106-345 thousand faults a run (0.40-0.95 s of system time) against 2-12 thousand
    (0.06-0.10 s) with 128 MiB kept, once the heap had grown. Kept without bound, the heap grows to a step's peak once and is reused,
    and the process holds that peak; bounded, it holds at most ``up_to`` more than it uses."""
    global _kept
    want = math.inf if up_to is None else float(up_to)
    if want <= _kept:
        return True
    mallopt = _mallopt()
    if mallopt is None:
        return False
    if up_to is None:  # -1 disables trimming altogether; 0 disables mmap for large requests
        done = mallopt(_M_TRIM_THRESHOLD, -1) == 1 and mallopt(_M_MMAP_MAX, 0) == 1
    else:  # a fixed threshold also stops glibc's own, which moves with the blocks freed
        done = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
                and mallopt(_M_TRIM_THRESHOLD, min(int(up_to), 2**31 - 1)) == 1)
    if done:
        _kept = want
        log.debug("host memory: freed memory kept for the next step (up to %s bytes)", up_to or "all")
    return done


def release_freed_memory() -> bool:
    """Hand the free pages of every malloc arena back to the kernel (glibc's ``malloc_trim``).

    glibc trims only the top of the heap when memory is freed, so the free holes a step's
    activations leave between live blocks (gradients and AdamW's state allocated mid-step, a
    micro-batch's tensors of other sizes) stay resident: a SmolLM2-135M trainer on this
    example's variable-length micro-batches grew from 3.4 to 4.9 GB resident over four steps
    with 2.7 GB of it free, and ``malloc_trim`` brought it to 2.2 GB. True when done."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def read_status_kb(pid: int, key: str = "VmHWM", proc: str = "/proc") -> int | None:
    """A ``/proc/<pid>/status`` figure in kB (``VmHWM``: peak resident set; ``VmRSS``: resident now),
    or None if unreadable (off Linux). The orchestrator watches its workers' peaks with it
    (``runtime.workers.memory_watch``); a CPU trainer checks its own bound
    (``trainer.keep_host_memory_gb``)."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.cache
def _typed(name: str, argtypes: tuple, restype):
    """The C library's function ``name`` with its C signature, looked up once per process (a
    trainer calls ``malloc_trim`` every step, an engine after every weight update); None where
    `libc_function` finds none."""
    fn = libc_function(name)
    if fn is not None:
        fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def _mallopt():
    return _typed("mallopt", (ctypes.c_int, ctypes.c_int), ctypes.c_int)


def _malloc_trim():
    return _typed("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def limit_onednn_cache(capacity: int | None, device_type: str) -> bool:
    """Bound oneDNN's primitive cache (``trainer.onednn_cache_capacity``,
    ``engine.onednn_cache_capacity``) in a CPU worker's process. True when set here; False on
    another device, with None, or where the user's own ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is in
    the environment (it wins).

    oneDNN keeps a compiled kernel, with memory of its own, for every matrix-product shape it
    meets, up to 1,024 of them by default. A trainer's micro-batches of varied lengths, and an
    engine's batches of every size from 1 to ``max_num_seqs``, make new shapes all run long, so
    that memory grows: SmolLM2-135M on examples/laptop_math, the trainer process's peak after
    each of five steps was 4.0, 5.5, 5.8, 6.3, 6.8 GB with oneDNN's default and 4.0, 5.3, 5.5,
    5.7, 5.7 GB with 128; with 16 the whole run's trainer ended at 4.5-4.7 GB against 4.8-5.0
    with 128, at the same tokens/s (the kernels it drops are rebuilt, which costs less than the
    noise of a step's time here). oneDNN reads the setting when it builds its first kernel, so
    this acts in a process that has not run one yet: the runtime's workers, a fresh script."""
    if capacity is None or device_type != "cpu" or ONEDNN_CACHE_ENV in os.environ:
        return False
    os.environ[ONEDNN_CACHE_ENV] = str(capacity)
    return True

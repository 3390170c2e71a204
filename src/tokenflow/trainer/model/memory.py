"""Host memory of a CPU trainer: keep what a training step frees for the next step.

``trainer.onednn_cache_capacity`` bounds oneDNN's cache of CPU kernels
(`tokenflow.host_memory.limit_onednn_cache`).
``trainer.keep_host_memory`` (a CPU trainer only) turns glibc's heap trimming and its mmap for
large blocks off in the trainer process (:func:`keep_freed_memory`, which says why); turned off,
every step ends by handing the heap's free pages back (`tokenflow.host_memory`).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from tokenflow.host_memory import libc_function

log = logging.getLogger(__name__)

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Keep the memory a training step frees for the next step (``trainer.keep_host_memory``):
    glibc's trimming and its mmap for large blocks off in this process. True when done; False
    where the C library is not glibc (macOS, musl) and nothing changed.

    A step allocates and frees the same few GB of activations every time. glibc gives large
    freed blocks back to the kernel (``munmap``, trimming the top of the heap), so the next step
    touches fresh pages and pays a page fault per 4 KB; where faults are dear (a virtual machine:
    6-35 µs each here) that is seconds per step. SmolLM2-135M, 4,096 tokens under bfloat16
    autocast, one thread: the forward took 13-19 s while the heap grew (2M faults) and 4 s after
    (none). With both off, the heap grows to a step's peak once and is reused; the process keeps
    that peak resident (it reaches it every step anyway)."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # -1 disables trimming altogether; 0 disables mmap for large requests (mallopt(3)).
    done = mallopt(_M_TRIM_THRESHOLD, -1) == 1 and mallopt(_M_MMAP_MAX, 0) == 1
    if done:
        log.debug("host memory: trimming and mmap off (freed memory kept for the next step)")
    return done


def keep_host_memory(enabled: bool, device: torch.device) -> bool:
    """``trainer.keep_host_memory`` for a trainer on ``device``: only a CPU trainer's steps live
    in host memory. True when the allocator was tuned."""
    return device.type == "cpu" and enabled and keep_freed_memory()

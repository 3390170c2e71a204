"""Keeping the memory a training step frees for the next step, on a CPU trainer.

A step allocates and frees the same few GB of activations every time. glibc's malloc gives large
freed blocks back to the kernel (``munmap`` of blocks it mapped, trimming the top of the heap), so
the next step touches fresh pages and pays a page fault per 4 KB; where faults are dear (a virtual
machine: 7-35 µs each here) that is seconds per step. SmolLM2-135M, 4,096 tokens under bfloat16
autocast, one thread: the forward took 14-21 s while the heap grew (1.8M faults) and 4 s after
(none). With mmap and trimming off, the heap grows to a step's peak once and is reused; the
process keeps that peak resident (it reaches it every step anyway).

Layer 3 (trainer): the standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Turn off glibc's trimming and its mmap for large blocks in this process. True when done;
    False where the C library is not glibc (macOS, musl) and nothing changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # -1 disables trimming altogether; 0 disables mmap for large requests (mallopt(3)).
    done = mallopt(_M_TRIM_THRESHOLD, -1) == 1 and mallopt(_M_MMAP_MAX, 0) == 1
    if done:
        log.debug("host memory: trimming and mmap off (freed memory kept for the next step)")
    return done

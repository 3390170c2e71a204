"""Host memory of a CPU trainer: keep what a training step frees for the next step.

``trainer.onednn_cache_capacity`` bounds oneDNN's cache of CPU kernels
(`tokenflow.host_memory.limit_onednn_cache`).
``trainer.keep_host_memory`` (a CPU trainer only) turns glibc's heap trimming and its mmap for
large blocks off in the trainer process (`tokenflow.host_memory.keep_freed_memory`, which says
why); turned off, every step ends by handing the heap's free pages back
(`tokenflow.host_memory.release_freed_memory`).
"""

from __future__ import annotations

import torch

from tokenflow.host_memory import keep_freed_memory


def keep_host_memory(enabled: bool, device: torch.device) -> bool:
    """``trainer.keep_host_memory`` for a trainer on ``device``: only a CPU trainer's steps live
    in host memory. True when the allocator was tuned."""
    return device.type == "cpu" and enabled and keep_freed_memory()

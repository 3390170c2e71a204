"""Learning-rate schedule: linear warmup, then constant or cosine decay.

The multiplier for optimizer step s (0-based; step s is the (s+1)-th update):

* warmup (s < W): (s + 1) / W, so the first update already moves and step W − 1 reaches 1;
* constant: 1;
* cosine: r + (1 − r)·½(1 + cos(π·p)), p = (s − W) / (total − W) clipped to [0, 1], r = min_lr_ratio.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from tokenflow.config.trainer import TrainerConfig


def lr_multiplier(cfg: TrainerConfig) -> Callable[[int], float]:
    warmup, total, floor = cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio

    def mult(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return mult


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg))

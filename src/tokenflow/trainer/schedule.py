"""Learning-rate schedule: linear warmup, then constant or cosine decay.

The multiplier for optimizer step s (0-based; step s is the (s+1)-th update):

* warmup (s < W): (s + 1) / W, so the first update already moves and step W − 1 reaches 1;
* constant: 1;
* cosine: r + (1 − r)·½(1 + cos(π·p)), p = (s − W) / (total − W) clipped to [0, 1], r = min_lr_ratio.

On top of it, per batch, the staleness-aware factor :func:`staleness_lr_scale` (``trainer.staleness_lr``).
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


def staleness_lr_scale(mean_age: float, cfg: TrainerConfig) -> float:
    """The factor on a batch's lr when its trained tokens are ``mean_age`` versions old on
    average: min(1, (1 + ref) / (1 + ā)) with ref = ``staleness_lr_ref`` (1 when
    ``staleness_lr`` is off). The step shrinks with the data's age, as staleness-aware
    asynchronous SGD divides the step by the gradient's staleness (Zhang et al., IJCAI 2016)."""
    if not cfg.staleness_lr:
        return 1.0
    return min(1.0, (1.0 + cfg.staleness_lr_ref) / (1.0 + max(0.0, mean_age)))

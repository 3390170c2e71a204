"""The learner: packs rollouts, computes advantages and losses, steps the optimizer."""

from tokenflow.trainer.config import TrainerConfig, check_compatible
from tokenflow.trainer.trainer import Trainer

__all__ = ["Trainer", "TrainerConfig", "check_compatible"]

"""The learner: packs rollouts, computes advantages and losses, steps the optimizer."""

from tokenflow._lazy import lazy_getattr
from tokenflow.trainer.config import TrainerConfig, check_compatible

_EXPORTS = {"Trainer": "tokenflow.trainer.trainer"}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = ["Trainer", "TrainerConfig", "check_compatible"]

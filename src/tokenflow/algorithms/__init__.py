"""RL algorithms: advantage estimators, policy losses, off-policy corrections, KL, aggregation.

Pure functions over NumPy arrays (advantages) and flat per-token tensors (losses), so each can be
checked against a hand computation without a model. Definitions: ``docs/algorithms.md``.
"""

from tokenflow.algorithms.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    AdvantageResult,
    compute_advantages,
    estimate,
)
from tokenflow.algorithms.aggregation import GlobalCounts, aggregate, token_weights
from tokenflow.algorithms.config import AlgorithmConfig
from tokenflow.algorithms.corrections import apply_corrections, version_keep
from tokenflow.algorithms.kl import token_kl
from tokenflow.algorithms.losses import POLICY_LOSSES, value_loss
from tokenflow.algorithms.objective import LossTerms, TokenInputs, micro_batch_loss

__all__ = [
    "ADVANTAGES", "AdvantageInputs", "AdvantageResult", "AlgorithmConfig", "GlobalCounts",
    "LossTerms", "POLICY_LOSSES", "TokenInputs", "aggregate", "apply_corrections",
    "compute_advantages", "estimate", "micro_batch_loss", "token_kl", "token_weights",
    "value_loss", "version_keep",
]

"""RL algorithms: advantage estimators, policy losses, off-policy corrections, KL, aggregation.

Pure functions over NumPy arrays (advantages) and flat per-token tensors (losses), so each can be
checked against a hand computation without a model. Definitions: ``docs/algorithms.md``.

May import: layer 1 (``rollout``, ``config``, ``registry``, ``_lazy``); no model, engine or
trainer (layer 3 builds on it, not the other way round).
"""

from tokenflow._lazy import lazy_getattr
from tokenflow.config.algorithm import AlgorithmConfig

# Everything else imports torch; it loads on first use so that reading a config stays light.
_EXPORTS = {
    **dict.fromkeys(["ADVANTAGES", "AdvantageInputs", "AdvantageResult", "compute_advantages", "estimate"],
                    "tokenflow.algorithms.advantages"),
    **dict.fromkeys(["GlobalCounts", "aggregate", "token_weights"], "tokenflow.algorithms.aggregation"),
    **dict.fromkeys(["apply_corrections", "version_keep"], "tokenflow.algorithms.corrections"),
    "token_kl": "tokenflow.algorithms.kl",
    **dict.fromkeys(["POLICY_LOSSES", "value_loss"], "tokenflow.algorithms.losses"),
    **dict.fromkeys(["LossTerms", "TokenInputs", "micro_batch_loss"], "tokenflow.algorithms.objective"),
}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = ["AlgorithmConfig", *_EXPORTS]

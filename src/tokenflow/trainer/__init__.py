"""The learner: packs rollouts, computes advantages and losses, steps the optimizer.

``Trainer`` (``trainer``) runs one rollout batch; it composes collaborators, each given what it
needs: ``batch.MicroBatcher`` (packing), ``passes.NoGradPasses`` (π_prox, V_old, reference
log-probs), ``stepping.Stepper`` (forward/backward, optimizer step), ``weights.PolicyWeights``
(weights to engines and Hugging Face folders) and ``checkpointing.TrainingState`` (state to
resume). ``model/`` loads the policy and reference (LoRA, value head, fp32 head), runs them on a
micro-batch and tunes host memory; ``updates`` plans mini-batches, ``logprobs`` computes token
log-probs, ``keep_routing`` replays MoE routing, ``schedule`` the LR, ``metrics`` the step's
metrics; ``fsdp`` and ``distributed`` shard it over ranks.

May import: layers 1-3 (records and wiring, models and weights, learning); never tasks, scoring,
the runtime or front ends.
"""

from tokenflow._lazy import lazy_getattr
from tokenflow.config.trainer import TrainerConfig, check_compatible

_EXPORTS = {"Trainer": "tokenflow.trainer.trainer"}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = ["Trainer", "TrainerConfig", "check_compatible"]

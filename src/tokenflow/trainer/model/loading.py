"""Loading what the trainer trains: the policy, its KL reference, LoRA adapters.

The policy is any transformers ``AutoModelForCausalLM``, loaded from a folder or used in place;
its parameters are float32 (the optimizer's master weights; ``trainer.dtype`` is the autocast
dtype of the forward, :mod:`tokenflow.trainer.model.runner`). With ``fp32_lm_head`` the output
projection runs outside autocast in float32, because the log-probs that importance ratios are
built from are most sensitive to precision there. :func:`load_policy` is the whole sequence.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.config.trainer import TrainerConfig

log = logging.getLogger(__name__)


@dataclass
class PolicyModels:
    """What :func:`load_policy` built."""

    model: torch.nn.Module
    """The policy, in train mode (a peft model with LoRA)."""
    reference: torch.nn.Module | None
    """A frozen KL reference, when the objective has a KL term and it is not the LoRA base."""
    is_lora: bool
    stochastic: list[str]
    """What makes the policy's train-mode forward random (:func:`stochastic_parts`)."""


def load_policy(model, config: TrainerConfig, algorithm: AlgorithmConfig, device: torch.device) -> PolicyModels:
    """The policy (``model``: a path, a hub-style name or a ready model) and, for a KL term, its
    reference: float32 on ``device``, the fp32 head, activation checkpointing and LoRA adapters
    as ``config`` asks."""
    load = dict(trust_remote_code=config.trust_remote_code,
                attn_implementation=config.attn_implementation, device=device)
    policy = load_causal_lm(model, **load)
    is_lora = config.lora_rank is not None
    reference = None
    # With LoRA the base model *is* the reference: the policy with its adapters switched off
    # serves it, and no second copy is held.
    if algorithm.kl_coef > 0 and not (is_lora and algorithm.reference_model is None):
        ref = algorithm.reference_model
        reference = frozen_copy(policy if ref is None else load_causal_lm(ref, **load))
    for m in filter(None, [policy, reference] if config.fp32_lm_head else []):
        use_fp32_lm_head(m)
    if config.lean_activations:
        from tokenflow.trainer.model.lean_layers import use_lean_layers

        use_lean_layers(policy)
    if config.gradient_checkpointing:
        enable_checkpointing(policy)
    if is_lora:
        from tokenflow.trainer.model.lora import add_lora

        policy = add_lora(policy, config)
    policy.train()
    return PolicyModels(policy, reference, is_lora, stochastic_parts(policy))


def load_causal_lm(model, *, trust_remote_code: bool, attn_implementation: str, device: torch.device):
    """A path or hub-style name is loaded with transformers; a ready model is used (and trained)
    in place. Either way the parameters end up float32 on ``device``."""
    if isinstance(model, (str, Path)):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(model), dtype=torch.float32, attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "get_output_embeddings"):
        raise TypeError(f"expected a transformers causal LM or a path to one, got {type(model).__name__}")
    return model.to(device=device, dtype=torch.float32)


def _fp32_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=x.device.type, enabled=False):
        return F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())


def use_fp32_lm_head(model) -> None:
    """Make the output projection compute in float32 under autocast. Only the instance's forward
    changes, so parameter names (and checkpoints) are untouched."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"trainer.fp32_lm_head needs an nn.Linear output layer, got {type(head).__name__}")
    if getattr(model.config, "final_logit_softcapping", None):
        log.warning("fp32_lm_head: the model soft-caps its logits after the head; that part still "
                    "runs in the autocast dtype")
    head.forward = types.MethodType(_fp32_linear_forward, head)


def sparse_tied_embedding(model) -> bool:
    """Give the input embedding a sparse gradient where it shares its weight with the output
    head (SmolLM2, Qwen2.5's small models, ...). Its dense gradient is a [vocab, hidden] tensor
    of zeros with the micro-batch's few hundred rows filled in, made and summed into the head's
    gradient every micro-batch (two passes over 113 MB for a 49k × 576 vocabulary); a sparse one
    adds just those rows into the head's gradient, which stays dense, so the optimizer sees the
    same dense gradient. An untied embedding keeps its dense one (its own gradient would become
    sparse, which AdamW does not take). Returns whether it was changed."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if type(emb) is torch.nn.Embedding and head is not None and emb.weight is getattr(head, "weight", None) \
            and emb.weight.requires_grad:
        emb.sparse = True
        return True
    return False


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers causal LM (``model.layers`` of its decoder; a peft
    model's base model's), or []."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def enable_checkpointing(model) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant checkpoint)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name from transformers 5.x on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def frozen_copy(model):
    """A frozen, eval-mode deep copy (the KL reference when none is named)."""
    import copy

    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


# Config keys whose positive value makes a train-mode forward random (dropout of any kind, and
# Mixtral-style router jitter); transformers spells them attention_dropout, hidden_dropout,
# resid_pdrop, embd_pdrop, attn_pdrop, activation_dropout, router_jitter_noise, ...
_NOISE_SUFFIXES = ("dropout", "pdrop", "jitter_noise")


def stochastic_parts(model) -> list[str]:
    """What makes ``model``'s train-mode forward random: positive dropout / jitter values in its
    config (nested configs included) and dropout modules with p > 0 (LoRA dropout, a value
    head's). Empty for a deterministic forward. Conservative: a key that a model never reads
    only costs the trainer an extra no-grad pass."""
    found: list[str] = []

    def scan(cfg: dict, prefix: str) -> None:
        for key, value in cfg.items():
            if isinstance(value, dict):
                scan(value, f"{prefix}{key}.")
            elif (str(key).endswith(_NOISE_SUFFIXES) and isinstance(value, (int, float))
                  and not isinstance(value, bool) and value > 0):
                found.append(f"config.{prefix}{key} = {value}")

    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        scan(config.to_dict(), "")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append(f"{name or 'model'} (dropout p = {module.p})")
    return found

"""LoRA adapters on the policy (peft), and the merged weights the engines receive.

The trainer wraps its policy with ``get_peft_model``: the base weights are frozen and only the
adapters train (the optimizer sees only parameters that require grad). Engines know nothing of
LoRA: every push carries the merged weights W + (alpha/r)·B·A under the Hugging Face names, so
weight sync, checksums and exported checkpoints look exactly as for full training. Checkpoints
hold the merged model (for engines and evaluation) and, in the trainer state, the adapters;
resuming rebuilds the policy from the original base model and loads the adapters into it.
The KL reference, unless another model is named, is the base model: the policy's own forward
with the adapters switched off (``BaseModelRunner``), so no second copy of the weights is held.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def add_lora(model, config):
    """``model`` wrapped with fresh adapters as ``config`` (a ``TrainerConfig``) describes."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError('trainer.lora_rank needs peft: pip install "tokenflow-rl[lora]"') from e
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), bias="none")
    try:
        return get_peft_model(model, lora)
    except ValueError as e:  # peft names the modules it could not find
        raise ValueError(f"trainer.lora_target_modules {config.lora_target_modules}: {e}") from None


@torch.no_grad()
def merged_weights(peft_model) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, base weight + adapter delta), in the base model's state_dict order;
    adapter parameters themselves are left out. Nothing in the model changes."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    adapted = {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        owner, sep, leaf = name.rpartition(".base_layer.")
        if sep and leaf == "weight" and owner in adapted:
            layer = adapted[owner]
            tensor = tensor + sum(layer.get_delta_weight(a) for a in layer.active_adapters).to(tensor.dtype)
        yield (owner + "." + leaf if sep else name), tensor


def adapter_state(peft_model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}


def load_adapter_state(peft_model, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ValueError(f"checkpoint adapters do not fit this model's LoRA layout: {unexpected[:3]}")


class BaseModelRunner:
    """The reference runner of a LoRA policy: the policy's runner with the adapters disabled."""

    def __init__(self, runner) -> None:
        self.runner = runner

    def __getattr__(self, name):  # supports_rows, vocab_size, ... as the policy's runner
        return getattr(self.runner, name)

    @torch.no_grad()
    def logprobs(self, *args, **kwargs):
        with self.runner.model.disable_adapter():
            return self.runner.logprobs(*args, **kwargs)

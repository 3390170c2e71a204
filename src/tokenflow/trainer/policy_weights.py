"""The policy's weights out of the trainer: to the engines (`named_weights`, `place_weights`),
into checkpoints (`state_dict`, `load_state_dict`) and as a Hugging Face folder (`save_pretrained`).

A mixin of `Trainer` (and, overridden for sharded weights, of `FSDPTrainer`): it reads the
trainer's ``model``, ``value_head``, ``optimizer``, ``scheduler``, ``version``, ``tokenizer``,
``device`` and ``is_lora``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from tokenflow.trainer.checkpoint import rng_state, set_rng_state


class PolicyWeights:
    def named_weights(self, cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights under their Hugging Face names (the keys of the model's
        ``state_dict()``; never the value head), detached; on CPU unless ``cpu=False`` (then
        they stay where they are, as a GPU broadcast wants them)."""
        if self.is_lora:  # the merged weights, under the base model's names
            from tokenflow.trainer.lora import merged_weights

            named = merged_weights(self.model)
        else:
            named = self.model.state_dict().items()
        for name, tensor in named:
            yield name, tensor.detach().cpu() if cpu else tensor.detach()

    def place_weights(self, layout) -> int:
        """Move the policy's weights into fresh buffers laid out as the weight broadcast's
        buckets (``layout``), as Megatron keeps contiguous parameter buffers: a weight push then
        sends them as they are, with no packing copy. Values do not change, nor does anything
        that holds the parameters (the optimizer keeps the same objects). A weight tied to
        another keeps the first place; its other bucket is packed at each push. Returns the
        number of tensors placed."""
        from tokenflow.sync.layout import allocate_in_buckets

        if self.is_lora:  # pushes carry merged weights, computed afresh: nothing to place
            return 0
        current = self.model.state_dict(keep_vars=True)
        placed, moved = allocate_in_buckets(layout, self.named_weights(cpu=False), device=self.device), set()
        for name, view in placed.items():
            if id(current[name]) not in moved:
                moved.add(id(current[name]))
                current[name].data = view
        return len(moved)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: weights, optimizer, schedule, version, RNGs."""
        from tokenflow.trainer.lora import adapter_state

        return {
            # LoRA: the adapters only (the base is frozen and comes from the base model).
            "model": adapter_state(self.model) if self.is_lora else self.model.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        if self.is_lora:
            from tokenflow.trainer.lora import load_adapter_state

            load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        if self.value_head is not None:
            if state.get("value_head") is None:
                raise ValueError("checkpoint has no value head but trainer.value_head is true")
            self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        set_rng_state(state.get("rng") or {})

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the policy in Hugging Face format (config.json, model.safetensors, and the
        tokenizer when the trainer was given one) for evaluation and for engines to load."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.is_lora:  # a plain Hugging Face model with the adapters merged in
            self.model.get_base_model().save_pretrained(directory, state_dict=dict(self.named_weights()))
        else:
            self.model.save_pretrained(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)
        return directory

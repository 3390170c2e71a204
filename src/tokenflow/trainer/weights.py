"""The policy's weights out of the trainer: to the engines (`named_weights`, `place_weights`)
and as a Hugging Face folder (`save_pretrained`). Checkpoints are :mod:`tokenflow.trainer.checkpointing`.

`PolicyWeights` is given the policy, whether it is a LoRA model, its device and the tokenizer;
`FSDPTrainer` has its own for sharded weights (`tokenflow.trainer.fsdp.ShardedWeights`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch


class PolicyWeights:
    def __init__(self, *, model: torch.nn.Module, is_lora: bool, device: torch.device, tokenizer=None) -> None:
        self.model, self.is_lora, self.device, self.tokenizer = model, is_lora, device, tokenizer

    def named_weights(self, cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights under their Hugging Face names (the keys of the model's
        ``state_dict()``; never the value head), detached; on CPU unless ``cpu=False`` (then
        they stay where they are, as a GPU broadcast wants them)."""
        if self.is_lora:  # the merged weights, under the base model's names
            from tokenflow.trainer.model.lora import merged_weights

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

"""What a checkpoint holds of the trainer, to resume exactly: weights (the adapters only under
LoRA), value head, optimizer, LR schedule, policy version and the random-number generators
(torch, CUDA, NumPy, Python).

RNG state is kept to tensors, ints, floats, strings and tuples, so that ``trainer_state.pt`` loads with
``torch.load(weights_only=True)``: a checkpoint never needs the unpickler that runs code.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from tokenflow.trainer.model.value_head import ValueHead


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, cached))
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TrainingState:
    """``Trainer.state_dict`` / ``load_state_dict`` over the parts it is given."""

    def __init__(self, *, model: torch.nn.Module, is_lora: bool, value_head: ValueHead | None,
                 optimizer: torch.optim.Optimizer, scheduler) -> None:
        self.model, self.is_lora, self.value_head = model, is_lora, value_head
        self.optimizer, self.scheduler = optimizer, scheduler

    def state_dict(self, version: int) -> dict:
        """Everything needed to resume exactly: weights, optimizer, schedule, version, RNGs."""
        from tokenflow.trainer.model.lora import adapter_state

        return {
            # LoRA: the adapters only (the base is frozen and comes from the base model).
            "model": adapter_state(self.model) if self.is_lora else self.model.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": version,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict) -> int:
        """Restore ``state`` (a :meth:`state_dict`); returns its policy version."""
        if self.is_lora:
            from tokenflow.trainer.model.lora import load_adapter_state

            load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.load_value_head(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state.get("rng") or {})
        return int(state["version"])

    def load_value_head(self, state: dict) -> None:
        if self.value_head is not None:
            if state.get("value_head") is None:
                raise ValueError("checkpoint has no value head but trainer.value_head is true")
            self.value_head.load_state_dict(state["value_head"])

"""What every backend agrees on about recorded mixture-of-experts routing
(`Rollout.routed_experts`, Keep Routing): the integer type an expert id is stored in, and which
decoder layers of a Qwen-MoE-style model are sparse (the layers a routing row has entries for,
in the order of the trainer's routers).

Part of the seam; imports only NumPy.
"""

from __future__ import annotations

import numpy as np


def expert_id_dtype(num_experts: int) -> np.dtype:
    """The smallest integer type that holds an expert id (Rollout.routed_experts stays small)."""
    return np.dtype(np.uint8 if num_experts <= 256 else np.int16 if num_experts <= 32768 else np.int32)


def is_sparse_layer(config, index: int) -> bool:
    """Qwen-MoE layer placement: every ``decoder_sparse_step``-th layer, except ``mlp_only_layers``
    (Mixtral and OLMoE set neither: every layer)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return index not in (getattr(config, "mlp_only_layers", None) or []) and (index + 1) % step == 0

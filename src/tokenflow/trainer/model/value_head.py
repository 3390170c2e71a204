"""A scalar value head V(s_t) on the policy's final hidden state (PPO with GAE).

It reads the hidden state at the position that predicts token t (the state before action a_t),
so V_t lines up with the log-prob of a_t. It shares the policy trunk and is trained alongside it
through ``algorithm.value_coef``. It is kept outside the transformers model so the policy's
parameter names (weight sync, ``save_pretrained``) never include it.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        # Small initial values keep the first GAE advantages close to Monte-Carlo returns.
        nn.init.normal_(self.proj.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, H] → values [n], computed in float32 whatever the autocast dtype."""
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self.proj(hidden.float()).squeeze(-1)

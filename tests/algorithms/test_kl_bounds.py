"""The KL estimators where the log-ratio is clamped: a token the reference finds near-impossible
(or far likelier) contributes k3 at log-ratio ±20, not an overflow; k1 is never clamped."""

import math

import torch

from tokenflow.algorithms.kl import token_kl


def test_k3_clamps_the_log_ratio_to_plus_and_minus_twenty():
    logp = torch.tensor([0.0, -30.0, -1.0], dtype=torch.float64)
    ref = torch.tensor([-30.0, 0.0, -3.0], dtype=torch.float64)
    # log(π_ref/π) = −30 → −20, +30 → +20, −2 as it is: k3 = e^x − x − 1
    want = [math.exp(-20) + 20 - 1, math.exp(20) - 20 - 1, math.exp(-2) + 2 - 1]
    torch.testing.assert_close(token_kl(logp, ref, "k3"), torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)
    assert token_kl(logp, ref, "k1").tolist() == [30.0, -30.0, 2.0]

"""``trainer.fused_optimizer``: torch's fused AdamW where it exists, the same steps to rounding."""

import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.config.trainer import TrainerConfig
from tokenflow.trainer import Trainer
from tokenflow.trainer.trainer import fused_adam_supported
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model

LR = 2e-2


def steps(fused: bool, n: int = 1) -> tuple[Trainer, dict[str, torch.Tensor]]:
    cfg = TrainerConfig(device="cpu", lr=LR, grad_clip=None, micro_batch_tokens=48, fused_optimizer=fused,
                        weight_decay=0.01)
    t = Trainer(tiny_model(seed=2), cfg, AlgorithmConfig(), version=0)
    for i in range(n):
        t.train_step(on_policy(t.model, make_rollouts(seed=5 + i, groups=4, per_group=4, version=t.version)))
    return t, {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def test_the_fused_kernel_is_used_by_default_and_steps_as_the_default_implementation():
    fused, after_fused = steps(True)
    plain, after_plain = steps(False)
    assert fused.optimizer.defaults["fused"] is True and not plain.optimizer.defaults["fused"]
    # One step from the same weights and the same gradients (a second step would not compare:
    # where a gradient is near 0, Adam's m̂/√v̂ turns a rounding difference in the weights into
    # one of order lr). Both compute w ← w·(1 − lr·wd) − lr·m̂/(√v̂ + eps) in float32, in
    # different orders: a few units in the last place of the weight and of the update (≤ lr).
    # Bound: 8 ulps of (|w| + lr); measured at most 6e-8 here.
    for name, w in after_plain.items():
        bound = 8 * torch.finfo(torch.float32).eps * (w.abs() + LR)
        assert ((after_fused[name] - w).abs() <= bound).all(), name
    assert any((after_fused[k] != after_plain[k]).any() for k in after_plain)  # two kernels, really


def test_parameters_the_kernel_does_not_take_fall_back():
    cpu = torch.nn.Parameter(torch.zeros(2))
    assert fused_adam_supported([{"params": [cpu]}])
    assert not fused_adam_supported([{"params": [torch.nn.Parameter(torch.zeros(2, device="meta"))]}])
    assert not fused_adam_supported([{"params": [cpu, torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]}])

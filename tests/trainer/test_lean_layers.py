"""Lean activations: the swapped RMSNorms and gated MLPs give transformers' forward bit for bit,
gradients as close to a float64 computation as autograd's own, and keep less for the backward."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainer.trainer_testlib import tiny_model
from tokenflow.trainer.model.lean_layers import use_lean_layers


def _ids(model, rows=2, tokens=48):
    return torch.randint(0, model.config.vocab_size, (rows, tokens), generator=torch.Generator().manual_seed(1))


def _run(model, ids, autocast: bool):
    """Logits and every parameter's gradient of a log-likelihood, in float64 for comparing."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, use_cache=False).logits
    torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean().backward()
    return logits.detach(), {k: p.grad.double().clone() for k, p in model.named_parameters()}


def _rel(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in b)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bfloat16 autocast"])
def test_same_forward_and_gradients_to_rounding(autocast):
    plain = tiny_model(0)
    lean = copy.deepcopy(plain)
    assert use_lean_layers(lean) == 2 * 2 + 1 + 2  # two norms and an MLP per layer, the final norm
    ids = _ids(plain)
    _, truth = _run(copy.deepcopy(plain).double(), ids, False)
    logits_plain, grads_plain = _run(plain, ids, autocast)
    logits_lean, grads_lean = _run(lean, ids, autocast)
    assert torch.equal(logits_lean, logits_plain)  # the same ops in the same dtypes
    err_plain, err_lean, apart = _rel(grads_plain, truth), _rel(grads_lean, truth), _rel(grads_lean, grads_plain)
    if autocast:
        # bfloat16's own error (~1e-2 here) dwarfs the float32 roundings the two orders differ by
        assert apart < 0.01 * err_plain, (apart, err_plain)
    else:
        # both are float32 computations of the same sums, in different orders: each is within a
        # few float32 roundings (~4e-7 here) of float64, and so of the other
        assert err_lean <= 2 * err_plain and apart <= 2 * err_plain, (err_lean, err_plain, apart)


def _saved_bytes(model, ids) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward pass, parameters aside."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            kept[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids, use_cache=False).logits.sum().backward()
    return sum(kept.values())


def test_less_is_kept_for_the_backward_pass():
    plain = tiny_model(0)
    lean = copy.deepcopy(plain)
    use_lean_layers(lean)
    ids = _ids(plain)
    c, n = plain.config, ids.numel()
    # per layer, no longer kept: each norm's float32 x·rstd; the MLP's second bfloat16 cast of x,
    # silu(gate) and silu(gate)·up, and autocast's bfloat16 copies of its three weights
    fewer = c.num_hidden_layers * (2 * n * c.hidden_size * 4 + n * c.hidden_size * 2
                                   + 2 * n * c.intermediate_size * 2 + 3 * c.hidden_size * c.intermediate_size * 2)
    assert _saved_bytes(plain, ids) - _saved_bytes(lean, ids) >= fewer


def test_a_wrapped_projection_keeps_the_module_forward():
    """LoRA wraps the projections after the swap: the MLP then runs its own forward (the
    adapter's contribution is not bypassed)."""
    plain = tiny_model(0)
    lean = copy.deepcopy(plain)
    use_lean_layers(lean)

    class Wrapped(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1.0

    for model in (plain, lean):
        mlp = model.model.layers[0].mlp
        wrapped = Wrapped(mlp.up_proj.in_features, mlp.up_proj.out_features, bias=False)
        wrapped.weight = mlp.up_proj.weight
        mlp.up_proj = wrapped
    ids = _ids(plain)
    with torch.no_grad():
        assert torch.equal(lean(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_every_family_the_estimate_counts_is_swapped_in_a_real_model_of_that_family():
    """`lean_families` names classes by string for the memory estimate, which cannot import
    torch: a name transformers does not have (a typo, a rename) would leave a family unswapped
    while the estimate still subtracts its saving. A tiny model of each family the estimate
    counts has every norm and MLP swapped."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tokenflow.trainer.model.lean_families import FULL_FAMILIES, LEAN_CLASSES

    for family in sorted(FULL_FAMILIES):
        cfg = AutoConfig.for_model(family, vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=8)
        model = AutoModelForCausalLM.from_config(cfg)
        norm, mlp = LEAN_CLASSES[family]
        names = [type(m).__name__ for m in model.modules()]
        # an MLP and at least two norms per layer (Qwen3 norms queries and keys too), the final norm
        assert names.count(mlp) == 2 and names.count(norm) >= 2 * 2 + 1, (family, names)
        assert use_lean_layers(model) == names.count(mlp) + names.count(norm), family

"""Training through the official ``tinker`` SDK against a live service, on the tiny default model:
``forward_backward`` with each built-in loss and ``optim_step`` against a reference rebuilt from
the client's saved state (transformers + peft, tokenflow's loss code, torch's AdamW), a second
step with the SDK's other Adam parameters, and a save/load round trip that reproduces the next
step exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tinker.tinker_testlib import (datums, gradient_bound, logprob_bound, reference_loss, reference_model,
                                         saved_state, sdk_datum, token_logprobs)

RANK = 4
CONFIGS = {
    "cross_entropy": None,
    "importance_sampling": None,
    "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.15},
    "cispo": None,
    "dro": {"beta": 0.5},
}


@pytest.fixture(scope="module")
def start(service, client):
    """A LoRA client after one warm-up step (so both adapter matrices are non-zero), saved."""
    from tinker import types

    tc = client.create_lora_training_client(base_model="default", rank=RANK, seed=3).result()
    warm = [sdk_datum(t, i) for t, i in datums(20, [10, 7], seed=0, rl=False)]
    tc.forward_backward(warm, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    path = tc.save_state("start").result().path
    return path, saved_state(service[1], path)["weights"]


def _default_folder() -> str:
    from tokenflow.model_store.paths import resolve_model_path

    return resolve_model_path("default")


def _adapters(model) -> dict:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


@pytest.mark.parametrize("loss_fn", list(CONFIGS))
def test_forward_backward_and_an_adam_step_match_the_reference(service, client, start, loss_fn):
    from tinker import types

    path, adapters = start
    ref = reference_model(_default_folder(), RANK, adapters)
    rl = loss_fn != "cross_entropy"
    data = datums(20, [9, 14, 6], seed=11, rl=rl)
    rng = np.random.default_rng(5)
    lps, total, bound, coeff = [], 0.0, 0.0, 0.0
    for tokens, inputs in data:
        lp, logits = token_logprobs(ref, tokens.tolist(), inputs["target_tokens"].tolist())
        if rl:  # the sampler's log-probs: off by up to ±0.3, so ratios cross the clip range
            inputs["logprobs"] = (lp.detach().numpy() + rng.uniform(-0.3, 0.3, lp.shape[0])).astype(np.float32)
        tin = {k: torch.tensor(v) for k, v in inputs.items() if k != "target_tokens"}
        loss = reference_loss(loss_fn, lp, {k: v.float() for k, v in tin.items()}, CONFIGS[loss_fn] or {})
        # The loss's error is at most Σ_t |∂L/∂lp_t| times one log-prob's bound.
        (dl,) = torch.autograd.grad(loss, lp, retain_graph=True)
        coeff += dl.abs().sum().item()
        bound = max(bound, logprob_bound(ref, logits))
        lps.append(lp.detach())
        total = total + loss
    total.backward()
    params = [p for p in ref.parameters() if p.requires_grad]
    grads = [p.grad.clone() for p in params]
    # eps ten times the largest gradient: the step is lr·g/(|g| + eps), close to linear in g, so
    # a loss scaled by 2 moves it by about 2× (Adam alone would hide a scale).
    eps = 10 * max(g.abs().max().item() for g in grads)
    lr = 1e-2
    torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=eps, weight_decay=0.0).step()

    tc = client.create_training_client_from_state(path).result()  # fresh optimizer
    out = tc.forward_backward([sdk_datum(t, i) for t, i in data], loss_fn, loss_fn_config=CONFIGS[loss_fn]).result()
    tc.optim_step(types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=eps)).result()
    after = saved_state(service[1], tc.save_state(f"after-{loss_fn}").result().path)["weights"]

    for got, want in zip(out.loss_fn_outputs, lps):
        assert np.abs(got["logprobs"].to_numpy() - want.numpy()).max() <= bound
    total = float(total.detach())
    assert abs(out.metrics["loss:sum"] - total) <= coeff * bound + 1e-6 * abs(total)
    # One step moves a weight by lr·g/(|g|+eps), Lipschitz in g with constant lr/eps.
    step_bound = lr * gradient_bound(ref, grads) / eps
    want = _adapters(ref)
    moved = 0
    for k, v in want.items():
        diff = (after[k] - v).abs().max().item()
        assert diff <= step_bound + 4 * 2.0 ** -24 * v.abs().max().item(), (k, diff, step_bound)
        moved += int((after[k] != adapters[k]).any())
    assert moved == len(want)  # every adapter matrix took the step


def test_two_adam_steps_with_decay_and_clipping_match_torch(service, client, start):
    from tinker import types

    path, adapters = start
    ref = reference_model(_default_folder(), RANK, adapters)
    params = [p for p in ref.parameters() if p.requires_grad]
    data = datums(20, [12, 8], seed=21, rl=False)
    adam = dict(lr=2e-2, betas=(0.8, 0.9), weight_decay=0.1)
    clip = 0.05  # below the gradient's norm: the clip is active
    opt, bounds, eps = None, [], None
    for _ in range(2):
        for p in params:
            p.grad = None
        loss = sum(reference_loss("cross_entropy", token_logprobs(ref, t.tolist(), i["target_tokens"].tolist())[0],
                                  {"weights": torch.tensor(i["weights"])}, {}) for t, i in data)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        assert norm > clip
        grads = [p.grad for p in params]
        if opt is None:
            eps = max(g.abs().max().item() for g in grads)
            opt = torch.optim.AdamW(params, eps=eps, **adam)
        bounds.append(gradient_bound(ref, grads))
        opt.step()

    tc = client.create_training_client_from_state(path).result()
    sdk = [sdk_datum(t, i) for t, i in data]
    for _ in range(2):
        tc.forward_backward(sdk, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=adam["lr"], beta1=0.8, beta2=0.9, eps=eps,
                                       weight_decay=0.1, grad_clip_norm=clip)).result()
    after = saved_state(service[1], tc.save_state("two-steps").result().path)["weights"]
    # The update m̂/(√v̂ + eps) is 1/eps-Lipschitz in m̂ and in √v̂; each carries at most the
    # largest gradient error, over two steps: 4·lr·max δg/eps.
    bound = 4 * adam["lr"] * max(bounds) / eps
    for k, v in _adapters(ref).items():
        assert (after[k] - v).abs().max().item() <= bound + 4 * 2.0 ** -24 * v.abs().max().item(), k


def test_a_saved_state_with_its_optimizer_reproduces_the_next_step_exactly(service, client):
    from tinker import types

    data = [sdk_datum(t, i) for t, i in datums(20, [11, 9], seed=31, rl=False)]
    params = types.AdamParams(learning_rate=0.02)
    a = client.create_lora_training_client(base_model="default", rank=RANK, seed=7).result()
    a.forward_backward(data, "cross_entropy").result()
    a.optim_step(params).result()
    mid = a.save_state("mid").result().path
    a.forward_backward(data, "cross_entropy").result()
    a.optim_step(params).result()
    want = saved_state(service[1], a.save_state("a-next").result().path)

    b = client.create_training_client_from_state_with_optimizer(mid).result()
    b.forward_backward(data, "cross_entropy").result()
    b.optim_step(params).result()
    got = saved_state(service[1], b.save_state("b-next").result().path)
    assert got["weights"].keys() == want["weights"].keys()
    assert all(torch.equal(got["weights"][k], want["weights"][k]) for k in want["weights"])
    assert got["steps"] == want["steps"] == 2

    c = client.create_training_client_from_state(mid).result()  # weights only: Adam starts over
    c.forward_backward(data, "cross_entropy").result()
    c.optim_step(params).result()
    fresh = saved_state(service[1], c.save_state("c-next").result().path)
    assert not all(torch.equal(fresh["weights"][k], want["weights"][k]) for k in want["weights"])

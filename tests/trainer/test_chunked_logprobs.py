"""Chunked log-probs: the same numbers and gradients as the whole micro-batch at once, while no
more than chunk × vocabulary logits are ever kept for the backward pass."""

import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tokenflow.trainer.logprobs import SupportMask, chunked_token_logprobs, sampling_logits, token_logprobs
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model

N, H, V = 37, 8, 50


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    targets = torch.randint(0, V, (N,), generator=g)
    temperature = torch.rand(N, generator=g) + 0.5
    temperature[3] = 0.0  # greedy rows count as T = 1
    # Supports on rows in several chunks, each containing its own target.
    rows = torch.tensor([2, 9, 10, 11, 30])
    pair_rows = torch.cat([torch.full((4,), int(r)) for r in rows])
    pair_ids = torch.cat([torch.tensor([int(targets[r]), (int(targets[r]) + 1) % V, 7, 8]) for r in rows])
    support = SupportMask.build(rows, pair_rows, pair_ids, V)
    return hidden, head, targets, temperature, support


def _saved_numels(fn):
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sizes


def test_chunks_give_the_same_logprobs_entropies_and_gradients():
    grads = {}
    for chunk in (N, 10, 4, 1):
        hidden, head, targets, temperature, support = _inputs()
        (logp, ent), saved = _saved_numels(lambda: chunked_token_logprobs(
            hidden, head, targets, temperature, support, chunk=chunk, entropy_grad=True))
        (logp.sum() + 0.3 * ent.sum()).backward()
        grads[chunk] = (logp.detach(), ent.detach(), hidden.grad.clone(), head.weight.grad.clone())
        # Memory: nothing the size of chunk × V logits is kept beyond one chunk.
        assert max(saved) <= max(chunk * V, N * H), (chunk, max(saved))
    want = grads[N]
    hidden, head, targets, temperature, support = _inputs()
    plain = token_logprobs(head(hidden), targets, temperature, support)[0]
    assert torch.allclose(want[0], plain, atol=1e-6)
    for chunk in (10, 4, 1):
        for got, ref in zip(grads[chunk], want):
            assert torch.allclose(got, ref, atol=1e-5), chunk


def test_whole_micro_batch_keeps_every_logit_for_backward():
    # The reason to chunk: unchunked, the backward holds several N × V tensors.
    hidden, head, targets, temperature, support = _inputs()
    _, saved = _saved_numels(lambda: token_logprobs(head(hidden), targets, temperature, support, entropy_grad=True))
    assert max(saved) >= N * V


def test_entropy_without_a_gradient_is_the_guarded_one_on_masked_rows():
    # Without a gradient the entropy skips the guard against masked (−inf) logits: the same
    # values, finite on the rows a support truncates.
    hidden, head, targets, temperature, support = _inputs()
    logits = head(hidden).detach()
    guarded = token_logprobs(logits.requires_grad_(), targets, temperature, support, entropy_grad=True)[1]
    with torch.no_grad():
        plain = token_logprobs(logits, targets, temperature, support)[1]
    assert torch.isfinite(plain).all()
    assert torch.equal(plain, guarded.detach())  # the same products summed in the same order


def test_half_precision_logits_are_tempered_in_float32_in_one_pass():
    hidden, head, targets, temperature, support = _inputs()
    for dtype in (torch.bfloat16, torch.float16):
        logits = head(hidden).detach().to(dtype)
        got = sampling_logits(logits, temperature)
        t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
        assert got.dtype == torch.float32 and torch.equal(got, logits.float() / t.unsqueeze(-1))


def test_support_slices_reindex_their_rows():
    *_, support = _inputs()
    part = support.slice(9, 20)
    assert part.rows.tolist() == [0, 1, 2] and torch.equal(part.keep, support.keep[1:4])
    assert support.slice(12, 30) is None


def test_trainer_steps_match_with_small_chunks():
    cfg = dict(device="cpu", lr=1e-3, micro_batch_tokens=64)
    alg = AlgorithmConfig(kl_coef=0.05, entropy_coef=0.01)
    rollouts = on_policy(tiny_model(seed=3), make_rollouts(seed=4))
    whole = Trainer(tiny_model(seed=3), TrainerConfig(**cfg), alg)
    chunked = Trainer(tiny_model(seed=3), TrainerConfig(**cfg, logprob_chunk_tokens=5), alg)
    for _ in range(2):
        a, b = whole.train_step(rollouts), chunked.train_step(rollouts)
        for key in ("loss/total", "loss/policy", "loss/kl", "policy/entropy"):
            assert abs(a[key] - b[key]) < 1e-6, key
    for (n, wa), (_, wb) in zip(whole.named_weights(), chunked.named_weights()):
        assert torch.allclose(wa, wb, atol=1e-6), n

"""``trainer.compile_layers``: compiled decoder layers give the eager forward and gradients to
rounding, the trainer compiles before its first batch (no compile inside a step, whatever the
micro-batch's rows), and a compiler that cannot work leaves the eager layers training."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from tests.trainer.test_lean_layers import _ids, _rel, _run
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tokenflow.trainer.model.compiled import compile_layers, is_compiled, warm_up
from tokenflow.trainer.model.loading import decoder_layers
from tokenflow.trainer.model.runner import CausalLMRunner

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Each test compiles from scratch: graphs kept from another test would hide a compile (or
    # reach dynamo's per-function limit, past which it runs eagerly without saying so).
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bfloat16 autocast"])
def test_compiled_layers_give_the_eager_forward_and_gradients_to_rounding(autocast):
    eager = tiny_model(0)
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled, CPU) == 2
    ids = _ids(eager)
    _, truth = _run(copy.deepcopy(eager).double(), ids, False)
    exact, _ = _run(copy.deepcopy(eager).double(), ids, False)
    before = _graphs()
    logits_eager, grads_eager = _run(eager, ids, autocast)
    logits_compiled, grads_compiled = _run(compiled, ids, autocast)
    assert _graphs() > before  # the compiled path ran
    # Both compute the same sums with roundings of the same unit (float32's, or bfloat16's where
    # autocast rounds: the products' inputs and outputs), in other orders and fusions: each is
    # within that rounding error of float64, so the two are within twice the eager one's of each
    # other. Measured: float32 1.1e-7 (logits) and 4.5e-7 against 4.0e-7 (gradients); bfloat16
    # 1.84e-3 both (logits), 7.98e-3 against 7.89e-3 (gradients).
    err_eager = (logits_eager.double() - exact).abs().max().item()
    err_compiled = (logits_compiled.double() - exact).abs().max().item()
    assert err_compiled <= 2 * err_eager, (err_compiled, err_eager)
    assert (logits_compiled - logits_eager).abs().max().item() <= 2 * err_eager
    g_eager, g_compiled, apart = _rel(grads_eager, truth), _rel(grads_compiled, truth), _rel(grads_compiled, grads_eager)
    assert g_compiled <= 2 * g_eager and apart <= 2 * g_eager, (g_compiled, g_eager, apart)


def _trainer(**kw) -> Trainer:
    cfg = TrainerConfig(device="cpu", lr=1e-3, compile_layers=True, pack_sequences=False,
                        micro_batch_tokens=40, **kw)
    return Trainer(tiny_model(seed=2), cfg, AlgorithmConfig(), version=0)


@pytest.mark.parametrize("same_prompt", [False, True], ids=["own prompts", "shared prompts"])
@pytest.mark.parametrize("kw", [{}, {"mini_batches": 2}], ids=["one step a batch", "no-grad pass for pi_prox"])
def test_the_trainer_compiles_before_its_first_batch_and_not_inside_a_step(kw, same_prompt):
    trainer = _trainer(**kw)
    layers = decoder_layers(trainer.model)
    assert layers and all(is_compiled(layer) for layer in layers)
    rows = []
    batcher = trainer.batcher

    def counting(seqs):
        mbs = batcher(seqs)
        rows.extend(mb.num_rows for mb in mbs)
        return mbs

    trainer.batcher = counting
    # behaviour log-probs from an eager copy of the same weights (a no-grad pass through the
    # compiled layers would compile a graph of its own)
    rollouts = on_policy(tiny_model(seed=2), make_rollouts(seed=5, groups=4 * (1 + same_prompt), per_group=4 // (1 + same_prompt),
                                                           same_prompt=same_prompt))
    compiled = _graphs()
    m = trainer.train_step(rollouts)
    assert (m["perf/shared_prompt_tokens"] > 0) == same_prompt  # rows with their own mask were trained
    if not kw:
        assert 1 in rows and max(rows) > 1, rows  # both kinds of micro-batch were trained
    assert _graphs() == compiled  # the start-up compile covered them
    # the compiled layers' log-probs of on-policy tokens are the float64 reference's (float32
    # rounding, as in test_engine_parity)
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5


def test_compiling_does_not_draw_from_the_runs_random_numbers():
    model = tiny_model(seed=2)
    for layer in decoder_layers(model):
        layer.self_attn.attention_dropout = 0.5  # a train-mode forward that draws (the warm-up's too)
    compile_layers(model, CPU, backend="eager")  # what is tested is the warm-up: dynamo, no C++ compile
    torch.manual_seed(7)
    seeded = torch.random.get_rng_state()
    warm_up(CausalLMRunner(model, CPU, "float32"), model.config.vocab_size)
    assert is_compiled(decoder_layers(model)[0]) and _graphs() > 0
    assert torch.equal(seeded, torch.random.get_rng_state())


def test_a_compiler_that_fails_leaves_the_eager_layers_training(caplog):
    import torch._inductor.config as inductor

    # no cache either: a cached kernel would skip the compiler
    with inductor.patch({"fx_graph_cache": False, "cpp.cxx": (None, "/nonexistent/c++")}), \
            caplog.at_level(logging.WARNING, logger="tokenflow.trainer.model.compiled"):
        trainer = _trainer()
    assert "compiling failed" in caplog.text and "the layers run eagerly" in caplog.text
    assert all(not is_compiled(layer) for layer in decoder_layers(trainer.model))
    m = trainer.train_step(on_policy(trainer.model, make_rollouts(seed=5, groups=4, per_group=4)))
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5 and trainer.version == 1


def test_without_a_cpp_compiler_the_layers_stay_eager(monkeypatch, caplog):
    monkeypatch.setenv("PATH", "")
    model = tiny_model(0)
    with caplog.at_level(logging.WARNING, logger="tokenflow.trainer.model.compiled"):
        assert compile_layers(model, CPU) == 0
    assert "no C++ compiler" in caplog.text
    assert all(not is_compiled(layer) for layer in decoder_layers(model))

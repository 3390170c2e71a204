"""Engine behaviour: reproducibility, batch invariance, stops, streaming, control, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.engine.engine_testlib import VOCAB, hf_model, make_engine
from tokenflow.engine import (
    Engine,
    EngineConfig,
    InvalidRequest,
    RolloutEngine,
    SamplingParams,
)


@pytest.fixture(scope="module")
def hf():
    return hf_model("llama", seed=5)


def tokens_of(engine, prompt, params):
    return [r.completion_ids.tolist() for r in engine.generate([prompt], params)[0]]


@pytest.mark.slow
def test_same_seed_same_tokens_whatever_the_batch(hf):
    params = SamplingParams(temperature=1.0, top_p=0.95, n=3, max_tokens=10, seed=42, ignore_eos=True)
    alone = tokens_of(make_engine(hf), [5, 6, 7, 8], params)
    assert len({tuple(t) for t in alone}) == 3  # the n samples differ from each other
    engine = make_engine(hf, max_num_seqs=4)
    noise = SamplingParams(temperature=1.0, n=2, max_tokens=7, ignore_eos=True)
    out = engine.generate([[9, 9, 9], [5, 6, 7, 8], list(range(20, 40))], [noise, params, noise])
    assert [r.completion_ids.tolist() for r in out[1]] == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, n=3, max_tokens=10, seed=43, ignore_eos=True)
    assert tokens_of(make_engine(hf), [5, 6, 7, 8], other_seed) != alone


@pytest.mark.slow
def test_engine_seed_makes_unseeded_requests_reproducible(hf):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    a = tokens_of(make_engine(hf, seed=1), [3, 4, 5], params)
    assert a == tokens_of(make_engine(hf, seed=1), [3, 4, 5], params)
    assert a != tokens_of(make_engine(hf, seed=2), [3, 4, 5], params)


@pytest.mark.slow
def test_stop_token_ids_and_eos(hf):
    engine = make_engine(hf)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    free = tokens_of(engine, [10, 11, 12], greedy)[0]
    stop_at = free[3]
    cut = free.index(stop_at) + 1
    r = engine.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_at,),
                                                       ignore_eos=True))[0][0]
    assert r.completion_ids.tolist() == free[:cut] and r.finish_reason == "stop"
    # The config's EOS (id 2) ends a completion unless ignore_eos.
    engine.eos_token_ids = frozenset({stop_at})
    engine._limits.eos_token_ids = engine.eos_token_ids
    r = engine.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=12))[0][0]
    assert r.completion_ids.tolist() == free[:cut] and r.finish_reason == "stop"


def test_rollouts_stream_out_as_they_finish(hf):
    engine = make_engine(hf)
    engine.add_request([3, 4], SamplingParams(max_tokens=2, ignore_eos=True), "short")
    engine.add_request([3, 4], SamplingParams(max_tokens=20, ignore_eos=True), "long")
    seen = []
    while engine.has_unfinished():
        for r in engine.step():
            seen.append((r.request_id, engine.num_running))
    assert seen == [("short", 1), ("long", 0)]


@pytest.mark.slow
def test_bad_requests_are_refused_without_disturbing_others(hf):
    engine = make_engine(hf, max_model_len=32)
    good = SamplingParams(temperature=0.8, n=2, max_tokens=6, seed=3, ignore_eos=True)
    ref = tokens_of(make_engine(hf, max_model_len=32), [4, 5, 6], good)
    engine.add_request([4, 5, 6], good, "good")
    engine.step()
    bad = [
        ([1] * 32, SamplingParams(), "max_model_len"),
        ([1, 2], SamplingParams(top_p=0), "top_p"),
        ([1, 2], SamplingParams(temperature=-1), "temperature"),
        ([1, 2], SamplingParams(n=0), "n must"),
        ([1, 2], SamplingParams(stop_token_ids=(VOCAB,)), "stop_token_ids"),
        ([1, VOCAB + 5], SamplingParams(), "prompt_ids"),
        ([], SamplingParams(), "empty"),
    ]
    for prompt, params, message in bad:
        with pytest.raises(InvalidRequest, match=message):
            engine.add_request(prompt, params)
    with pytest.raises(InvalidRequest, match="already running"):
        engine.add_request([1, 2], SamplingParams(), "good")
    assert engine.num_waiting == 0 and engine.num_running == 2
    out = []
    while engine.has_unfinished():
        out += engine.step()
    assert sorted((r.sample_index, r.completion_ids.tolist()) for r in out) == list(enumerate(ref))


def test_context_limit_ends_with_length(hf):
    engine = make_engine(hf, max_model_len=12)
    r = engine.generate([[3] * 9], SamplingParams(max_tokens=50, ignore_eos=True))[0][0]
    assert r.num_tokens == 3 and r.finish_reason == "length"


def test_pause_resume_and_abort(hf):
    engine = make_engine(hf)
    a = engine.add_request([3, 4, 5], SamplingParams(n=2, max_tokens=30, ignore_eos=True))
    b = engine.add_request([6, 7], SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()
    engine.step()
    engine.pause()
    assert engine.step() == [] and engine.stats.decode_steps == 1
    assert engine.abort(a) == 2
    out = engine.step()  # paused, but aborted partials are handed out
    assert sorted((r.request_id, r.finish_reason, r.num_tokens) for r in out) == [(a, "abort", 2), (a, "abort", 2)]
    engine.resume()
    rest = []
    while engine.has_unfinished():
        rest += engine.step()
    assert [(r.request_id, r.finish_reason, r.num_tokens) for r in rest] == [(b, "length", 5)]
    assert engine.abort("unknown") == 0


def test_load_from_folder_with_tokenizer_and_stop_strings(hf, tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w2", pad_token="w0")
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    engine = Engine(tmp_path, EngineConfig(device="cpu"))
    assert engine.tokenizer is not None and 2 in engine.eos_token_ids
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    r = engine.generate([[10, 11, 12]], greedy)[0][0]
    assert r.completion_ids.tolist() == tokens_of(make_engine(hf), [10, 11, 12], greedy)[0]
    assert r.text == " ".join(f"w{t}" for t in r.completion_ids if t not in (0, 2))
    words = r.text.split()
    stop = f"{words[2]} {words[3]}"
    cut = next(i for i in range(len(words)) if stop in " ".join(words[: i + 1])) + 1
    s = engine.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                       stop=(stop,)))[0][0]
    assert s.finish_reason == "stop" and s.completion_ids.tolist() == r.completion_ids.tolist()[:cut]


def test_unsupported_architecture_names_the_supported_ones():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM.*Mistral"):
        Engine.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2), config=EngineConfig(device="cpu"))


def test_threads_and_stats(hf):
    before = torch.get_num_threads()
    try:
        engine = make_engine(hf, threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert isinstance(engine, RolloutEngine)
    engine.generate([[3, 4, 5], [6, 7]], SamplingParams(n=2, max_tokens=4, ignore_eos=True))
    st = engine.stats
    assert st.tokens_generated == 16 and st.prefill_tokens == 5
    assert st.decode_steps == 3 and st.prefill_steps == 1
    assert st.last_step_kind == "decode" and st.mean_decode_step_seconds > 0


def test_from_config_dict_and_context_length_rules(hf):
    engine = Engine.from_config(hf.config.to_dict(), hf.state_dict(), EngineConfig(device="cpu"))
    prompt = [3, 4, 5, 6]
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert tokens_of(engine, prompt, greedy) == tokens_of(make_engine(hf), prompt, greedy)
    from transformers import MistralConfig

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                        sliding_window=48)
    # A sliding window does not cap the context: windowed layers mask what lies behind it.
    assert Engine.from_config(cfg, config=EngineConfig(device="cpu")).max_model_len == 128
    with pytest.raises(ValueError, match="max_position_embeddings 128"):
        make_engine(hf, max_model_len=1000)


@pytest.mark.slow
def test_weight_update_from_another_thread_lands_between_steps(hf):
    import threading
    import time

    engine = make_engine(hf)
    engine.add_request([3, 4, 5], SamplingParams(n=2, max_tokens=40, ignore_eos=True))
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    started = threading.Event()
    worker = threading.Thread(target=lambda: (started.wait(), engine.update_weights(state, version=1)))
    worker.start()
    out = []
    while engine.has_unfinished():
        out += engine.step()
        if engine.stats.decode_steps == 3:
            started.set()
        time.sleep(0.002)  # the generation loop's other work; lets the sync thread in
    worker.join()
    assert len(out) == 2 and engine.version == 1
    for r in out:
        assert r.num_tokens == 40 and r.versions[0] == 0 and r.versions[-1] == 1
        assert (np.diff(r.versions) >= 0).all()

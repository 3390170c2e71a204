"""A complete Llama config.json is read without transformers' config classes
(`tokenflow.engine.loading.plain_config`): every attribute the engine reads is what transformers' config
gives, an engine built from it generates the same tokens and log-probs, and anything the plain
reader cannot vouch for goes through AutoConfig."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.engine.builtin.models.rope import rope_parameters
from tokenflow.engine.loading.plain_config import PlainConfig, read_plain_llama_config
from tokenflow.model_store import resolve_model_path

from .engine_testlib import VOCAB, family_config, randomize

# Every config attribute the built-in engine reads (engine/builtin/models, llm_engine, loader), by name.
ENGINE_READS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                "max_position_embeddings", "rms_norm_eps", "vocab_size", "tie_word_embeddings",
                "attention_bias", "mlp_bias", "layer_types", "sliding_window", "eos_token_id")
_ABSENT = object()

LLAMAS = {
    "shipped-like": {},
    "gqa, head_dim != hidden/heads, biases, untied": dict(num_key_value_heads=2, head_dim=24, attention_bias=True,
                                                         mlp_bias=True, tie_word_embeddings=False),
    "other rope theta and eps, eos list": dict(rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                                               rms_norm_eps=1e-5, eos_token_id=[2, 3]),
}


def _llama(tmp_path, **overrides):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = LlamaConfig(**{**base, **overrides})
    torch.manual_seed(0)
    model = randomize(AutoModelForCausalLM.from_config(config).eval(), seed=0)
    model.save_pretrained(tmp_path)
    return tmp_path, model


def _same_reads(plain, hf) -> None:
    for name in ENGINE_READS:
        mine, theirs = getattr(plain, name, _ABSENT), getattr(hf, name, _ABSENT)
        assert mine == theirs, f"{name}: plain {mine!r}, transformers {theirs!r}"
    assert rope_parameters(plain) == rope_parameters(hf)


@pytest.mark.parametrize("case", list(LLAMAS))
def test_a_saved_llama_reads_the_same_without_transformers(tmp_path, case):
    folder, _ = _llama(tmp_path, **LLAMAS[case])
    plain = read_plain_llama_config(folder)
    assert isinstance(plain, PlainConfig)
    _same_reads(plain, AutoConfig.from_pretrained(folder))


@pytest.mark.parametrize("name", ["default", "default-tool"])
def test_the_shipped_models_read_the_same_without_transformers(name):
    folder = resolve_model_path(name)
    plain = read_plain_llama_config(folder)
    assert isinstance(plain, PlainConfig)
    _same_reads(plain, AutoConfig.from_pretrained(folder))


def test_an_engine_from_the_plain_config_generates_what_one_from_transformers_does(tmp_path):
    folder, model = _llama(tmp_path, **LLAMAS["gqa, head_dim != hidden/heads, biases, untied"])
    cfg = EngineConfig(device="cpu", dtype="float32", threads=1, max_num_seqs=4, seed=0)
    plain = Engine(folder, cfg)
    assert isinstance(plain.hf_config, PlainConfig)
    reference = Engine.from_config(AutoConfig.from_pretrained(folder), model.state_dict(), cfg)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 11, 8)]
    params = SamplingParams(temperature=1.0, n=2, max_tokens=12, ignore_eos=True, seed=1)
    for a, b in zip(plain.generate(prompts, params), reference.generate(prompts, params)):
        for x, y in zip(a, b):
            assert x.completion_ids.tolist() == y.completion_ids.tolist()
            np.testing.assert_array_equal(x.logprobs, y.logprobs)  # the same model, op for op


def _edited(folder, edit) -> None:
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("why", ["another family", "scaled rope", "a value left to transformers",
                                 "v4 rope keys", "another architecture"])
def test_what_the_plain_reader_cannot_vouch_for_goes_through_transformers(tmp_path, why):
    if why == "another family":
        family_config("qwen3").save_pretrained(tmp_path)
    elif why == "scaled rope":
        family_config("llama").save_pretrained(tmp_path)  # llama3 rope
    else:
        _llama(tmp_path)
        _edited(tmp_path, {
            "a value left to transformers": lambda raw: raw.pop("head_dim"),
            "v4 rope keys": lambda raw: raw.update(rope_theta=10000.0),
            "another architecture": lambda raw: raw.update(architectures=["LlamaForSequenceClassification"]),
        }[why])
    assert read_plain_llama_config(tmp_path) is None
    # ... and the engine still loads it (through AutoConfig) where it supports it.
    if why in ("a value left to transformers", "v4 rope keys"):
        engine = Engine(tmp_path, EngineConfig(device="cpu", threads=1))
        assert not isinstance(engine.hf_config, PlainConfig)


def test_the_shipped_tokenizer_loads_as_autotokenizer_loads_it():
    folder = resolve_model_path("default-tool")
    engine = Engine(folder, EngineConfig(device="cpu", threads=1))
    theirs = AutoTokenizer.from_pretrained(folder)
    mine = engine.tokenizer
    assert type(mine) is type(theirs)
    assert mine.get_vocab() == theirs.get_vocab() and mine.all_special_tokens == theirs.all_special_tokens
    assert mine.chat_template == theirs.chat_template and mine.eos_token_id == theirs.eos_token_id
    messages = [{"role": "user", "content": "12*34?"}]
    assert mine.apply_chat_template(messages, add_generation_prompt=True) == \
        theirs.apply_chat_template(messages, add_generation_prompt=True)


@pytest.mark.slow
def test_loading_the_shipped_model_imports_no_transformers_config_class():
    """What the fork server's preload leaves out (`tokenflow.runtime.backends.local.preload`), the engine must
    not import on its way to the first token."""
    code = ("import sys\n"
            "from tokenflow.model_store import resolve_model_path\n"
            "from tokenflow.engine import Engine, EngineConfig\n"
            "Engine(resolve_model_path('default'), EngineConfig(device='cpu', threads=1))\n"
            "print(sorted(m for m in ('transformers.activations', 'transformers.models.llama.configuration_llama',"
            " 'transformers.models.auto.tokenization_auto') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

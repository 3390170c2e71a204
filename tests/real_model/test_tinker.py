"""`tokenflow tinker` on the real model through the official SDK: a LoRA training client on
SmolLM2 whose forward log-probs are transformers' (the derived float32 bound), compute_logprobs
on the base model, a step and a snapshot whose samples carry the updated model's log-probs; and
(where tinker-cookbook is installed: scripts/tinker_env.sh) two steps of its math_rl recipe,
unmodified, against the service."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.real_model.real_testlib import QUESTIONS, chat_ids, float32_bounds, hf_logprobs

pytestmark = pytest.mark.real_model
tinker = pytest.importorskip("tinker")


@pytest.fixture(scope="module")
def service(tmp_path_factory, smollm2):
    from tokenflow.serve.server import BackgroundServer
    from tokenflow.tinker.app import create_app
    from tokenflow.tinker.service import Settings, TinkerService

    os.environ.setdefault("TINKER_API_KEY", "tml-test")
    svc = TinkerService(Settings(root=str(tmp_path_factory.mktemp("tinker-real")), threads=1))
    with BackgroundServer(create_app(svc)) as server:
        yield server.url, svc
    svc.close()


def _hf_lp(model, ids: list[int]) -> tuple[np.ndarray, torch.Tensor]:
    """transformers' log-prob of every token after the first, and the logits (real_testlib's)."""
    logits, lp = hf_logprobs(model, ids[:1], ids[1:])
    return lp.numpy(), logits


def test_a_lora_client_on_smollm2_trains_and_samples_with_transformers_logprobs(service, smollm2, hf_smollm2, tokenizer):
    from tinker import types

    from tokenflow.tinker import store

    with tinker.ServiceClient(base_url=service[0]) as sc:
        tc = sc.create_lora_training_client(base_model="smollm2-135m-instruct", rank=8, seed=0).result()
        assert tc.get_tokenizer().encode("hello") == tokenizer.encode("hello")  # resolved offline
        rows = []
        for q in QUESTIONS[:2]:
            ids = chat_ids(tokenizer, q) + tokenizer.encode("Fine.")
            rows.append(ids)
        data = [types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": np.array(ids[1:]), "weights": np.ones(len(ids) - 1, np.float32)})
                for ids in rows]
        out = tc.forward_backward(data, "cross_entropy").result()
        for ids, got in zip(rows, out.loss_fn_outputs):  # fresh adapters (B = 0): the base model
            want, logits = _hf_lp(hf_smollm2, ids)
            max_bound, _ = float32_bounds(hf_smollm2, logits)
            assert np.abs(got["logprobs"].to_numpy() - want).max() <= max_bound

        base = sc.create_sampling_client(base_model="smollm2-135m-instruct").result()
        lps = base.compute_logprobs(types.ModelInput.from_ints(rows[0])).result()
        want, logits = _hf_lp(hf_smollm2, rows[0])
        assert lps[0] is None
        assert np.abs(np.asarray(lps[1:], np.float64) - want).max() <= float32_bounds(hf_smollm2, logits)[0]

        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        path = tc.save_weights_for_sampler("step-1").result().path
        sampler = sc.create_sampling_client(model_path=path).result()
        prompt = chat_ids(tokenizer, QUESTIONS[3])
        res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                             sampling_params=types.SamplingParams(max_tokens=6, seed=3)).result()
        from transformers import AutoModelForCausalLM

        folder = service[1].store.folder(store.parse(path))
        updated = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval() \
            if (folder / "config.json").exists() else _with_weights(hf_smollm2, folder)
        for seq in res.sequences:
            want, logits = _hf_lp(updated, prompt + list(seq.tokens))
            got = np.asarray(seq.logprobs)
            assert np.abs(got - want[len(prompt) - 1:]).max() <= float32_bounds(updated, logits)[0]


def _with_weights(hf, folder):
    """transformers' SmolLM2 with the snapshot's merged weights (model.safetensors in ``folder``)."""
    import copy

    from safetensors.torch import load_file

    model = copy.deepcopy(hf)
    missing, unexpected = model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    return model.eval()


def test_a_tinker_cookbook_recipe_runs_unmodified_against_the_service(service, smollm2, tmp_path):
    pytest.importorskip("tinker_cookbook.recipes.math_rl.train")
    log = tmp_path / "recipe"
    cmd = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", f"base_url={service[0]}",
           f"model_name={smollm2}", "renderer_name=qwen3_instruct", "loss_fn=importance_sampling",
           "groups_per_batch=2", "group_size=4", "max_tokens=4", "max_steps=2", "learning_rate=3e-4",
           "lora_rank=8", "eval_every=0", "save_every=0", f"log_path={log}", "behavior_if_log_dir_exists=delete"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TINKER_API_KEY": "tml-test"})
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "env/all/reward/total" in r]  # (a last row holds the totals)
    assert [s["step"] for s in steps] == [0, 1]
    for s in steps:
        assert np.isfinite(s["env/all/reward/total"]) and s["env/all/total_episodes"] == 8
        # float32 sampler and trainer: the sampled tokens' log-probs agree, so the KL estimate
        # between them is rounding (measured ~1e-5; a bfloat16 service
        # measured 6.5e-4 and 2.5e-3 in the same two steps).
        assert abs(s["optim/kl_sample_train_v1"]) < 1e-3

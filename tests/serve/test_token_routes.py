"""Token in, token out: ``/inference/v1/generate`` (vLLM's shape, read by the real
``renderers`` client verifiers trains with) and ``/v1/chat/completions/tokens`` (prime-rl's) on
the shipped tool model, against a reference engine; and verifiers' own eval command pointed at
``tokenflow serve`` plays a two-turn environment token-in/token-out, each second turn's prompt
continuing the ids the first one sampled."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.serve.serve_testlib import logprob_tol, served
from tokenflow.engine import SamplingParams

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
CALLS: list[tuple[str, list[int], list[int]]] = []
"""(X-Session-ID, prompt ids, completion ids) of each call the server answered."""


def _record(request, call) -> None:
    CALLS.append((request.headers.get("x-session-id", ""), list(call.prompt_ids[0]),
                  call.rollouts[0][0].completion_ids.tolist()))


@pytest.fixture(scope="module")
def server():
    with served("default-tool", model_name="policy", on_call=_record) as s:
        yield s


def _prompt(server, text: str) -> list[int]:
    return server.engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                       add_generation_prompt=True, return_dict=False)


def test_generate_with_the_renderers_client(server):
    """The client verifiers' train client calls parses our answer: the engine's ids and
    log-probs for the same seed, stopped at the renderer's stop ids."""
    renderers = pytest.importorskip("renderers")
    from openai import AsyncOpenAI
    from renderers.client import generate

    renderer = renderers.create_renderer(server.engine.tokenizer, renderers.DefaultRendererConfig())
    messages = [{"role": "user", "content": "12*34"}]
    prompt = renderer.render_ids(messages, add_generation_prompt=True)

    async def call():
        client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        try:
            return await generate(client=client, renderer=renderer, messages=messages, model="policy",
                                  prompt_ids=prompt, sampling_params={"temperature": 1.0, "seed": 5, "max_tokens": 24},
                                  max_prompt_len=256)
        finally:
            await client.close()

    out = asyncio.run(call())
    stops = tuple(renderer.get_stop_token_ids())
    (want,) = server.reference_generate(prompt, SamplingParams(temperature=1.0, seed=5, max_tokens=24,
                                                               stop_token_ids=stops))
    assert out["prompt_ids"] == prompt and out["completion_ids"] == want.completion_ids.tolist()
    assert np.all(np.abs(np.array(out["completion_logprobs"]) - want.logprobs) <= logprob_tol(want.logprobs))
    assert out["finish_reason"] == want.finish_reason


def test_generate_stops_at_stop_token_ids_and_refuses_other_sampling(server):
    prompt = _prompt(server, "47*83")
    sp = {"temperature": 1.0, "seed": 2, "max_tokens": 16, "ignore_eos": True}
    body = {"model": "policy", "token_ids": prompt, "sampling_params": sp}
    first = httpx.post(server.url + "/inference/v1/generate", json=body, timeout=60).json()["choices"][0]
    stop = first["token_ids"][2]
    body["sampling_params"] = {**sp, "stop_token_ids": [stop]}
    stopped = httpx.post(server.url + "/inference/v1/generate", json=body, timeout=60).json()["choices"][0]
    cut = first["token_ids"].index(stop) + 1
    assert stopped["token_ids"] == first["token_ids"][:cut] and stopped["finish_reason"] == "stop"
    assert [c["token"] for c in stopped["logprobs"]["content"]] == [f"token_id:{t}" for t in stopped["token_ids"]]
    body["sampling_params"] = {**sp, "repetition_penalty": 1.3}
    refused = httpx.post(server.url + "/inference/v1/generate", json=body, timeout=60)
    assert refused.status_code == 400 and "repetition_penalty" in refused.json()["error"]["message"]


def test_chat_completions_tokens_is_a_chat_completion_on_the_given_ids(server):
    messages = [{"role": "user", "content": "12*34"}]
    prompt = _prompt(server, "12*34")
    common = {"model": "policy", "messages": messages, "temperature": 1.0, "seed": 9, "max_tokens": 24,
              "return_token_ids": True, "logprobs": True, "ignore_eos": True}
    chat = httpx.post(server.url + "/v1/chat/completions", json=common, timeout=60).json()
    tokens = httpx.post(server.url + "/v1/chat/completions/tokens", json={**common, "tokens": prompt}, timeout=60).json()
    assert chat["prompt_token_ids"] == tokens["prompt_token_ids"] == prompt
    (a,), (b,) = chat["choices"], tokens["choices"]
    assert a["token_ids"] == b["token_ids"] and a["message"] == b["message"]
    assert a["finish_reason"] == b["finish_reason"]
    assert [t["logprob"] for t in a["logprobs"]["content"]] == pytest.approx(
        [t["logprob"] for t in b["logprobs"]["content"]], abs=1e-5)


def test_verifiers_eval_command_is_token_in_token_out(server, tmp_path):
    """verifiers' ``vf-eval`` with its train client (token ids, rendered client-side) against
    ``tokenflow serve``: every episode ends without error, and each second turn's prompt is the
    first turn's prompt and sampled ids, then the follow-up's ids."""
    pytest.importorskip("verifiers.v1")
    CALLS.clear()
    model = str(Path(server.engine.tokenizer.name_or_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples" / "verifiers")}
    vf_eval = Path(sys.executable).parent / "vf-eval"  # verifiers' console script
    if not vf_eval.exists():
        pytest.skip("the vf-eval command is not installed beside this Python")
    cmd = [str(vf_eval), "tf_vf_twoturn", "-m", "policy", "-n", "3",
           "-r", "1", "--no-push", "--client.type", "train", "--client.base-url", server.base_url,
           "--client.api-key-var", "TOKENFLOW_API_KEY", "--client.renderer-model-name", model,
           "--env.agent.runtime.type", "subprocess", "--sampling.max-tokens", "12", "-o", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "3/3" in out and "err 0.00" in out and "MITO" not in out
    by_episode: dict[str, list] = {}
    for sid, prompt, completion in CALLS:
        by_episode.setdefault(sid, []).append((prompt, completion))
    assert len(by_episode) == 3 and all(len(calls) == 2 for calls in by_episode.values())
    for (p1, c1), (p2, _) in by_episode.values():
        assert p2[:len(p1) + len(c1)] == p1 + c1 and len(p2) > len(p1) + len(c1)

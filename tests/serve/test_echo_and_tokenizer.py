"""``echo`` and ``max_tokens: 0`` on /v1/completions (the prompt's log-probs, OpenAI's legacy
shape) against a reference engine, and the tokenizer routes (/tokenizer_info, /tokenize,
/detokenize, vLLM's shapes) on the shipped models."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.serve.serve_testlib import logprob_tol, served, sync_client
from tokenflow.engine import SamplingParams

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with served("default") as s:
        yield s


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_echo_returns_the_prompt_and_its_logprobs_first(server, max_tokens):
    text = "12+34="
    r = sync_client(server).completions.create(model="default", prompt=text, echo=True, logprobs=2, n=2,
                                               max_tokens=max_tokens, temperature=1.0, seed=4)
    prompt = server.engine.tokenizer(text)["input_ids"]
    (want, _) = server.reference_generate(prompt, SamplingParams(temperature=1.0, seed=4, n=2, logprobs=2,
                                                                 max_tokens=max(max_tokens, 1), prompt_logprobs=2))
    strings = server.engine.tokenizer.convert_ids_to_tokens(prompt)
    for choice in r.choices:
        lp = choice.logprobs
        assert choice.text.startswith(text) and lp.tokens[:len(prompt)] == strings
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        got = np.array(lp.token_logprobs[1:len(prompt)])
        assert np.all(np.abs(got - want.prompt_logprobs[1:]) <= logprob_tol(want.prompt_logprobs[1:]))
        for k, top in enumerate(lp.top_logprobs[1:len(prompt)], start=1):
            assert list(top) == server.engine.tokenizer.convert_ids_to_tokens(want.prompt_top_ids[k].tolist())
        assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
        if max_tokens == 0:  # only the prompt, scored
            assert choice.text == text and len(lp.tokens) == len(prompt) and choice.finish_reason == "length"
        else:
            assert len(lp.tokens) == len(prompt) + 3
    assert r.usage.completion_tokens == 2 * max_tokens and r.usage.prompt_tokens == len(prompt)


def test_echo_of_token_ids_decodes_them_and_without_logprobs_asks_for_none(server):
    r = _post(server, "/v1/completions", {"prompt": [[4, 5, 13, 6]], "echo": True, "max_tokens": 0}).json()
    (choice,) = r["choices"]
    assert choice["text"] == "12+3" and choice["logprobs"] is None


def test_echo_and_max_tokens_0_do_not_stream(server):
    for extra in ({"echo": True}, {"max_tokens": 0}):
        r = _post(server, "/v1/completions", {"prompt": "1+1=", "stream": True, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(extra))


def test_tokenize_detokenize_and_tokenizer_info(server):
    tok = server.engine.tokenizer
    info = httpx.get(server.url + "/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == tok.eos_token and info["bos_token"] == tok.bos_token
    assert info["tokenizer_class"] == type(tok).__name__
    assert not any(k.endswith("_file") or "path" in k for k in info)  # no paths of the server's disk
    r = _post(server, "/tokenize", {"model": "default", "prompt": "12+34=", "return_token_strs": True}).json()
    assert r["tokens"] == tok("12+34=")["input_ids"] and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == server.engine.max_model_len and r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    plain = _post(server, "/tokenize", {"prompt": tok.eos_token, "add_special_tokens": False}).json()
    assert plain["tokens"] == [tok.eos_token_id]  # how lm-eval finds the EOS id
    assert _post(server, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": tok.decode(r["tokens"])}


@pytest.mark.parametrize("body, param", [
    ({"tokens": [4, 10 ** 6]}, "tokens"),
    ({"tokens": [4, 2 ** 70]}, "tokens"),
    ({"tokens": [-1]}, "tokens[0]"),
    ({"tokens": "12"}, "tokens"),
])
def test_detokenize_refuses_ids_outside_the_vocabulary(server, body, param):
    r = _post(server, "/detokenize", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_tokenize_refuses_another_model_and_text_it_cannot_encode(server):
    assert _post(server, "/tokenize", {"model": "other", "prompt": "1"}).status_code == 404
    r = _post(server, "/tokenize", {"prompt": "test"})  # letters: not in the tiny model's vocabulary
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_chat_tokenize_gives_the_ids_a_chat_call_reads():
    with served("default-tool", reference=False) as s:
        messages = [{"role": "user", "content": "2+3="}]
        chat = _post(s, "/v1/chat/completions", {"messages": messages, "max_tokens": 1,
                                                 "return_token_ids": True}).json()
        r = _post(s, "/tokenize", {"messages": messages}).json()
        assert r["tokens"] == chat["prompt_token_ids"]
        bare = _post(s, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
        assert r["tokens"][:len(bare["tokens"])] == bare["tokens"] and bare["count"] < r["count"]


def test_the_tokenizer_routes_sit_beside_every_mount_of_the_openai_routes():
    from fastapi import FastAPI

    from tokenflow.engine import EngineConfig
    from tokenflow.engine.factory import make_engine
    from tokenflow.model_store import resolve_model_path
    from tokenflow.serve.app import openai_router
    from tokenflow.serve.driver import EngineDriver
    from tokenflow.serve.service import OpenAIService

    engine = make_engine(resolve_model_path("default"), EngineConfig(device="cpu", threads=1))
    app = FastAPI()
    app.include_router(openai_router(OpenAIService(EngineDriver(engine), "default"), prefix="/sessions/{session_id}/v1"))
    paths = set(app.openapi()["paths"])
    assert {"/sessions/{session_id}/tokenize", "/sessions/{session_id}/detokenize",
            "/sessions/{session_id}/tokenizer_info"} <= paths

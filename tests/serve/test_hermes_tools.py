"""Hermes tool calls (``<tool_call>{json}</tool_call>``, the default ``tool_format``) through
the server.

The shipped tiny models cannot write Hermes calls, so the completion here is scripted: an engine
that implements the `RolloutEngine` calls the server makes and "samples" a fixed text in the
tool model's tokenizer, streamed a few tokens per step. What this exercises is the server's
side: the template rendering of the request's ``tools``, reading the calls out of the text
(`tokenflow.envs.tool_calls`), the response and stream shapes, and text outside the calls left
as content. Whether a real model writes such calls is the model's business.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from tests.serve.serve_testlib import sync_client
from tokenflow.engine.base import TokenDelta
from tokenflow.engine.stats import EngineStats
from tokenflow.rollout import Rollout
from tokenflow.model_store import resolve_model_path
from tokenflow.serve.app import create_app
from tokenflow.serve.server import BackgroundServer

pytestmark = pytest.mark.timeout(60)

SCRIPT = ('Let me compute.\n<tool_call>\n{"name": "mul", "arguments": {"a": 12, "b": 34}}\n</tool_call>\n'
          '<tool_call>\n{"name": "add", "arguments": {"a": 408, "b": 5}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} two integers",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}}}}}
         for name in ("mul", "add")]


class ScriptedEngine:
    """Answers every request with ``SCRIPT`` and the turn end, three tokens per step."""

    version = 0
    stats = EngineStats()

    def __init__(self, tokenizer, max_model_len: int = 256) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.max_model_len = max_model_len
        self.script = tokenizer(SCRIPT, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.requests: dict[str, list] = {}
        self.prompts: list[list[int]] = []

    num_running = property(lambda self: len(self.requests))
    num_waiting = 0

    def add_request(self, prompt_ids, params=None, request_id=None, **kw) -> str:
        self.prompts.append(list(prompt_ids))
        self.requests[request_id] = [list(prompt_ids), 0, 0]  # prompt, tokens so far, tokens handed out
        return request_id

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[Rollout]:
        done = []
        for rid, state in list(self.requests.items()):
            state[1] = min(state[1] + 3, len(self.script))
            if state[1] == len(self.script):
                del self.requests[rid]
                ids = self.script
                done.append(Rollout(state[0], ids, np.full(len(ids), -0.5), np.zeros(len(ids)), "stop",
                                    request_id=rid))
        return done

    def new_tokens(self, request_ids) -> list[TokenDelta]:
        out = []
        for rid, state in self.requests.items():
            if rid in request_ids and state[2] < state[1]:
                ids = self.script[state[2]:state[1]]
                out.append(TokenDelta(rid, 0, ids, [-0.5] * len(ids)))
                state[2] = state[1]
        return out

    def abort(self, request_id: str) -> int:
        return int(self.requests.pop(request_id, None) is not None)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    from transformers import AutoTokenizer

    engine = ScriptedEngine(AutoTokenizer.from_pretrained(resolve_model_path("default-tool")))
    with contextlib.ExitStack() as stack:
        s = stack.enter_context(BackgroundServer(create_app(engine, "scripted")))
        s.engine, s.base_url, s.model_name = engine, s.url + "/v1", "scripted"
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_hermes_calls_come_back_as_tool_calls(server, stream):
    client = sync_client(server)
    kw = dict(model="scripted", messages=[{"role": "user", "content": "12*34+5"}], tools=TOOLS)
    if stream:
        content, calls, reason = "", [], None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                content += c.delta.content or ""
                calls += c.delta.tool_calls or []
                reason = c.finish_reason or reason
    else:
        r = client.chat.completions.create(**kw)
        content, calls, reason = r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason
    assert reason == "tool_calls" and content == "Let me compute."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("mul", {"a": 12, "b": 34}), ("add", {"a": 408, "b": 5})]
    assert len({c.id for c in calls}) == 2
    # the tools reached the model through its chat template
    prompt = server.engine.tokenizer.decode(server.engine.prompts[-1])
    assert prompt.startswith("<bos><tools>mul(a,b) add(a,b)<eot><user>12*34+5<eot><assistant>")


def test_a_call_to_a_tool_not_offered_stays_text(server):
    r = sync_client(server).chat.completions.create(model="scripted", messages=[{"role": "user", "content": "x"}],
                                                    tools=TOOLS[:1])
    choice = r.choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["mul"]
    assert '"name": "add"' in choice.message.content and choice.finish_reason == "tool_calls"

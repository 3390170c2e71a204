"""/v1/chat/completions with the official `openai` client, sync and async, on the shipped tool
model ("default-tool": the one with a chat template), against a reference engine."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.serve.serve_testlib import async_client, extra, logprob_tol, served, sync_client
from tokenflow.engine import SamplingParams
from tokenflow.envs.bridge import ChatBridge
from tokenflow.envs.calculator import add, mul
from tokenflow.envs.schemas import tool_schemas

pytestmark = pytest.mark.timeout(120)

QUESTION = [{"role": "user", "content": "86*67+31"}]
TOOLS = tool_schemas([add, mul])  # the calculator's tools, in its order: what the tool model learnt
CALLS: list = []


@pytest.fixture(scope="module")
def server():
    with served("default-tool", on_call=lambda request, call: CALLS.append(call)) as s:
        yield s


@pytest.fixture(scope="module")
def bridge(server):
    return ChatBridge(server.engine.tokenizer)


def _params(temperature, seed, n, max_tokens, turn_end, top=0, stop=()):
    return SamplingParams(temperature=temperature, seed=seed, n=n, max_tokens=max_tokens,
                          stop_token_ids=turn_end, logprobs=top, stop=stop)


def test_chat_returns_the_engines_ids_and_logprobs(server, bridge):
    client = sync_client(server)
    r = client.chat.completions.create(model="default-tool", messages=QUESTION, temperature=0.8, seed=7, n=2,
                                       max_tokens=24, logprobs=True, top_logprobs=3,
                                       extra_body={"return_token_ids": True})
    prompt = extra(r, "prompt_token_ids")
    assert prompt == bridge.prompt_ids(QUESTION)  # the model's own chat template
    ref = server.reference_generate(prompt, _params(0.8, 7, 2, 24, bridge.turn_end_ids, top=3))
    strings = server.engine.tokenizer.convert_ids_to_tokens
    assert [c.index for c in r.choices] == [0, 1]
    for choice, want in zip(r.choices, ref):
        assert extra(choice, "token_ids") == want.completion_ids.tolist()
        assert choice.message.content == want.text and choice.finish_reason == want.finish_reason
        got = np.array([e.logprob for e in choice.logprobs.content])
        assert np.all(np.abs(got - want.logprobs) <= logprob_tol(want.logprobs))
        for entry, (ids, values) in zip(choice.logprobs.content, want.top_logprobs):
            assert [t.token for t in entry.top_logprobs] == strings(ids.tolist())
            assert np.all(np.abs(np.array([t.logprob for t in entry.top_logprobs]) - values) <= logprob_tol(values))
    assert r.choices[0].message.content != r.choices[1].message.content  # two samples, not one twice
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == sum(w.num_tokens for w in ref)


def test_the_call_hook_sees_the_calls_rollouts(server):
    CALLS.clear()
    r = sync_client(server).chat.completions.create(model="default-tool", messages=QUESTION, seed=3, max_tokens=12,
                                                    extra_body={"return_token_ids": True})
    (call,) = CALLS
    (rollout,), = call.rollouts
    assert call.endpoint == "chat.completions" and call.prompt_ids == [extra(r, "prompt_token_ids")]
    assert rollout.completion_ids.tolist() == extra(r.choices[0], "token_ids")
    assert rollout.versions.tolist() == [0] * rollout.num_tokens  # the policy version of every token
    assert call.response["choices"][0]["message"]["content"] == r.choices[0].message.content


@pytest.mark.parametrize("temperature,stop", [(0.0, None), (1.0, None), (1.0, ["7", "6,"])])
def test_a_streamed_chat_joins_to_the_whole_response(server, temperature, stop):
    client = sync_client(server)
    kw = dict(model="default-tool", messages=QUESTION, temperature=temperature, seed=11, n=2, max_tokens=20,
              logprobs=True, top_logprobs=2, stop=stop, extra_body={"return_token_ids": True})
    whole = client.chat.completions.create(**kw)
    text, ids, logprobs, reasons = {0: ""}, {0: []}, {0: []}, {}
    text[1], ids[1], logprobs[1] = "", [], []
    usage = None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            ids[c.index] += extra(c, "token_ids") or []
            logprobs[c.index] += [e.logprob for e in (c.logprobs.content if c.logprobs else None) or []]
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    for choice in whole.choices:
        i = choice.index
        assert text[i] == choice.message.content
        assert ids[i] == extra(choice, "token_ids")
        want = [e.logprob for e in choice.logprobs.content]  # equal up to the batch's rounding
        assert np.all(np.abs(np.array(logprobs[i]) - want) <= logprob_tol(want))
        assert reasons[i] == choice.finish_reason
    assert usage == whole.usage
    if stop:  # the stop strings end the text and are not in it
        assert all(s not in choice.message.content for choice in whole.choices for s in stop)


def test_async_clients_at_once_each_get_their_own_solo_result(server, bridge):
    """Eight requests in flight together (continuous batching) give what each gives alone."""
    prompt = bridge.prompt_ids(QUESTION)

    async def ask(client, seed, stream):
        kw = dict(model="default-tool", messages=QUESTION, temperature=1.0, seed=seed, max_tokens=16,
                  extra_body={"return_token_ids": True})
        if not stream:
            r = await client.chat.completions.create(**kw)
            return r.choices[0].message.content, extra(r.choices[0], "token_ids")
        text, ids = "", []
        async for chunk in await client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                text += c.delta.content or ""
                ids += extra(c, "token_ids") or []
        return text, ids

    async def main():
        client = async_client(server)
        async with client:
            return await asyncio.gather(*[ask(client, seed, seed % 2 == 0) for seed in range(8)])

    results = asyncio.run(main())
    for seed, (text, ids) in enumerate(results):
        (want,) = server.reference_generate(prompt, _params(1.0, seed, 1, 16, bridge.turn_end_ids))
        assert ids == want.completion_ids.tolist() and text == want.text, seed


def test_tool_calls_round_trip(server, bridge):
    """The tool model writes calls in the plain format (``mul(86,67)``; it cannot write Hermes
    JSON): asked with the calculator's tools and ``tool_format: "plain"``, the call comes back
    as OpenAI ``tool_calls``; sent back with the tool's answer, the conversation renders as the
    first call's prompt and completion ids followed by the template's ids for the answer."""
    client = sync_client(server)
    kw = dict(model="default-tool", messages=QUESTION, temperature=0, tools=TOOLS,
              extra_body={"tool_format": "plain", "return_token_ids": True})
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "mul"
    assert json.loads(call.function.arguments) == {"a": 86, "b": 67}
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed += c.delta.tool_calls or []
    assert [(t.function.name, t.function.arguments) for t in streamed] == [("mul", call.function.arguments)]
    # The answer goes back as a tool message; the next prompt extends the ids the model sampled.
    history = QUESTION + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "5762"}]
    r2 = client.chat.completions.create(model="default-tool", messages=history, temperature=0, tools=TOOLS,
                                        extra_body={"tool_format": "plain", "return_token_ids": True})
    first = extra(r, "prompt_token_ids") + extra(choice, "token_ids")
    as_template = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "mul", "arguments": {"a": 86, "b": 67}}}]}
    answer = bridge.environment_ids([history[-1]], assistant=as_template)
    assert extra(r2, "prompt_token_ids") == first + answer
    # tool_choice "none": the same text, as content
    r3 = client.chat.completions.create(tool_choice="none", **kw)
    assert r3.choices[0].message.content == "mul(86,67)" and r3.choices[0].finish_reason == "stop"

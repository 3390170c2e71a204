"""/v1/completions and /v1/models with the official `openai` client, sync and async, on the
shipped default model (it has no chat template), against a reference engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.serve.serve_testlib import async_client, extra, logprob_tol, served, sync_client
from tokenflow.engine import SamplingParams

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with served("default") as s:
        yield s


def _ids(server, text: str) -> list[int]:
    return server.engine.tokenizer(text)["input_ids"]


def test_models_lists_the_served_model(server):
    client = sync_client(server)
    (card,) = client.models.list().data
    assert card.id == "default" and card.owned_by == "tokenflow"
    assert extra(card, "max_model_len") == server.engine.max_model_len
    assert client.models.retrieve("default").id == "default"


def test_completion_returns_the_engines_ids_and_logprobs(server):
    r = sync_client(server).completions.create(model="default", prompt="12+34=", temperature=1.0, seed=5, n=3,
                                               max_tokens=12, logprobs=2, extra_body={"return_token_ids": True})
    prompt = _ids(server, "12+34=")
    ref = server.reference_generate(prompt, SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=12, logprobs=2))
    assert [c.index for c in r.choices] == [0, 1, 2]
    for choice, want in zip(r.choices, ref):
        assert extra(choice, "prompt_token_ids") == prompt
        assert extra(choice, "token_ids") == want.completion_ids.tolist()
        assert choice.text == want.text and choice.finish_reason == want.finish_reason
        lp = choice.logprobs
        assert lp.tokens == server.engine.tokenizer.convert_ids_to_tokens(want.completion_ids.tolist())
        assert np.all(np.abs(np.array(lp.token_logprobs) - want.logprobs) <= logprob_tol(want.logprobs))
        for top, (ids, values) in zip(lp.top_logprobs, want.top_logprobs):
            names = server.engine.tokenizer.convert_ids_to_tokens(ids.tolist())
            assert list(top) == names
            assert np.all(np.abs(np.array(list(top.values())) - values) <= logprob_tol(values))
        assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == sum(w.num_tokens for w in ref)


def test_several_prompts_as_texts_or_token_ids(server):
    client = sync_client(server)
    texts = ["1+1=", "23+45="]
    ids = [_ids(server, t) for t in texts]
    by_text = client.completions.create(model="default", prompt=texts, n=2, seed=1, max_tokens=8,
                                        extra_body={"return_token_ids": True})
    by_ids = client.completions.create(model="default", prompt=ids, n=2, seed=1, max_tokens=8,
                                       extra_body={"return_token_ids": True})
    single = client.completions.create(model="default", prompt=ids[1], n=2, seed=1, max_tokens=8)
    assert [c.index for c in by_text.choices] == [0, 1, 2, 3]  # prompt-major, then sample
    assert [extra(c, "prompt_token_ids") for c in by_text.choices] == [ids[0], ids[0], ids[1], ids[1]]
    assert [c.text for c in by_text.choices] == [c.text for c in by_ids.choices]
    assert [c.text for c in by_ids.choices[2:]] == [c.text for c in single.choices]


@pytest.mark.parametrize("temperature,stop", [(0.0, None), (1.0, None), (1.0, "+"), (0.0, "two characters")])
def test_a_streamed_completion_joins_to_the_whole_response(server, temperature, stop):
    client = sync_client(server)
    if stop == "two characters":  # a stop string that arrives one token at a time, mid-text
        probe = client.completions.create(model="default", prompt="12+34=", temperature=0, max_tokens=16).choices[0]
        stop = probe.text[3:5]
        assert len(stop) == 2 and probe.text.find(stop) == 3, probe.text
    kw = dict(model="default", prompt=["12+34=", "5*6="], temperature=temperature, seed=2, n=2, max_tokens=16,
              logprobs=1, stop=stop, extra_body={"return_token_ids": True})
    whole = client.completions.create(**kw)
    text, ids, lps, offsets, reasons, usage = {}, {}, {}, {}, {}, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + c.text
            ids[c.index] = ids.get(c.index, []) + (extra(c, "token_ids") or [])
            lps[c.index] = lps.get(c.index, []) + (c.logprobs.token_logprobs if c.logprobs else [])
            offsets[c.index] = offsets.get(c.index, []) + (c.logprobs.text_offset if c.logprobs else [])
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    for c in whole.choices:
        assert (text[c.index], ids[c.index], reasons[c.index]) == (c.text, extra(c, "token_ids"), c.finish_reason)
        # Two runs of one request: the tokens are equal; the log-probs may differ by rounding when
        # the batch around them differed (another prompt admitted a step later, another client).
        assert np.all(np.abs(np.array(lps[c.index]) - c.logprobs.token_logprobs) <= logprob_tol(lps[c.index]))
        assert offsets[c.index] == c.logprobs.text_offset
    assert usage == whole.usage
    if stop:
        assert all(stop not in c.text for c in whole.choices)
        assert any(c.finish_reason == "stop" and len(extra(c, "token_ids")) < 16 for c in whole.choices)


def test_async_completions_at_once_each_get_their_own_solo_result(server):
    prompts = [f"{a}+{a + 7}=" for a in range(10, 18)]

    async def main():
        async with async_client(server) as client:
            return await asyncio.gather(*[
                client.completions.create(model="default", prompt=p, seed=i, temperature=1.0, max_tokens=10,
                                          extra_body={"return_token_ids": True})
                for i, p in enumerate(prompts)])

    for i, (p, r) in enumerate(zip(prompts, asyncio.run(main()))):
        (want,) = server.reference_generate(_ids(server, p), SamplingParams(temperature=1.0, seed=i, max_tokens=10))
        assert extra(r.choices[0], "token_ids") == want.completion_ids.tolist() and r.choices[0].text == want.text


def test_a_client_that_leaves_a_stream_stops_its_samples(server):
    """Reading two chunks of a long stream and closing it aborts the engine request: far fewer
    tokens are generated than were asked for."""
    before = server.engine.stats.tokens_generated
    stream = sync_client(server).completions.create(model="default", prompt="1+2=", n=8, max_tokens=240,
                                                    stream=True, extra_body={"ignore_eos": True})
    for k, _ in enumerate(stream):
        if k == 1:
            break
    stream.close()
    driver = server.app.state.driver
    for _ in range(200):
        if not server.engine.has_unfinished() and not driver._live:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert not server.engine.has_unfinished() and not driver._live
    assert server.engine.stats.tokens_generated - before < 8 * 240 / 2

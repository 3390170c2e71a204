"""Hermes tool calls written by a real model through `tokenflow serve` and the built-in engine.

smollm2-135m-instruct cannot be used: its own chat template drops ``tools`` (it renders only roles
and contents; the one tokenflow writes into the built folder renders them), and greedily it answers "What is 12*34? Use the mul tool." with arithmetic, no
call. So the shipped tool model (a character-level Llama whose template renders tools as
``<tools>mul(a,b) add(a,b)<eot>``) is warm-started here on Hermes calls: seeded, full-batch SFT
on six fixed conversations (two questions; per question the first call, the second call after
the tool's result, and the plain answer when no tools are offered), 100 steps. The folder it
saves is then served like any model: the server renders each request's messages and tools
through the template, the engine decodes greedily until the turn end, and the server reads the
calls out of the text. The expected calls are written out by hand.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.serve.serve_testlib import served, sync_client
from tokenflow.model_store import resolve_model_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 100
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} two integers",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}}}}}
         for name in ("mul", "add")]
QUESTIONS = [(12, 34, 5), (47, 83, 29)]


def hermes(name: str, a: int, b: int) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


def after_mul(a: int, b: int, c: int, arguments) -> list[dict]:
    """The conversation once the model has called mul(a, b) and the tool has answered."""
    return [{"role": "user", "content": f"{a}*{b}+{c}"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "mul", "arguments": arguments}}]},
            {"role": "tool", "content": str(a * b), "tool_call_id": "call_0"}]


def demonstrations(a: int, b: int, c: int) -> list[tuple[list[dict], list | None, str]]:
    user = [{"role": "user", "content": f"{a}*{b}+{c}"}]
    return [(user, TOOLS, hermes("mul", a, b)),
            (after_mul(a, b, c, {"a": a, "b": b}), TOOLS, hermes("add", a * b, c)),
            (user, None, str(a * b + c))]


def warm_start(out) -> None:
    """The shipped tool model after STEPS full-batch SFT steps on the demonstrations, saved to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenflow.envs.bridge import ChatBridge

    shipped = resolve_model_path("default-tool")
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(shipped)
    model = AutoModelForCausalLM.from_pretrained(shipped, dtype=torch.float32)
    bridge = ChatBridge(tokenizer)
    end = bridge.turn_end_ids[0]
    rows = []
    for question in QUESTIONS:
        for messages, tools, target in demonstrations(*question):
            prompt = bridge.prompt_ids(messages, schemas=tools)
            rows.append((prompt, tokenizer.encode(target, add_special_tokens=False) + [end]))
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)  # the loss on the answers only
    for i, (p, t) in enumerate(rows):
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(STEPS):
            model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    shutil.copytree(shipped, out)
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hermes") / "model"
    warm_start(folder)
    with served(str(folder), model_name="hermes", reference=False) as s:
        yield s


def ask(server, messages, tools, stream: bool):
    """content, [(name, arguments)], ids unique, finish_reason of one greedy chat call."""
    kw = dict(model="hermes", messages=messages, temperature=0.0, max_tokens=80)
    if tools is not None:
        kw["tools"] = tools
    client = sync_client(server)
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        calls = choice.message.tool_calls or []
        return choice.message.content, calls, choice.finish_reason
    content, calls, reason = "", [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            reason = c.finish_reason or reason
    return content or None, calls, reason


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("question", QUESTIONS)
def test_the_model_calls_mul_then_add_and_answers_without_tools(server, question, stream):
    a, b, c = question
    content, calls, reason = ask(server, [{"role": "user", "content": f"{a}*{b}+{c}"}], TOOLS, stream)
    assert reason == "tool_calls" and not content
    assert [(x.function.name, json.loads(x.function.arguments)) for x in calls] == [("mul", {"a": a, "b": b})]
    assert calls[0].id.startswith("call_")
    # the call sent back as the client would (arguments as a JSON string) with the tool's answer
    history = after_mul(a, b, c, calls[0].function.arguments)
    content, calls, reason = ask(server, history, TOOLS, stream)
    assert reason == "tool_calls" and not content
    assert [(x.function.name, json.loads(x.function.arguments)) for x in calls] == [("add", {"a": a * b, "b": c})]
    # no tools offered: the template renders none, and the model answers in text
    content, calls, reason = ask(server, [{"role": "user", "content": f"{a}*{b}+{c}"}], None, stream)
    assert (content, calls, reason) == (str(a * b + c), [], "stop")


def test_the_demonstrations_differ_where_the_template_sees_tools():
    # What makes the last check above a check: the prompts with and without tools differ, so the
    # model's choice between calling and answering is the template's rendering of `tools`.
    from transformers import AutoTokenizer

    from tokenflow.envs.bridge import ChatBridge

    bridge = ChatBridge(AutoTokenizer.from_pretrained(resolve_model_path("default-tool")))
    user = [{"role": "user", "content": "12*34+5"}]
    with_tools = bridge.tokenizer.decode(bridge.prompt_ids(user, schemas=TOOLS))
    assert with_tools == "<bos><tools>mul(a,b) add(a,b)<eot><user>12*34+5<eot><assistant>"
    assert bridge.tokenizer.decode(bridge.prompt_ids(user)) == "<bos><user>12*34+5<eot><assistant>"

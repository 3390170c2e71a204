"""A chat request whose tools the model's template would drop (`ChatFormat.check_tools`), with
SmolLM2's real tokenizer: a 400 that names the template and the opt-in, the opt-in serving it
without them, and the tool-aware template tokenflow writes into the built folder keeping a tool
call of the history in the prompt ids."""

from __future__ import annotations

import json

import pytest

from tests.envs.chat_template_testlib import SMOLLM2_STOCK
from tokenflow.model_store import resolve_model_path
from tokenflow.serve.errors import APIError
from tokenflow.serve.protocol import ChatMessage, Tool

TOOLS = [Tool(**{"type": "function", "function": {"name": "mul", "description": "Multiply two integers.",
                                                  "parameters": {"type": "object", "properties": {
                                                      "a": {"type": "integer"}, "b": {"type": "integer"}}}}})]
QUESTION = {"role": "user", "content": "What is 6*7?"}
HISTORY = [QUESTION,
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "mul", "arguments": '{"a": 6, "b": 7}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "42"}]


def _messages(raw):
    return [ChatMessage(**m) for m in raw]


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    path = resolve_model_path("smollm2-135m-instruct")
    built, stock = AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    stock.chat_template = SMOLLM2_STOCK
    return built, stock


def test_tools_the_template_drops_are_a_400_naming_it_and_the_opt_in(tokenizers):
    from tokenflow.serve.chat import ChatFormat

    chat = ChatFormat(tokenizers[1], "smollm2-135m-instruct")
    with pytest.raises(APIError) as err:
        chat.prompt_ids(_messages([QUESTION]), TOOLS)
    e = err.value
    assert e.status == 400 and e.code == "tools_not_rendered" and e.param == "tools"
    assert e.message.startswith("the chat template of smollm2-135m-instruct does not render the tools offered")
    assert "--serve.allow_dropped_tools true" in e.message
    with pytest.raises(APIError, match="renders neither the tools offered .* nor the assistant's tool calls"):
        chat.prompt_ids(_messages(HISTORY), TOOLS)
    with pytest.raises(APIError, match="does not render the assistant's tool calls") as err:  # a history alone
        chat.prompt_ids(_messages(HISTORY), None)
    assert err.value.param == "messages"
    assert chat.prompt_ids(_messages([QUESTION]), None)  # no tools: served as before


def test_the_opt_in_serves_them_without_the_tools(tokenizers, caplog):
    from tokenflow.serve.chat import ChatFormat

    chat = ChatFormat(tokenizers[1], "smollm2-135m-instruct", allow_dropped_tools=True)
    assert chat.prompt_ids(_messages([QUESTION]), TOOLS) == chat.prompt_ids(_messages([QUESTION]), None)
    assert "serving smollm2-135m-instruct" in caplog.text and "renders neither" not in caplog.text


def test_the_tool_aware_template_keeps_the_call_in_the_prompt_ids(tokenizers):
    from tokenflow.serve.chat import ChatFormat

    built = tokenizers[0]
    ids = ChatFormat(built, "smollm2-135m-instruct").prompt_ids(_messages(HISTORY), TOOLS)
    call = built.encode('<tool_call>{"name": "mul", "arguments": {"a": 6, "b": 7}}</tool_call>',
                        add_special_tokens=False)
    assert any(ids[i:i + len(call)] == call for i in range(len(ids))), built.decode(ids)
    schema = json.dumps(TOOLS[0].model_dump(mode="json", exclude_none=True)["function"])
    assert schema in built.decode(ids)

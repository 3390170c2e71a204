"""Whether a chat template renders tools (`tokenflow.envs.template_tools`), with SmolLM2's real
tokenizer: its own template drops tools and tool calls, the one tokenflow writes into the built
folder renders both, and an environment whose tools would be dropped is said once, by name."""

from __future__ import annotations

import logging

import pytest

from tests.envs.chat_template_testlib import SMOLLM2_STOCK
from tokenflow.envs.template_tools import (
    ToolRendering, dropped_tools, template_name, tool_rendering, warn_dropped_tools,
)
from tokenflow.model_store import resolve_model_path

TOOLS = [{"type": "function", "function": {"name": "mul", "description": "Multiply two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CALLED = [{"role": "user", "content": "What is 6*7?"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "mul", "arguments": {"a": 6, "b": 7}}}]},
          {"role": "tool", "tool_call_id": "call_1", "name": "mul", "content": "42"}]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))


def test_smollm2s_own_template_drops_tools_and_calls(smollm2_tokenizer):
    stock = tool_rendering(smollm2_tokenizer, SMOLLM2_STOCK)
    assert stock.tools is False and stock.calls is False
    reason = dropped_tools(stock, tools=True, calls=True, name="the chat template of smollm2")
    assert reason == ("the chat template of smollm2 renders neither the tools offered (their schemas) nor the "
                      "assistant's tool calls in the history")
    assert dropped_tools(stock, tools=False, calls=False, name="x") is None
    # What the detection stands for: the rendering is the same with and without them.
    render = lambda msgs, tools: smollm2_tokenizer.apply_chat_template(  # noqa: E731
        msgs, tools=tools, chat_template=SMOLLM2_STOCK, tokenize=False)
    assert render(CALLED, TOOLS) == render([CALLED[0], {"role": "assistant", "content": ""}, CALLED[2]], None)


def test_the_built_folder_has_the_tool_aware_template_and_keeps_the_call(smollm2_tokenizer):
    assert tool_rendering(smollm2_tokenizer) == ToolRendering(tools=True, calls=True)
    ids = smollm2_tokenizer.apply_chat_template(CALLED, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    text = smollm2_tokenizer.decode(ids)
    assert '<tool_call>{"name": "mul", "arguments": {"a": 6, "b": 7}}</tool_call><|im_end|>' in text
    assert '"name": "mul", "description": "Multiply two integers."' in text.split("<|im_start|>user")[0]
    assert "<|im_start|>tool\n42<|im_end|>" in text
    # Conversations without tools render exactly as SmolLM2's own template renders them.
    for msgs in ([{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "bye"}]):
        assert smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False) == \
            smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False,
                                                  chat_template=SMOLLM2_STOCK)


def test_an_environment_whose_tools_are_dropped_is_said_once_by_name(smollm2_tokenizer, caplog):
    from transformers import AutoTokenizer

    stock = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    stock.chat_template = SMOLLM2_STOCK
    with caplog.at_level(logging.WARNING, logger="tokenflow.envs.template_tools"):
        assert warn_dropped_tools(stock, "environment my_envs.py:Search") is True
        assert warn_dropped_tools(stock, "environment my_envs.py:Search") is True
        assert warn_dropped_tools(smollm2_tokenizer, "environment my_envs.py:Other") is False
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert warned[0].startswith(f"environment my_envs.py:Search: {template_name(stock)} renders neither")
    assert "smollm2-135m-instruct" in warned[0]

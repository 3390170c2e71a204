"""Tools through `tokenflow serve smollm2-135m-instruct` and the `openai` client: with SmolLM2's
own template (a copy of the built folder) a request with tools is a 400 that names the template
and the opt-in, and ``serve.allow_dropped_tools`` serves it; with the template tokenflow writes
into the built folder, a tool round trip keeps the call in the prompt ids."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.envs.chat_template_testlib import SMOLLM2_STOCK
from tests.serve.serve_testlib import extra, served, sync_client
from tokenflow.config.serve import ServeConfig

pytestmark = [pytest.mark.real_model, pytest.mark.slow, pytest.mark.timeout(300)]

NAME = "smollm2-135m-instruct"
TOOLS = [{"type": "function", "function": {"name": "mul", "description": "Multiply two integers.",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
QUESTION = {"role": "user", "content": "What is 6*7?"}


@pytest.fixture(scope="module")
def stock_folder(smollm2, tmp_path_factory) -> str:
    """The built folder with SmolLM2's own chat template (its other files linked)."""
    folder = tmp_path_factory.mktemp("smollm2-stock")
    for f in Path(smollm2).iterdir():
        if f.name != "tokenizer_config.json":
            (folder / f.name).symlink_to(f)
    tk = json.loads((Path(smollm2) / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tk, "chat_template": SMOLLM2_STOCK}))
    return str(folder)


def test_tools_a_stock_template_drops_are_a_400_unless_allowed(stock_folder):
    with served(stock_folder, model_name=NAME, reference=False) as s:
        with pytest.raises(openai.BadRequestError) as err:
            sync_client(s).chat.completions.create(model=NAME, messages=[QUESTION], tools=TOOLS, max_tokens=2)
        body = err.value.body
        assert err.value.status_code == 400 and body["code"] == "tools_not_rendered" and body["param"] == "tools"
        assert f"the chat template of {NAME} does not render the tools offered" in body["message"]
        assert "serve.allow_dropped_tools" in body["message"]
    with served(stock_folder, model_name=NAME, reference=False, config=ServeConfig(allow_dropped_tools=True)) as s:
        r = sync_client(s).chat.completions.create(model=NAME, messages=[QUESTION], tools=TOOLS, max_tokens=2,
                                                   temperature=0.0, extra_body={"return_token_ids": True})
        assert r.choices[0].finish_reason in ("length", "stop")


def test_a_tool_round_trip_keeps_the_call_in_the_history(smollm2, tokenizer):
    with served(NAME, reference=False) as s:
        client = sync_client(s)
        history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "mul", "arguments": '{"a": 6, "b": 7}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
        r = client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, max_tokens=2, temperature=0.0,
                                           extra_body={"return_token_ids": True})
    prompt = extra(r, "prompt_token_ids")
    call = tokenizer.encode('<tool_call>{"name": "mul", "arguments": {"a": 6, "b": 7}}</tool_call><|im_end|>',
                            add_special_tokens=False)
    assert any(prompt[i:i + len(call)] == call for i in range(len(prompt))), tokenizer.decode(prompt)
    text = tokenizer.decode(prompt)
    assert '"name": "mul"' in text.split("<|im_start|>user")[0] and "<|im_start|>tool\n42<|im_end|>" in text

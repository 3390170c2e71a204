"""ToolEnvironment: tools run (sync, async), failures are answered and counted, answers end episodes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tokenflow.envs import Environment, StepResult, ToolEnvironment


def mul(a: int, b: int) -> int:
    """Multiply.

    Args:
        a: first
        b: second
    """
    return a * b


async def slow_add(a: int, b: int) -> int:
    """Add, taking a while.

    Args:
        a: first
        b: second
    """
    await asyncio.sleep(0.01)
    return a + b


def explode(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise ValueError(f"cannot handle {x}")


def stall(x: int) -> int:
    """Sleeps past the timeout.

    Args:
        x: anything
    """
    time.sleep(0.5)
    return x


def lookup(key: str) -> dict:
    """Returns a record.

    Args:
        key: the key
    """
    return {"key": key, "thread": threading.current_thread().name}


class Hermes(ToolEnvironment):
    tools = [mul, slow_add, explode, stall, lookup]
    tool_timeout_s = 0.1


class Plain(ToolEnvironment):
    tools = [mul, slow_add]
    tool_format = "plain"


def call(name, args):
    import json
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def step(env, content):
    return asyncio.run(env.step({"role": "assistant", "content": content}))


def test_sync_and_async_tools_run_in_order_and_answer_with_tool_messages():
    env = Hermes()
    text = "Working.\n" + call("mul", {"a": 6, "b": 7}) + call("slow_add", {"a": 1, "b": 2}) + call("lookup", {"key": "k"})
    parsed = env.parse({"role": "assistant", "content": text})
    obs, reward, done, info = step(env, text)
    assert (reward, done) == (None, False)
    assert [o["content"] for o in obs[:2]] == ["42", "3"]
    assert obs[2]["content"].startswith('{"key": "k", "thread": ') and "MainThread" not in obs[2]["content"]
    assert [o["role"] for o in obs] == ["tool"] * 3 and [o["name"] for o in obs] == ["mul", "slow_add", "lookup"]
    assert info == {"tool_calls": 3, "malformed_tool_calls": 0, "tool_errors": 0}
    # The parsed turn is OpenAI-shaped, and its ids are the ones the answers carry.
    assert parsed["content"] == "Working."
    assert [c["function"] for c in parsed["tool_calls"]][0] == {"name": "mul", "arguments": {"a": 6, "b": 7}}
    assert [c["id"] for c in parsed["tool_calls"]] == [o["tool_call_id"] for o in obs]
    assert all(len(c["id"]) == 9 for c in parsed["tool_calls"])  # Mistral's templates insist
    # The next turn's ids continue, not restart.
    assert step(env, call("mul", {"a": 1, "b": 1})).observations[0]["tool_call_id"] not in {o["tool_call_id"] for o in obs}


def test_a_turn_without_calls_is_the_final_answer():
    result = step(Hermes(), "The answer is 42.")
    assert isinstance(result, StepResult) and result.done and result.observations == []
    assert Hermes().parse({"role": "assistant", "content": "42"}) == {"role": "assistant", "content": "42"}


@pytest.mark.parametrize("text,counter,needle", [
    (call("div", {"a": 1}), "malformed_tool_calls", "there is no tool div; the tools are explode, lookup, mul"),
    (call("mul", {"a": 1}), "malformed_tool_calls", "wrong arguments for mul(a, b): missing a required argument: 'b'"),
    (call("mul", {"a": 1, "b": 2, "c": 3}), "malformed_tool_calls", "unexpected keyword argument 'c'"),
    (call("mul", {"a": "1", "b": 2}), "malformed_tool_calls", 'argument a of mul must be an integer, got "1"'),
    ("<tool_call>{not json}</tool_call>", "malformed_tool_calls", "not valid JSON"),
    (call("explode", {"x": "it"}), "tool_errors", "explode raised ValueError: cannot handle it"),
    (call("stall", {"x": 1}), "tool_errors", "stall took longer than 0.1 s"),
])
def test_failed_calls_are_answered_with_what_went_wrong_and_counted(text, counter, needle):
    obs, reward, done, info = step(Hermes(), text)
    assert not done and len(obs) == 1
    assert obs[0]["content"].startswith("error: ") and needle in obs[0]["content"], obs[0]["content"]
    assert info[counter] == 1 and info["tool_calls"] == 0


def test_a_bad_call_beside_a_good_one_still_lets_the_good_one_run():
    obs, _, _, info = step(Plain(), "mul(2,3)\nmul(2,\nslow_add(1,1)")
    assert [o["content"] for o in obs] == ["6", "error: the call to mul is not closed: write mul(...) alone on its line", "2"]
    assert info == {"tool_calls": 2, "malformed_tool_calls": 1, "tool_errors": 0}


def test_calls_already_split_out_are_run_as_given():
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "mul", "arguments": '{"a": 3, "b": 3}'}}]}
    obs, _, done, info = asyncio.run(Plain().step(message))
    assert obs[0]["content"] == "9" and not done and info["tool_calls"] == 1
    assert obs[0]["tool_call_id"] == "x"  # the answer names the call it answers


def test_environment_settings_are_checked_when_the_class_is_defined():
    with pytest.raises(TypeError, match="tool_format = 'xml'"):
        type("Bad", (ToolEnvironment,), {"tool_format": "xml"})
    with pytest.raises(TypeError, match="max_turns = 0"):
        type("Bad", (ToolEnvironment,), {"max_turns": 0})


def test_default_reset_reads_the_example():
    class Sys(Plain):
        system_prompt = "Use the tools."

    messages, tools = Sys().reset({"prompt": "6*7?"})
    assert messages == [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "6*7?"}]
    assert tools == [mul, slow_add]
    assert Plain().reset({"messages": [{"role": "user", "content": "hi"}]})[0] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="neither a 'messages' list nor a 'prompt' string"):
        Plain().reset({"question": "?"})


def test_environment_is_abstract_until_step_is_defined():
    with pytest.raises(TypeError, match="abstract"):
        Environment()

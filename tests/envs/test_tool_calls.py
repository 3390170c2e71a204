"""Reading and writing tool calls: the hermes and plain formats, well-formed and not."""

from __future__ import annotations

import ast
import gc
import sys

import pytest

from tokenflow.envs.tool_calls import (
    ToolCall, ToolCallError, parse_tool_calls, render_plain_call, render_tool_call, text_outside_calls,
)


def mul(a: int, b: int) -> int:
    return a * b


def greet(name: str, loud: bool = False) -> str:
    return name


TOOLS = [mul, greet]


# ---- hermes ----------------------------------------------------------------------------------------

def test_hermes_reads_several_calls_with_their_spans():
    text = ('Let me compute.\n<tool_call>\n{"name": "mul", "arguments": {"a": 12, "b": 34}}\n</tool_call>\n'
            '<tool_call>{"name": "greet", "arguments": {"name": "Ada"}}</tool_call>')
    calls = parse_tool_calls(text, "hermes", TOOLS)
    assert [type(c) for c in calls] == [ToolCall, ToolCall]
    assert calls[0].name == "mul" and calls[0].arguments == {"a": 12, "b": 34}
    assert calls[1].arguments == {"name": "Ada"}
    assert text[calls[0].span[0]:calls[0].span[1]].startswith("<tool_call>")
    assert text[calls[1].span[0]:calls[1].span[1]].endswith("</tool_call>")
    assert text_outside_calls(text, calls) == "Let me compute."


def test_hermes_accepts_arguments_as_a_json_string_and_llama_style_parameters():
    text = '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>' \
           '<tool_call>{"name": "mul", "parameters": {"a": 4, "b": 5}}</tool_call>'
    assert [c.arguments for c in parse_tool_calls(text, "hermes", TOOLS)] == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]


@pytest.mark.parametrize("text,needle", [
    ("<tool_call>{name: mul}</tool_call>", "not valid JSON"),
    ('<tool_call>["mul", 1]</tool_call>', '"name" string'),
    ('<tool_call>{"name": "mul", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "div", "arguments": {}}</tool_call>', "there is no tool div; the tools are greet, mul"),
    ('<tool_call>{"name": "mul", "arguments": {"a": 1', "no closing </tool_call>"),
])
def test_hermes_malformed_calls_say_what_is_wrong(text, needle):
    (call,) = parse_tool_calls(text, "hermes", TOOLS)
    assert isinstance(call, ToolCallError) and needle in call.message
    assert call.span[0] == 0


def test_hermes_without_tools_does_not_check_names():
    (call,) = parse_tool_calls('<tool_call>{"name": "anything", "arguments": {}}</tool_call>', "hermes")
    assert isinstance(call, ToolCall) and call.name == "anything"


# ---- plain -----------------------------------------------------------------------------------------

def test_plain_maps_positional_arguments_to_parameters_in_order():
    (call,) = parse_tool_calls("mul(12,34)", "plain", TOOLS)
    assert call == ToolCall("mul", {"a": 12, "b": 34}, (0, 10))


def test_plain_reads_numbers_strings_keywords_and_json_literals():
    text = "I will greet.\n  greet('Ada', loud=true)  \nmul(-3, 2.5)\nthen 42"
    calls = parse_tool_calls(text, "plain", TOOLS)
    assert [(c.name, c.arguments) for c in calls] == [("greet", {"name": "Ada", "loud": True}),
                                                      ("mul", {"a": -3, "b": 2.5})]
    assert text_outside_calls(text, calls) == "I will greet.\n\n\nthen 42"


def test_plain_text_without_calls_is_content():
    assert parse_tool_calls("3930", "plain", TOOLS) == []
    assert parse_tool_calls("the answer: mul(2,3) is 6", "plain", TOOLS) == []  # not alone on its line


@pytest.mark.parametrize("text,needle", [
    ("mul(12,", "not closed"),
    ("mul(x,1)", "argument a of mul (x) is not a number or a quoted string"),
    ("mul(1,2,3)", "mul takes 2 arguments (a, b), got 3"),
    ("div(1,2)", "there is no tool div"),
    ("mul(1 2)", "could not be read: write mul(a,b)"),
    ("mul(*xs)", "could not be read"),
    ("mul(1, a=2)", "argument a of mul is given twice"),
])
def test_plain_malformed_calls_say_what_is_wrong(text, needle):
    (call,) = parse_tool_calls(text, "plain", TOOLS)
    assert isinstance(call, ToolCallError) and needle in call.message, call


def test_plain_needs_the_tools():
    with pytest.raises(ValueError, match="needs the tools"):
        parse_tool_calls("mul(1,2)", "plain")
    with pytest.raises(ValueError, match="unknown tool-call format"):
        parse_tool_calls("mul(1,2)", "xml", TOOLS)


# ---- rendering -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["hermes", "plain"])
def test_rendered_calls_read_back(fmt):
    args = {"name": 'say "hi"', "loud": False}
    (call,) = parse_tool_calls(render_tool_call("greet", args, fmt), fmt, TOOLS)
    assert isinstance(call, ToolCall) and call.arguments == args


def test_plain_rendering_is_what_a_tiny_model_writes():
    assert render_plain_call("mul", {"a": 12, "b": 34}) == "mul(12,34)"
    assert render_plain_call("greet", ["Ada", True]) == 'greet("Ada",true)'
    assert render_tool_call("mul", {"a": 1, "b": 2}, "hermes") == \
        '<tool_call>\n{"name": "mul", "arguments": {"a": 1, "b": 2}}\n</tool_call>'




# ---- interleaved parses ----------------------------------------------------------------------------

class _ParsesWhenFreed:
    """Cyclic garbage whose finalizer parses Python, as another library's thread would: when the
    collector frees it in the middle of a parse, the two parses interleave."""

    def __init__(self, parse):
        self.me, self.parse = self, parse

    def __del__(self):
        self.parse("g(1, [2, 3])", mode="eval")


def _failures_under_interleaving(monkeypatch, read, n=200) -> int:
    """How many of n calls of ``read`` raise SystemError when the first `ast.parse` of each call
    starts with a `_ParsesWhenFreed` waiting and a collector that runs at nearly every allocation
    (so it runs, and frees it, while the parse builds its tree)."""
    real_parse, armed = ast.parse, [False]

    def parse(*args, **kwargs):
        if armed[0]:
            armed[0] = False
            _ParsesWhenFreed(real_parse)
        return real_parse(*args, **kwargs)

    failures, thresholds = 0, gc.get_threshold()
    with monkeypatch.context() as patch:
        patch.setattr(ast, "parse", parse)
        gc.set_threshold(1)
        try:
            for _ in range(n):
                armed[0] = True
                try:
                    read()
                except SystemError:
                    failures += 1
        finally:
            gc.set_threshold(*thresholds)
    return failures


def test_plain_calls_are_read_when_another_parse_interleaves(monkeypatch):
    """CPython 3.11 counts `ast.parse`'s construction depth in interpreter-wide state, so a parse
    another one interleaves with fails with a spurious "recursion depth mismatch" SystemError
    (`tool_calls._parse_expression`). The same interleaving is forced on a bare `ast.parse`, which
    must fail (or this interpreter does not race, and there is nothing to check), and on reading
    a plain call, which must not."""
    bare = _failures_under_interleaving(monkeypatch, lambda: ast.parse("f(12, 34)", mode="eval"))
    if bare == 0:
        pytest.skip(f"this interpreter ({sys.version.split()[0]}) does not race")
    calls = []
    ours = _failures_under_interleaving(
        monkeypatch, lambda: calls.append(parse_tool_calls("then\nmul(12, 34)\n", "plain", TOOLS)))
    assert ours == 0, f"{ours} of 200 reads failed (a bare parse failed {bare} times)"
    assert calls == [[ToolCall("mul", {"a": 12, "b": 34}, (5, 16))]] * 200

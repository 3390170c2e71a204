"""Tool calls written in an assistant message: find them, read them, write them.

Two formats (``Environment.tool_format``):

* ``"hermes"`` — the JSON format of Hermes and Qwen2.5/Qwen3 models, any number per message::

      <tool_call>
      {"name": "mul", "arguments": {"a": 12, "b": 34}}
      </tool_call>

* ``"plain"`` — a call alone on its line, positional arguments in the order of the function's
  parameters, as a tiny character-level model can learn to write it::

      mul(12,34)

  Arguments are numbers, quoted strings, ``true``/``false``/``null`` (or Python's spellings),
  lists and dicts of those; ``name=value`` keyword arguments are read too. A line that starts
  like a call (``name(``) but does not read as one is a malformed call, not text.

Both give the same records: a `ToolCall` (name, arguments dict, the span of text it came from)
or a `ToolCallError` (what was wrong, phrased so that a model reading it can fix the call). The
parser checks syntax and tool names; whether the arguments fit the function is checked where it
runs (`tokenflow.envs.tool_env`).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

FORMATS = ("hermes", "plain")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_PLAIN_START = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_]*)\(", re.M)
_PLAIN_CALL = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)[ \t]*")
_PLAIN_LITERAL_NAMES = {"true": True, "false": False, "null": None, "none": None}
_MAX_CALL_CHARS = 10_000  # longer "calls" are refused before the Python parser sees them
# CPython 3.11 (3.11.7 here) keeps the depth counter of `ast.parse`'s object construction in
# interpreter-wide state: a parse that another parse interleaves with (the collector runs a
# finalizer mid-construction, which parses, or hands the GIL to a thread that does) fails with a
# spurious "AST constructor recursion depth mismatch" SystemError. Calls are read on the engine's
# thread and on the environment loop's, so our parses take turns; one that another library's
# parse interleaves with is parsed again.
_PARSE_LOCK = threading.RLock()  # re-entrant: a finalizer run mid-parse may read a call too
_PARSE_TRIES = 8


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call."""

    name: str
    arguments: dict[str, Any]
    span: tuple[int, int]
    """Where the call's text is in the message: ``text[span[0]:span[1]]``."""

    def to_openai(self, call_id: str) -> dict:
        """The call in the OpenAI message shape (arguments as a dict, as chat templates take them)."""
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class ToolCallError:
    """A call that could not be read, or names no tool."""

    message: str
    """What was wrong, phrased for the model (it is sent back as the tool's answer)."""
    span: tuple[int, int]
    name: str | None = None
    """The tool name, when it could be read."""


ParsedCall = ToolCall | ToolCallError


@dataclass(frozen=True)
class ToolSpec:
    """What the parser needs to know of a tool: its name and its parameters, in order."""

    name: str
    params: tuple[str, ...] = field(default=())


def tool_specs(tools: Sequence[Callable] | Mapping[str, Callable | ToolSpec] | None) -> dict[str, ToolSpec] | None:
    """Name → `ToolSpec` for plain functions (a mapping keeps its own names; `ToolSpec` values,
    e.g. built from JSON schemas, are kept as they are)."""
    if tools is None:
        return None
    items = tools.items() if isinstance(tools, Mapping) else ((t.__name__, t) for t in tools)
    specs = {}
    for name, fn in items:
        if isinstance(fn, ToolSpec):
            specs[name] = fn
            continue
        params = tuple(p.name for p in inspect.signature(fn).parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        specs[name] = ToolSpec(name, params)
    return specs


def parse_tool_calls(text: str, tool_format: str,
                     tools: Sequence[Callable] | Mapping[str, Callable | ToolSpec] | None = None) -> list[ParsedCall]:
    """Every tool call in ``text``, in order of appearance.

    ``tools`` (functions, or a name → function or `ToolSpec` mapping) lets the parser refuse
    unknown names; the plain format needs it to map positional arguments to parameter names.
    """
    if tool_format == "hermes":
        return _parse_hermes(text, tool_specs(tools))
    if tool_format == "plain":
        specs = tool_specs(tools)
        if specs is None:
            raise ValueError("the plain tool-call format needs the tools, to map positional arguments to names")
        return _parse_plain(text, specs)
    raise ValueError(f"unknown tool-call format {tool_format!r}; use one of {', '.join(FORMATS)}")


def text_outside_calls(text: str, calls: Sequence[ParsedCall]) -> str:
    """``text`` without the spans of its well-formed calls, stripped (a message's ``content``)."""
    out, pos = [], 0
    for c in sorted((c for c in calls if isinstance(c, ToolCall)), key=lambda c: c.span):
        out.append(text[pos:c.span[0]])
        pos = c.span[1]
    out.append(text[pos:])
    return "".join(out).strip()


def render_tool_call(name: str, arguments: Mapping[str, Any], tool_format: str) -> str:
    """The text a model writes for one call in ``tool_format`` (the parser reads it back)."""
    if tool_format == "hermes":
        body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        return f"{_HERMES_OPEN}\n{body}\n{_HERMES_CLOSE}"
    if tool_format == "plain":
        return render_plain_call(name, arguments)
    raise ValueError(f"unknown tool-call format {tool_format!r}; use one of {', '.join(FORMATS)}")


def render_plain_call(name: str, arguments: Mapping[str, Any] | Sequence[Any]) -> str:
    """``name(v1,v2)``: values as JSON (what a chat template's ``tojson`` writes), in order."""
    values = arguments.values() if isinstance(arguments, Mapping) else arguments
    return f"{name}({','.join(json.dumps(v, ensure_ascii=False) for v in values)})"


# ---- hermes ---------------------------------------------------------------------------------------

def _parse_hermes(text: str, specs: dict[str, ToolSpec] | None) -> list[ParsedCall]:
    calls: list[ParsedCall] = []
    pos = 0
    while (start := text.find(_HERMES_OPEN, pos)) != -1:
        body_start = start + len(_HERMES_OPEN)
        close = text.find(_HERMES_CLOSE, body_start)
        if close == -1:
            calls.append(ToolCallError(f"the tool call has no closing {_HERMES_CLOSE}", (start, len(text))))
            break
        end = close + len(_HERMES_CLOSE)
        calls.append(_read_hermes_body(text[body_start:close], (start, end), specs))
        pos = end
    return calls


def _read_hermes_body(body: str, span: tuple[int, int], specs: dict[str, ToolSpec] | None) -> ParsedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCallError(f"the tool call is not valid JSON ({e.msg} at column {e.colno}); write "
                             '{"name": ..., "arguments": {...}}', span)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCallError('the tool call needs a JSON object with a "name" string and an "arguments" '
                             "object", span)
    name = obj["name"]
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's API does
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCallError(f'the "arguments" of {name} must be a JSON object', span, name)
    if specs is not None and name not in specs:
        return ToolCallError(_unknown_tool(name, specs), span, name)
    return ToolCall(name, args, span)


# ---- plain ----------------------------------------------------------------------------------------

def _parse_plain(text: str, specs: dict[str, ToolSpec]) -> list[ParsedCall]:
    calls: list[ParsedCall] = []
    for m in _PLAIN_START.finditer(text):
        line_end = text.find("\n", m.start())
        span = (m.start(), len(text) if line_end == -1 else line_end)
        calls.append(_read_plain_line(text[span[0]:span[1]], span, specs))
    return calls


def _read_plain_line(line: str, span: tuple[int, int], specs: dict[str, ToolSpec]) -> ParsedCall:
    m = _PLAIN_CALL.fullmatch(line)
    name = _PLAIN_START.match(line).group(1)
    if m is None:
        return ToolCallError(f"the call to {name} is not closed: write {name}(...) alone on its line", span, name)
    if name not in specs:
        return ToolCallError(_unknown_tool(name, specs), span, name)
    if len(line) > _MAX_CALL_CHARS:
        return ToolCallError(f"the call to {name} is too long", span, name)
    try:
        node = _parse_expression(f"f({m.group(2)})").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ToolCallError(f"the arguments of {name} could not be read: write {_usage(specs[name])}", span, name)
    if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args) \
            or any(k.arg is None for k in node.keywords):
        return ToolCallError(f"the arguments of {name} could not be read: write {_usage(specs[name])}", span, name)
    params = specs[name].params
    if len(node.args) > len(params):
        return ToolCallError(f"{name} takes {len(params)} argument{'s' if len(params) != 1 else ''} "
                             f"({', '.join(params)}), got {len(node.args)}", span, name)
    arguments: dict[str, Any] = {}
    pairs = [(params[i], a) for i, a in enumerate(node.args)] + [(k.arg, k.value) for k in node.keywords]
    for key, value_node in pairs:
        try:
            value = _literal(value_node)
        except (ValueError, TypeError, SyntaxError):
            source = ast.get_source_segment(f"f({m.group(2)})", value_node) or "?"
            return ToolCallError(f"argument {key} of {name} ({source}) is not a number or a quoted string",
                                 span, name)
        if key in arguments:
            return ToolCallError(f"argument {key} of {name} is given twice", span, name)
        arguments[key] = value
    return ToolCall(name, arguments, span)


def _parse_expression(source: str) -> ast.Expression:
    with _PARSE_LOCK:
        for _ in range(_PARSE_TRIES - 1):
            try:
                return ast.parse(source, mode="eval")
            except SystemError as e:
                if "recursion depth mismatch" not in str(e):
                    raise
        return ast.parse(source, mode="eval")


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id.lower() in _PLAIN_LITERAL_NAMES:
        return _PLAIN_LITERAL_NAMES[node.id.lower()]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)  # numbers, strings, True/False/None, signed numbers; ValueError otherwise


def _usage(spec: ToolSpec) -> str:
    return f"{spec.name}({','.join(spec.params)})"


def _unknown_tool(name: str, specs: Mapping[str, ToolSpec]) -> str:
    return f"there is no tool {name}; the tools are {', '.join(sorted(specs)) or 'none'}"

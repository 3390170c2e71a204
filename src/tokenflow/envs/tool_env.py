"""`ToolEnvironment`: the model calls Python functions until it answers.

Each step reads the tool calls in the assistant's text (in the class's ``tool_format``), runs
them in order and answers with one tool message per call. A turn without any call is the final
answer: the episode is done. A call that cannot be run — unreadable, an unknown tool, arguments
that do not fit, a tool that raises or overruns ``tool_timeout_s`` — is answered with a tool
message saying what was wrong, so the model can learn to call properly, and is counted in the
step's ``info``:

* ``tool_calls``: calls that ran and returned,
* ``malformed_tool_calls``: calls that could not be read, named no tool or had wrong arguments,
* ``tool_errors``: calls that raised or timed out.

Synchronous tools run in a worker thread (``asyncio.to_thread``) so that a slow one does not
stall other episodes; ``async def`` tools are awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from typing import Any, Callable, ClassVar

from tokenflow.envs.base import Environment, StepResult
from tokenflow.envs.tool_calls import ParsedCall, ToolCall, ToolCallError, parse_tool_calls, text_outside_calls

_SCALARS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


class ToolEnvironment(Environment):
    """An `Environment` whose step runs the tool calls of each assistant turn."""

    tool_timeout_s: ClassVar[float | None] = 30.0
    """Longest a tool call may run before it is answered with a timeout error (a synchronous
    tool's thread cannot be stopped; it finishes in the background)."""

    def __init__(self) -> None:
        super().__init__()
        self._calls_made = 0

    # ---- reading a turn ---------------------------------------------------------------------------
    def tool_map(self) -> dict[str, Callable]:
        return {fn.__name__: fn for fn in self.tools}

    def parse_calls(self, content: str) -> list[ParsedCall]:
        """The calls in an assistant turn's text, read in this environment's format."""
        return parse_tool_calls(content or "", self.tool_format, self.tool_map())

    def parse(self, assistant_message: dict) -> dict:
        """``{"role": "assistant", "content": <text outside the calls>, "tool_calls": [...]}`` with
        the well-formed calls in the OpenAI shape (no ``tool_calls`` key when there are none).
        Called before `step` on the same turn, its call ids are the ``tool_call_id`` of the
        messages `step` answers with."""
        if assistant_message.get("tool_calls"):
            return dict(assistant_message)
        content = assistant_message.get("content") or ""
        calls = self.parse_calls(content)
        message = {"role": "assistant", "content": text_outside_calls(content, calls)}
        ids = self._ids(len(calls), self._calls_made)
        good = [c.to_openai(i) for c, i in zip(calls, ids) if isinstance(c, ToolCall)]
        if good:
            message["tool_calls"] = good
        return message

    @staticmethod
    def _ids(n: int, first: int) -> list[str]:
        # Nine characters: Mistral's templates refuse tool-call ids of any other length.
        return [f"call{first + i:05d}" for i in range(n)]

    # ---- the step ---------------------------------------------------------------------------------
    async def step(self, assistant_message: dict) -> StepResult:
        calls, given_ids = self._calls_of(assistant_message)
        info = {"tool_calls": 0, "malformed_tool_calls": 0, "tool_errors": 0}
        if not calls:
            return StepResult([], None, True, info)
        ids = [given or made for given, made in zip(given_ids, self._ids(len(calls), self._calls_made))]
        self._calls_made += len(calls)
        observations = []
        for call, call_id in zip(calls, ids):
            kind, content = await self._answer(call)
            info[kind] += 1
            observations.append({"role": "tool", "tool_call_id": call_id,
                                 "name": call.name or "", "content": content})
        return StepResult(observations, None, False, info)

    def _calls_of(self, message: dict) -> tuple[list[ParsedCall], list[str | None]]:
        """The turn's calls, and the ids they already carry (None: to be given one)."""
        if message.get("tool_calls"):  # already split out (an OpenAI-style client wrote them)
            out: list[ParsedCall] = []
            for tc in message["tool_calls"]:
                fn = tc.get("function", tc)
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        out.append(ToolCallError(f"the arguments of {fn.get('name')} are not valid JSON", (0, 0),
                                                 fn.get("name")))
                        continue
                out.append(ToolCall(fn.get("name", ""), args if isinstance(args, dict) else {}, (0, 0)))
            return out, [tc.get("id") for tc in message["tool_calls"]]
        calls = self.parse_calls(message.get("content") or "")
        return calls, [None] * len(calls)

    async def _answer(self, call: ParsedCall) -> tuple[str, str]:
        """(info counter, tool message content) for one call."""
        if isinstance(call, ToolCallError):
            return "malformed_tool_calls", self.format_error(call.message)
        fn = self.tool_map().get(call.name)
        if fn is None:
            return "malformed_tool_calls", self.format_error(
                f"there is no tool {call.name}; the tools are {', '.join(sorted(self.tool_map())) or 'none'}")
        problem = check_arguments(fn, call.arguments)
        if problem:
            return "malformed_tool_calls", self.format_error(problem)
        try:
            if inspect.iscoroutinefunction(fn):
                run = fn(**call.arguments)
            else:
                run = asyncio.to_thread(fn, **call.arguments)
            result = await asyncio.wait_for(run, self.tool_timeout_s)
            if inspect.isawaitable(result):  # a callable object with an async __call__
                result = await asyncio.wait_for(result, self.tool_timeout_s)
        except asyncio.TimeoutError:
            return "tool_errors", self.format_error(f"{call.name} took longer than {self.tool_timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - the tool's failure is the model's feedback
            return "tool_errors", self.format_error(f"{call.name} raised {type(e).__name__}: {e}")
        return "tool_calls", self.format_result(result)

    def format_result(self, result: Any) -> str:
        """A tool's return value as the content of its tool message: strings as they are, other
        values as JSON (``str()`` when not JSON-serialisable)."""
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(result)

    def format_error(self, message: str) -> str:
        """The content of a tool message reporting a failed call."""
        return f"error: {message}"


def check_arguments(fn: Callable, arguments: dict) -> str | None:
    """What is wrong with calling ``fn(**arguments)`` (missing or unexpected arguments, a value
    of the wrong type for an int/float/str/bool parameter), or None when the call fits."""
    name = getattr(fn, "__name__", "the tool")
    sig = inspect.signature(fn)
    try:
        sig.bind(**arguments)
    except TypeError as e:
        return f"wrong arguments for {name}{_plain_signature(sig)}: {e}"
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: nothing to check against
        return None
    for key, value in arguments.items():
        want = hints.get(key)
        if want in _SCALARS and not _fits(value, want):
            return f"argument {key} of {name} must be {_SCALARS[want]}, got {json.dumps(value, default=str)}"
    return None


def _fits(value: Any, want: type) -> bool:
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def _plain_signature(sig: inspect.Signature) -> str:
    return "(" + ", ".join(p.name for p in sig.parameters.values()) + ")"

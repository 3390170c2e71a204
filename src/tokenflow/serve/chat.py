"""Chat requests as token ids, and tool calls out of the model's text.

A conversation is rendered with the model's chat template through `ChatBridge` (the same
rendering multi-turn training uses), with the request's ``tools`` passed to the template as
their JSON schemas; generation stops at the template's turn-end ids (and EOS). Tool calls are
read from the completion's text by `tokenflow.envs.tool_calls` in the request's
``tool_format``; what is not a well-formed call stays in ``content``.
"""

from __future__ import annotations

import json
import secrets

from tokenflow.envs.bridge import BridgeError, ChatBridge
from tokenflow.envs.tool_calls import ToolCall as ParsedToolCall
from tokenflow.envs.tool_calls import ToolSpec, parse_tool_calls, text_outside_calls
from tokenflow.serve.errors import bad_request
from tokenflow.serve.protocol import ChatMessage, FunctionCall, Tool, ToolCallOut


class ChatFormat:
    """The model's chat template, or the reason there is none (chat requests then get a 400)."""

    def __init__(self, tokenizer) -> None:
        self.bridge: ChatBridge | None = None
        self.unavailable = ""
        if tokenizer is None:
            self.unavailable = "this model has no tokenizer; send token ids to /v1/completions"
            return
        try:
            self.bridge = ChatBridge(tokenizer)
        except BridgeError as e:
            self.unavailable = f"this model cannot serve chat requests ({e}); use /v1/completions"

    @property
    def turn_end_ids(self) -> tuple[int, ...]:
        return self.bridge.turn_end_ids if self.bridge is not None else ()

    def prompt_ids(self, messages: list[ChatMessage], tools: list[Tool] | None) -> list[int]:
        """The conversation and the generation prompt, as the template renders them."""
        if self.bridge is None:
            raise bad_request(self.unavailable, "messages", "chat_template_missing")
        schemas = [t.model_dump(mode="json", exclude_none=True) for t in tools] if tools else None
        try:
            return self.bridge.prompt_ids(template_messages(messages), schemas=schemas)
        except BridgeError as e:
            raise bad_request(str(e), "messages") from None


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """OpenAI messages as chat templates take them: text parts joined, "developer" read as
    "system", tool-call arguments decoded from their JSON strings into objects."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        msg: dict = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name,
                              "arguments": _arguments(c.function.arguments, f"messages[{i}].tool_calls[{j}]")}}
                for j, c in enumerate(m.tool_calls)]
        out.append(msg)
    return out


def _arguments(text: str, param: str) -> dict:
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise bad_request(f"the arguments of a tool call must be a JSON object; {e.msg} at column {e.colno}",
                          f"{param}.function.arguments") from None
    if not isinstance(value, dict):
        raise bad_request("the arguments of a tool call must be a JSON object",
                          f"{param}.function.arguments")
    return value


def tool_specs(tools: list[Tool]) -> dict[str, ToolSpec]:
    """What the parser needs of each tool: its name and its parameters in schema order (the
    plain format's positional arguments follow that order)."""
    specs = {}
    for t in tools:
        params = (t.function.parameters or {}).get("properties") or {}
        specs[t.function.name] = ToolSpec(t.function.name, tuple(params) if isinstance(params, dict) else ())
    return specs


def parse_output(text: str, tools: list[Tool], tool_format: str) -> tuple[str | None, list[ToolCallOut]]:
    """(content, tool calls) of a completion's text. Malformed calls and calls to tools the
    request did not offer stay in the content, as text."""
    calls = [c for c in parse_tool_calls(text, tool_format, tool_specs(tools)) if isinstance(c, ParsedToolCall)]
    if not calls:
        return text, []
    content = text_outside_calls(text, calls)
    out = [ToolCallOut(id=f"call_{secrets.token_hex(12)}",
                       function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)))
           for c in calls]
    return content or None, out

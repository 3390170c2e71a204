"""Chat requests as token ids, and tool calls out of the model's text.

A conversation is rendered with the model's chat template through `ChatBridge` (the same
rendering multi-turn training uses), with the request's ``tools`` passed to the template as
their JSON schemas; generation stops at the template's turn-end ids (and EOS). Tool calls are
read from the completion's text by `tokenflow.envs.tool_calls` in the request's
``tool_format``; what is not a well-formed call stays in ``content``.

**Markers typed by a client are text.** The template's own markers (ChatML's ``<|im_start|>``,
``<|im_end|>``, a tool role's tag) are special tokens; the same characters inside what a client
wrote — the text, names and tool-call ids of system, user and tool messages, and the request's
tool schemas — must not become them, or a user could forge turns and tool results. When such a
string holds a marker (`markers`: the tokenizer's special added tokens, and added tokens that look
like markup, ``<tool_call>``), each marker there is swapped for a placeholder of plain letters,
the template renders the conversation as text, and the text is tokenized piece by piece: the
template's text with its markers as special tokens, each placeholder as the marker's characters
(``split_special_tokens``). A conversation without markers renders exactly as before. The
assistant's own turns are left as they are (the model wrote those tokens).
"""

from __future__ import annotations

import json
import re
import secrets

from tokenflow.envs.bridge import BridgeError, ChatBridge
from tokenflow.envs.template_tools import dropped_tools, tool_rendering, warn_dropped_tools
from tokenflow.envs.tool_calls import ToolCall as ParsedToolCall
from tokenflow.envs.tool_calls import ToolSpec, parse_tool_calls, text_outside_calls
from tokenflow.serve.errors import bad_request
from tokenflow.serve.protocol import ChatMessage, FunctionCall, Tool, ToolCallOut


class ChatFormat:
    """The model's chat template, or the reason there is none (chat requests then get a 400)."""

    def __init__(self, tokenizer, model_name: str = "this model", allow_dropped_tools: bool = False) -> None:
        self.model_name = model_name
        self.allow_dropped_tools = allow_dropped_tools
        self.bridge: ChatBridge | None = None
        self.unavailable = ""
        self.tokenizer = tokenizer
        self.markers, self.added_ids = markers(tokenizer)
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
        msgs = template_messages(messages)
        self.check_tools(bool(schemas), any(m.get("tool_calls") for m in msgs))
        try:
            if not self.has_markers(msgs, schemas):
                return self.bridge.prompt_ids(msgs, schemas=schemas)
            return self._marked_prompt_ids(msgs, schemas)
        except BridgeError as e:
            raise bad_request(str(e), "messages") from None

    def check_tools(self, tools: bool, calls: bool) -> None:
        """A 400 when the template would drop the offered tools or the history's tool calls
        (`tokenflow.envs.template_tools`), unless ``serve.allow_dropped_tools``: then logged once."""
        if not (tools or calls):
            return
        bridge = self.bridge
        rendering = tool_rendering(self.tokenizer, bridge.chat_template, **bridge.template_kwargs)
        name = f"the chat template of {self.model_name}"
        reason = dropped_tools(rendering, tools=tools, calls=calls, name=name)
        if reason is None:
            return
        if self.allow_dropped_tools:
            warn_dropped_tools(self.tokenizer, f"serving {self.model_name}", tools=tools, calls=calls)
            return
        raise bad_request(f"{reason}, so the model would never see them. Serve a model whose template renders "
                          "tools (tokenflow writes one for smollm2-135m-instruct), or start the server with "
                          "--serve.allow_dropped_tools true to serve such requests without them",
                          "tools" if tools and not rendering.tools else "messages", "tools_not_rendered")

    def has_markers(self, messages: list[dict], schemas: list[dict] | None = None) -> bool:
        """Whether a client-written string of these messages (not the assistant's) or tools holds
        one of the template's markers."""
        if self.markers is None:
            return False
        written = [m for m in messages if m.get("role") != "assistant"]
        return any(self.markers.search(t) for t in _each_string([written, schemas]))

    def _marked_prompt_ids(self, messages: list[dict], schemas: list[dict] | None) -> list[int]:
        """The prompt ids with every marker in client-written strings tokenized as its text."""
        nonce, typed = secrets.token_hex(6), []

        def hide(text: str) -> str:
            def one(m: re.Match) -> str:
                typed.append(m.group(0))
                return f"TFMARK{nonce}N{len(typed) - 1}N"
            return self.markers.sub(one, text)

        messages = [m if m.get("role") == "assistant" else _strings(m, hide) for m in messages]
        bridge = self.bridge
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=_strings(schemas, hide), add_generation_prompt=True, tokenize=False,
                chat_template=bridge.chat_template, **bridge.template_kwargs)
        except Exception as e:  # noqa: BLE001 - Jinja raises many types
            raise BridgeError(f"the chat template cannot render this conversation: {type(e).__name__}: {e}") from e
        ids: list[int] = []
        for i, piece in enumerate(re.split(f"TFMARK{nonce}N(\\d+)N", text)):
            if i % 2:
                ids += self._text_ids(typed[int(piece)], first=not ids)
            elif piece:
                ids += self._encode(piece, first=not ids, split=False)
        return [int(t) for t in ids]

    def _text_ids(self, text: str, first: bool) -> list[int]:
        """``text``'s ids with no added token among them (a non-special added token is not split by
        ``split_special_tokens``: then its first character goes alone)."""
        ids = self._encode(text, first=first, split=True)
        if len(text) > 1 and any(t in self.added_ids for t in ids):
            return self._text_ids(text[:1], first) + self._text_ids(text[1:], False)
        return ids

    def _encode(self, text: str, *, first: bool, split: bool) -> list[int]:
        """The ids of a piece of the rendered chat. One that does not start it is encoded after a
        newline, which is then taken off, so that a SentencePiece tokenizer adds no word-start
        space the whole text would not have there (as transformers' own ``encode_marked_chat``)."""
        kw = {"add_special_tokens": False, "split_special_tokens": split}
        if not first:
            newline = self.tokenizer("\n", **kw)["input_ids"]
            ids = list(self.tokenizer("\n" + text, **kw)["input_ids"])
            if newline and ids[:len(newline)] == newline:
                return ids[len(newline):]
        return list(self.tokenizer(text, **kw)["input_ids"])


_MARKUP = re.compile(r"<[^<>\s]{1,64}>|\[/?[A-Z_]{2,32}\]")


def markers(tokenizer) -> tuple[re.Pattern | None, frozenset[int]]:
    """A pattern of the strings that tokenize as template markers (the special added tokens, and
    the added tokens that look like markup), and the ids of all added tokens."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {t.content for t in added.values()
             if t.content and (getattr(t, "special", False) or _MARKUP.fullmatch(t.content))}
    if not texts:
        return None, frozenset(added)
    pattern = "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))
    return re.compile(pattern), frozenset(int(i) for i in added)


def _each_string(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _each_string(v)
    elif isinstance(value, list):
        for v in value:
            yield from _each_string(v)


def _strings(value, fn):
    """``value`` with ``fn`` applied to every string in it (dicts and lists walked, new ones built)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: _strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings(v, fn) for v in value]
    return value


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

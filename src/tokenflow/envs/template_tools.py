"""Whether a chat template renders tools: the schemas offered, and an assistant's tool calls.

Many templates ignore both (SmolLM2's renders only roles and contents: ``tools`` vanish and an
assistant turn that only calls a tool renders empty), so a conversation with tools would reach
the model without them, silently. `tool_rendering` finds out by rendering a short probe
conversation with and without them and comparing the texts, once per template; `dropped_tools`
says, for what a request or an episode offers, what the template would drop. Serving refuses
such a request unless told otherwise (``serve.allow_dropped_tools``); environments and training
sessions log it once (`warn_dropped_tools`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

PROBE_TOOL = {"type": "function", "function": {
    "name": "tf_probe_tool", "description": "Add one to an integer.",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer", "description": "The integer."}},
                   "required": ["x"]}}}
_CALL = {"id": "tfprobe01", "type": "function", "function": {"name": "tf_probe_tool", "arguments": {"x": 7}}}
_USER = {"role": "user", "content": "What is 7 plus one?"}
_RESULT = {"role": "tool", "tool_call_id": "tfprobe01", "name": "tf_probe_tool", "content": "8"}


@dataclass(frozen=True)
class ToolRendering:
    """What a template renders of tool use."""

    tools: bool
    """Offered tools change the rendering (their schemas reach the prompt)."""
    calls: bool
    """An assistant's ``tool_calls`` change the rendering of its turn."""


_cache: dict[str, ToolRendering] = {}
_warned: set[tuple[str, str]] = set()


def _render(tokenizer, chat_template, messages, tools, kwargs) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False,
                                             chat_template=chat_template, **kwargs)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: say nothing about it
        return None


def tool_rendering(tokenizer, chat_template: str | None = None, **template_kwargs) -> ToolRendering:
    """Whether ``chat_template`` (default: the tokenizer's) renders offered tools and an
    assistant's tool calls: the probe conversation rendered with and without each must differ.
    A template that cannot render the probe is taken to render them (its own error comes later,
    when a real conversation is rendered). Cached per template text."""
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    key = f"{template}\0{sorted(template_kwargs.items())!r}"
    found = _cache.get(key)
    if found is not None:
        return found
    args = (tokenizer, template)
    with_tools = _render(*args, [_USER], [PROBE_TOOL], template_kwargs)
    without = _render(*args, [_USER], None, template_kwargs)
    called = [_USER, {"role": "assistant", "content": "", "tool_calls": [_CALL]}, _RESULT]
    not_called = [_USER, {"role": "assistant", "content": ""}, _RESULT]
    with_call = _render(*args, called, [PROBE_TOOL], template_kwargs)
    without_call = _render(*args, not_called, [PROBE_TOOL], template_kwargs)
    found = ToolRendering(tools=None in (with_tools, without) or with_tools != without,
                          calls=None in (with_call, without_call) or with_call != without_call)
    _cache[key] = found
    return found


def template_name(tokenizer) -> str:
    """How a message names the tokenizer's chat template: its model folder's."""
    where = getattr(tokenizer, "name_or_path", "") or "this model"
    return f"the chat template of {where}"


def dropped_tools(rendering: ToolRendering, *, tools: bool, calls: bool, name: str) -> str | None:
    """What of the offered ``tools`` and the history's tool ``calls`` the template drops, as one
    sentence that names the template (``name``); None when it renders all of it."""
    lost = ([] if not tools or rendering.tools else ["the tools offered (their schemas)"]) + \
           ([] if not calls or rendering.calls else ["the assistant's tool calls in the history"])
    if not lost:
        return None
    return f"{name} renders neither {' nor '.join(lost)}" if len(lost) == 2 else \
        f"{name} does not render {lost[0]}"


def warn_dropped_tools(tokenizer, where: str, *, tools: bool = True, calls: bool = True) -> bool:
    """Log once per ``where`` (an environment, a session server) and template that the tokenizer's
    template drops tool use; whether it does."""
    name = template_name(tokenizer)
    reason = dropped_tools(tool_rendering(tokenizer), tools=tools, calls=calls, name=name)
    if reason is None:
        return False
    if (where, name) not in _warned:
        _warned.add((where, name))
        log.warning("%s: %s, so the model never sees them. Use a model whose chat template renders tools "
                    "(tokenflow writes one for smollm2-135m-instruct)", where, reason)
    return True

"""Tools as the JSON schemas chat templates render (``apply_chat_template(tools=...)``).

A tool is a plain Python function with type hints and a Google-style docstring (a summary line,
then ``Args:`` describing every parameter); transformers' ``get_json_schema`` reads both.
"""

from __future__ import annotations

from typing import Callable, Sequence


class ToolSchemaError(ValueError):
    """A tool function whose schema cannot be built; the message names it and says what to add."""


def tool_schema(fn: Callable) -> dict:
    """The ``{"type": "function", "function": {...}}`` schema of one tool function."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    name = getattr(fn, "__qualname__", repr(fn))
    try:
        return get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as e:
        raise ToolSchemaError(
            f"tool {name}: {str(e).rstrip('.!')}; a tool needs a type hint on every parameter and a "
            "docstring with a summary line and an 'Args:' section describing each parameter") from None


def tool_schemas(tools: Sequence[Callable]) -> list[dict]:
    """Schemas of several tools; two tools with one name are refused."""
    schemas = [tool_schema(fn) for fn in tools]
    names = [s["function"]["name"] for s in schemas]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ToolSchemaError(f"tool name(s) {', '.join(twice)} given more than once; tool names must be unique")
    return schemas

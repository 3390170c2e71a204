"""A calculator agent written against the OpenAI API, and nothing else.

tokenflow trains it unchanged (examples/agent_sessions.toml): the run calls ``solve`` once per
sample with the base URL of a training session, records every call it makes (token ids,
behaviour log-probs, policy versions) and scores the conversation with the task's rubric. The
same function runs against any OpenAI-compatible server, e.g. ``tokenflow serve``.

The shipped tool model writes calls as ``mul(47,83)`` on a line of its own, which is not
OpenAI's JSON format: ``tool_format = "plain"`` (a tokenflow extension, sent in ``extra_body``)
asks the server to read that format. A model that writes Hermes-style calls needs no extension.
"""

from __future__ import annotations

import json

from openai import DefaultHttpxClient, OpenAI

HTTP = DefaultHttpxClient()
"""One connection pool for every call of this process. ``OpenAI()`` alone builds a new HTTP
client, and its TLS context, each time: about 20 ms on a small CPU, more than a call here."""


def _tool(name: str, description: str) -> dict:
    params = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS = [_tool("add", "Add two integers."), _tool("mul", "Multiply two integers.")]
FUNCTIONS = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b}


def run_tool(name: str, arguments: str) -> str:
    """A tool's result as text, or the error the model gets to read instead."""
    try:
        args = json.loads(arguments)
        return str(FUNCTIONS[name](int(args["a"]), int(args["b"])))
    except (KeyError, TypeError, ValueError) as e:
        return f"error: {type(e).__name__}: {e}"


def solve(base_url: str, example: dict, max_turns: int = 4) -> str:
    """Answer ``example["prompt"]`` (like ``"47*83+29"``), calling the tools the model asks
    for; returns the model's final answer."""
    client = OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=60.0, http_client=HTTP)
    messages: list[dict] = [{"role": "user", "content": example["prompt"]}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=32,
            extra_body={"tool_format": "plain"}).choices[0].message
        # Send the reply back as it came: the next call then extends this one token for token.
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        messages += tool_results(reply)
    return ""


def tool_results(reply) -> list[dict]:
    """The tool messages answering each call of a chat reply, in order."""
    return [{"role": "tool", "tool_call_id": call.id, "name": call.function.name,
             "content": run_tool(call.function.name, call.function.arguments)} for call in reply.tool_calls]

"""A verifiers harness that plays a plain chat in-process: no program to install, no sandbox.

verifiers 0.4.0 runs a harness as a program in a runtime (its `bash` and `null` harnesses are
uv scripts); a harness may instead run its loop in-process, as long as every model call goes
to the interception endpoint it is given. This one sends the task's prompt, then each of the
task's ``followups`` as a new user message after the model's reply: one model turn per user
message. The example tasksets beside it export it, so it is their default harness.
"""

from __future__ import annotations

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.types import content_text
from verifiers.v1.runtimes import ProgramResult


class ChatData(vf.TaskData):
    answers: list[str] = []
    """The expected word of each model turn (checked case-insensitively)."""
    followups: list[str] = []
    """User messages sent after each reply, in order: one more model turn each."""


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            for followup in [*getattr(data, "followups", []), None]:
                reply = await client.chat.completions.create(model=ctx.model, messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
                if followup is None:
                    break
                messages.append({"role": "user", "content": followup})
        finally:
            await client.close()
        return ProgramResult(0, "", "")


def replies(trace) -> list[str]:
    """The text of each assistant turn of a finished trace."""
    if not trace.branches:
        return []
    return [content_text(m.content) for m in trace.branches[-1].messages if m.role == "assistant"]


def says(text: str, word: str) -> bool:
    return word.lower() in text.lower()

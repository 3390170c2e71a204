"""`ChatBridge`: a multi-turn conversation as token ids, through the model's own chat template.

The engine never re-tokenizes what the model wrote. A rollout's ids grow turn by turn::

    prompt_ids(opening messages)                 the template's rendering, generation prompt included
    + ids the model sampled                      its turn, ending with a turn-end token (below)
    + environment_ids(observations)              what the template renders between that token and
    + ids the model sampled                      the model's next turn, generation prompt included
    + ...

**The turn end.** ``turn_end_ids`` are the token ids that close an assistant turn in this
template (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Mistral's ``</s>``). They are found by
rendering: an assistant turn is rendered with two different contents (and, when the bridge has
tools, two different tool calls), and the first special token of what the renderings share after
the content is the turn end. The engine stops on them (pass them as stop token ids), so the
model's turn *ends with* one. Whatever the template writes after it (ChatML's ``"\\n"``) is not
sampled by the model, so it is the start of the next `environment_ids`.

**Environment ids** are a difference of renderings: a fixed short conversation ending with the
assistant turn, rendered without and with the new messages (the latter with the generation
prompt); the ids after the turn end are the environment's. The rest of the conversation does not
enter, so the cost does not grow with the episode and earlier turns are never re-rendered.

**The prefix rule.** This is exact only for templates that render every conversation as a token
prefix of its continuations. Some do not: Qwen3's drops the ``<think>`` reasoning of assistant
turns once a new user message follows, Mistral v0.3's moves the tool list before the last user
message. `prefix_check` finds out at start-up by rendering a synthetic conversation
incrementally. For such a template the runtime must not treat a whole episode as one sequence:
it starts a new training row at each model turn (prompt = the template's rendering of the
conversation so far), as TRL does.

Everything here works on token ids; text is decoded only to be read (`assistant_message`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tokenflow.envs.schemas import tool_schemas

PROBE_TEXTS = ("7", "42")
"""Contents of the synthetic messages: digits, which any tokenizer can encode."""


class BridgeError(ValueError):
    """A chat template the bridge cannot use, or a conversation it cannot render."""


@dataclass(frozen=True)
class PrefixCheck:
    """Whether a template renders conversations prefix-preservingly; truthy when it does."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


class ChatBridge:
    """Token ids of a conversation in ``tokenizer``'s chat template, with ``tools`` offered."""

    def __init__(self, tokenizer, tools: Sequence[Callable] | None = None, *, schemas: list[dict] | None = None,
                 chat_template: str | None = None, template_kwargs: dict[str, Any] | None = None) -> None:
        """``schemas`` offers tools by their JSON schemas instead (a server rendering a request's
        ``tools``); ``chat_template`` overrides the tokenizer's; ``template_kwargs`` reach the
        template (e.g. ``{"enable_thinking": False}``)."""
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise BridgeError("the tokenizer has no chat template; multi-turn rollouts render conversations "
                              "through it (set tokenizer.chat_template or pass chat_template=)")
        self.tokenizer = tokenizer
        self.tools = list(tools or [])
        self.schemas: list[dict] | None = tool_schemas(self.tools) if self.tools else (list(schemas) if schemas else None)
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.turn_end_ids: tuple[int, ...] = self._find_turn_ends()
        """Token ids that end an assistant turn: the engine's stop tokens for a model turn."""

    # ---- rendering --------------------------------------------------------------------------------
    def render_ids(self, messages: Sequence[dict], *, add_generation_prompt: bool,
                   schemas: list[dict] | None = None) -> list[int]:
        """The template's token ids for ``messages`` (what ``apply_chat_template`` tokenizes).
        ``schemas`` offers those tool schemas instead of the bridge's own (a server rendering
        each request's ``tools``)."""
        try:
            out = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=self.schemas if schemas is None else schemas,
                add_generation_prompt=add_generation_prompt,
                tokenize=True, return_dict=False, chat_template=self.chat_template, **self.template_kwargs)
        except Exception as e:  # noqa: BLE001 - Jinja and tokenizers raise many types
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise BridgeError(f"the chat template cannot render a conversation of roles [{roles}]: "
                              f"{type(e).__name__}: {e}") from e
        # transformers 5 returns a BatchEncoding unless return_dict=False; older ones a list.
        if isinstance(out, Mapping):
            out = out["input_ids"]
        if len(out) and isinstance(out[0], (list, tuple)):
            out = out[0]
        return [int(t) for t in out]

    def prompt_ids(self, messages: Sequence[dict], *, schemas: list[dict] | None = None) -> list[int]:
        """The opening messages with the generation prompt: what the model's first turn follows."""
        return self.render_ids(messages, add_generation_prompt=True, schemas=schemas)

    def environment_ids(self, new_messages: Sequence[dict], *, assistant: dict | None = None) -> list[int]:
        """The ids to append after a finished assistant turn (which ends with a turn-end id): the
        template's rendering of ``new_messages`` and the next generation prompt.

        ``assistant`` is the turn they answer, as parsed (its ``tool_calls`` shape how some
        templates render tool results); by default a stand-in with one tool call per tool message.
        Raises `BridgeError` if appending them changes how the turn itself renders.
        """
        new = [dict(m) for m in new_messages]
        turn = dict(assistant) if assistant is not None else self._stand_in(new)
        base = [_probe_user(), turn]
        before = self.render_ids(base, add_generation_prompt=False)
        after = self.render_ids(base + new, add_generation_prompt=True)
        if after[:len(before)] != before:
            at = _first_difference(before, after)
            raise BridgeError(
                f"appending [{', '.join(str(m.get('role')) for m in new)}] changes how the assistant turn before "
                f"them renders (token {at}: {self._show(before, at)} became {self._show(after, at)}); this "
                "template does not preserve prefixes for these messages")
        end = _last_index(before, self.turn_end_ids)
        if end is None:
            raise BridgeError(f"the template rendered no turn-end token {list(self.turn_end_ids)} after the "
                              "assistant turn; cannot tell where the model's turn ends")
        return after[end + 1:]

    def ends_turn(self, turn_ids: Sequence[int]) -> bool:
        """Whether sampled ids end with a turn-end token (else the model ran out of tokens)."""
        return bool(turn_ids) and int(turn_ids[-1]) in self.turn_end_ids

    def assistant_message(self, turn_ids: Sequence[int]) -> dict:
        """``{"role": "assistant", "content": text}`` of one sampled turn, the turn end left out.
        The text is for reading (tool calls, answers); it is never encoded again."""
        ids = list(turn_ids)
        if ids and ids[-1] in self.turn_end_ids:
            ids = ids[:-1]
        return {"role": "assistant", "content": self.tokenizer.decode(ids, skip_special_tokens=False)}

    # ---- the prefix rule --------------------------------------------------------------------------
    def prefix_check(self, observation_roles: Sequence[str] = ("tool", "user")) -> PrefixCheck:
        """Render a synthetic conversation turn by turn — user, assistant calling a tool (when the
        bridge has tools), tool result, assistant with reasoning, then (if "user" is an observation
        role) another user message and assistant — exactly as a rollout grows, and check that each
        rendering is a token prefix of the next."""
        conv = self._probe_conversation(observation_roles)
        steps: list[tuple[str, list[int]]] = []
        try:
            for k, m in enumerate(conv):
                if m["role"] != "assistant":
                    continue
                steps.append((f"the prompt after message {k} ({conv[k - 1]['role']})",
                              self.render_ids(conv[:k], add_generation_prompt=True)))
                full = self.render_ids(conv[:k + 1], add_generation_prompt=False)
                end = _last_index(full, self.turn_end_ids)
                steps.append((f"assistant message {k + 1}", full[:end + 1] if end is not None else full))
        except BridgeError as e:
            return PrefixCheck(False, str(e))
        for (what_a, a), (what_b, b) in zip(steps, steps[1:]):
            if b[:len(a)] != a:
                at = _first_difference(a, b)
                return PrefixCheck(False, (
                    f"the conversation through {what_a} is not a token prefix of the conversation through "
                    f"{what_b} (token {at}: "
                    f"{self._show(a, at)} became {self._show(b, at)}): the template rewrites earlier turns, so "
                    "each model turn must be trained as its own row"))
        roles = ", ".join(m["role"] for m in conv)
        return PrefixCheck(True, f"each rendering of [{roles}] is a token prefix of the next")

    def preserves_prefixes(self, observation_roles: Sequence[str] = ("tool", "user")) -> bool:
        """`prefix_check` as a bool."""
        return self.prefix_check(observation_roles).ok

    # ---- internals --------------------------------------------------------------------------------
    def _find_turn_ends(self) -> tuple[int, ...]:
        user = _probe_user()
        prompt = self.render_ids([user], add_generation_prompt=True)
        variants = [[{"role": "assistant", "content": t} for t in PROBE_TEXTS]]
        if self.schemas:
            variants.append([self._call_turn(i) for i in range(len(PROBE_TEXTS))])
        special = _special_ids(self.tokenizer)
        found: list[int] = []
        for turns in variants:
            tails = []
            for turn in turns:
                full = self.render_ids([user, turn], add_generation_prompt=False)
                if full[:len(prompt)] != prompt:
                    at = _first_difference(prompt, full)
                    raise BridgeError(
                        f"the generation prompt is not a prefix of the rendered assistant turn (token {at}: "
                        f"{self._show(prompt, at)} became {self._show(full, at)}); the model's turn cannot "
                        "continue the prompt ids")
                tails.append(full[len(prompt):])
            if tails[0] == tails[1]:
                continue  # the template ignores what differs (e.g. a tool without parameters)
            common = _common_suffix(tails)
            if any(t in found for t in common):
                continue  # a tool-calling turn ends like a plain one
            end = next((t for t in common if t in special), None)
            if end is None:
                if turns[0].get("tool_calls"):
                    continue
                raise BridgeError(
                    "no special token follows the content of an assistant turn in this template (it ends with "
                    f"{self._show(common, 0)}); the engine needs a turn-end token to stop on")
            found.append(end)
        if not found:
            raise BridgeError("could not find the token that ends an assistant turn in this template")
        return tuple(found)

    def _probe_args(self, schema: dict, variant: int) -> dict:
        values = {"integer": (7, 42), "number": (7, 42), "string": PROBE_TEXTS, "boolean": (True, False)}
        props = schema["function"].get("parameters", {}).get("properties", {})
        return {k: values.get(p.get("type"), (None, None))[variant] for k, p in props.items()}

    def _call_turn(self, variant: int, tool: int = 0, call_id: str = "call00000") -> dict:
        schema = self.schemas[tool]
        call = {"id": call_id, "type": "function",
                "function": {"name": schema["function"]["name"], "arguments": self._probe_args(schema, variant)}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    def _stand_in(self, new: list[dict]) -> dict:
        """An assistant turn that the tool messages in ``new`` answer."""
        results = [m for m in new if m.get("role") == "tool"]
        if not results or not self.schemas:
            return {"role": "assistant", "content": PROBE_TEXTS[0]}
        names = [s["function"]["name"] for s in self.schemas]
        calls = []
        for i, m in enumerate(results):
            tool = names.index(m["name"]) if m.get("name") in names else 0
            call = self._call_turn(0, tool, m.get("tool_call_id") or f"call{i:05d}")["tool_calls"][0]
            calls.append(call)
        return {"role": "assistant", "content": "", "tool_calls": calls}

    def _probe_conversation(self, observation_roles: Sequence[str]) -> list[dict]:
        a, b = PROBE_TEXTS
        conv = [_probe_user()]
        if self.schemas and "tool" in observation_roles:
            call = self._call_turn(0)
            conv += [call, {"role": "tool", "tool_call_id": "call00000",
                            "name": call["tool_calls"][0]["function"]["name"], "content": b}]
        conv.append({"role": "assistant", "content": b, "reasoning_content": a})
        if "user" in observation_roles:
            conv += [{"role": "user", "content": b}, {"role": "assistant", "content": a, "reasoning_content": b}]
        return conv

    def _show(self, ids: list[int], at: int) -> str:
        piece = ids[at:at + 6]
        return repr(self.tokenizer.decode(piece, skip_special_tokens=False)) if piece else "the end"


def _probe_user() -> dict:
    return {"role": "user", "content": PROBE_TEXTS[0]}


def _special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def _common_suffix(seqs: list[list[int]]) -> list[int]:
    n = 0
    while all(len(s) > n for s in seqs) and len({s[len(s) - 1 - n] for s in seqs}) == 1:
        n += 1
    return seqs[0][len(seqs[0]) - n:] if n else []


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _last_index(ids: list[int], targets: tuple[int, ...]) -> int | None:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] in targets:
            return i
    return None

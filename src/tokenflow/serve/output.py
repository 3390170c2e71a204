"""One choice as it is built: tokens as they arrive, the text that is safe to release, and the
log-probs in the two shapes OpenAI uses (chat's token entries, completions' parallel lists).

Text is always the decode of every completion token so far (special tokens skipped), cut before
the first stop string. While a sample runs, the last ``longest stop string - 1`` characters and a
trailing incomplete character are held back, so a streamed text is a prefix of the final one
and the pieces of a stream join to exactly the text a non-streamed request returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tokenflow.rollout import Rollout
from tokenflow.serve.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, TokenLogprob, TopLogprob

LOGPROB_FLOOR = -9999.0
"""What a token outside the sampled support (log-prob -inf) is reported as: JSON has no -inf."""


class TokenStrings:
    """Each token id's own text (special tokens included), cached: what log-prob entries name."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        s = self._cache.get(token_id)
        if s is None:
            if self.tokenizer is None:
                s = f"token_id:{token_id}"
            else:
                s = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = s
        return s


class TextAssembler:
    """The released text of one choice (see the module docstring)."""

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.released = ""

    def update(self, ids: list[int], final: bool) -> str:
        """Release what ``ids`` (every completion token so far) make safe; returns the new text."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        elif not final:
            text = text.rstrip("\ufffd")  # an incomplete multi-byte character: wait for the rest
            text = text[:max(len(self.released), len(text) - self.hold)]
        new = text[len(self.released):] if text.startswith(self.released) else ""
        self.released += new
        return new


@dataclass
class ChoiceOutput:
    """One sample of one prompt, as it arrives."""

    index: int
    text: TextAssembler
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    rollout: Rollout | None = None
    text_offset: int = 0
    """Characters of token text reported so far (completions' ``text_offset``)."""

    def add(self, ids: list[int], logprobs: list[float], top) -> tuple[int, str]:
        """Append streamed tokens; returns (index of the first new token, newly released text)."""
        start = len(self.ids)
        self.ids += ids
        self.logprobs += logprobs
        if top:
            self.top += top
        return start, self.text.update(self.ids, final=False)

    def finish(self, rollout: Rollout) -> tuple[int, str]:
        """Take the finished rollout (it holds every token; the ones not streamed are new)."""
        start = len(self.ids)
        self.rollout = rollout
        self.ids = rollout.completion_ids.tolist()
        self.logprobs = rollout.logprobs.tolist()
        self.top = list(rollout.top_logprobs or [])
        return start, self.text.update(self.ids, final=True)

    def drop_generated(self) -> None:
        """Forget the generated tokens (``max_tokens`` 0: the engine ran one to score the prompt)."""
        self.ids, self.logprobs, self.top = [], [], []
        self.text.released = ""

    @property
    def finish_reason(self) -> str:
        reason = self.rollout.finish_reason if self.rollout is not None else "length"
        return reason if reason in ("stop", "length") else "length"


def _value(lp: float) -> float:
    return float(lp) if math.isfinite(lp) else LOGPROB_FLOOR


def chat_logprobs(out: ChoiceOutput, start: int, top_n: int, strings: TokenStrings) -> list[TokenLogprob]:
    """Chat's log-prob entries for ``out``'s tokens from ``start`` on."""
    entries = []
    for k in range(start, len(out.ids)):
        token = strings(out.ids[k])
        alternatives = []
        if top_n and k < len(out.top):
            ids, values = out.top[k]
            alternatives = [TopLogprob(token=strings(int(t)), logprob=_value(v), bytes=list(strings(int(t)).encode()))
                            for t, v in zip(ids[:top_n].tolist(), values[:top_n].tolist())]
        entries.append(TokenLogprob(token=token, logprob=_value(out.logprobs[k]), bytes=list(token.encode()),
                                    top_logprobs=alternatives))
    return entries


def completion_logprobs(out: ChoiceOutput, start: int, top_n: int, strings: TokenStrings) -> CompletionLogprobs:
    """Completions' log-prob lists for ``out``'s tokens from ``start`` on (offsets continue
    from the tokens reported before)."""
    tokens, values, tops, offsets = [], [], [], []
    for k in range(start, len(out.ids)):
        token = strings(out.ids[k])
        tokens.append(token)
        values.append(_value(out.logprobs[k]))
        offsets.append(out.text_offset)
        out.text_offset += len(token)
        if top_n:
            top: dict[str, float] = {}
            if k < len(out.top):
                ids, lps = out.top[k]
                for t, v in zip(ids[:top_n].tolist(), lps[:top_n].tolist()):
                    top.setdefault(strings(int(t)), _value(v))
            tops.append(top)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops if top_n else None,
                              text_offset=offsets)


def prompt_logprobs(out: ChoiceOutput, prompt: list[int], top_n: int, strings: TokenStrings) -> CompletionLogprobs:
    """Completions' log-prob lists for the prompt's tokens (``echo``), from ``out``'s rollout
    (`Rollout.prompt_logprobs`): the first token has none (null); offsets start at 0."""
    r = out.rollout
    tokens, values, tops, offsets = [], [], [], []
    for k, t in enumerate(prompt):
        token = strings(t)
        tokens.append(token)
        offsets.append(out.text_offset)
        out.text_offset += len(token)
        first = k == 0 or r.prompt_logprobs is None
        values.append(None if first else _value(float(r.prompt_logprobs[k])))
        if top_n:
            top: dict[str, float] | None = None
            if not first and r.prompt_top_ids is not None:
                top = {}
                for i, v in zip(r.prompt_top_ids[k, :top_n].tolist(), r.prompt_top_logprobs[k, :top_n].tolist()):
                    top.setdefault(strings(int(i)), _value(v))
            tops.append(top)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops if top_n else None,
                              text_offset=offsets)


def joined(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    """The prompt's lists followed by the completion's."""
    tops = None if a.top_logprobs is None else a.top_logprobs + (b.top_logprobs or [])
    return CompletionLogprobs(tokens=a.tokens + b.tokens, token_logprobs=a.token_logprobs + b.token_logprobs,
                              top_logprobs=tops, text_offset=a.text_offset + b.text_offset)


def completion_choice(c: ChoiceOutput, prompt: list[int], body: CompletionRequest, top_n: int,
                      strings: TokenStrings, echo: str | None) -> CompletionChoice:
    """A whole (non-streamed) completion choice; ``echo``: the prompt's text, returned first
    (with its log-probs when asked). ``max_tokens`` 0 drops the token the engine generated."""
    if body.max_tokens == 0:
        c.drop_generated()
    logprobs = None
    if body.logprobs is not None:
        head = prompt_logprobs(c, prompt, top_n, strings) if echo is not None else None
        logprobs = completion_logprobs(c, 0, top_n, strings)
        logprobs = joined(head, logprobs) if head is not None else logprobs
    return CompletionChoice(
        index=c.index, text=(echo or "") + c.text.released, logprobs=logprobs,
        finish_reason="length" if body.max_tokens == 0 else c.finish_reason,
        prompt_token_ids=prompt if body.return_token_ids else None,
        token_ids=c.ids if body.return_token_ids else None)

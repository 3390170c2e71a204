"""`SamplingParams`: how one request is sampled, and its validation."""

from __future__ import annotations

from dataclasses import dataclass

from tokenflow.engine.errors import InvalidRequest


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    The engine samples from ``softmax(logits / temperature)`` restricted to the tokens kept by
    top-k and then top-p (computed on the top-k-renormalised distribution), renormalised.
    ``temperature == 0`` is greedy decoding (argmax; top-k/top-p are ignored).
    """

    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    max_tokens: int = 128
    """Most completion tokens. A resumed or continued request counts the tokens it resumes
    (earlier turns and environment tokens included): pass len(prefix) + this turn's budget."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the completion (kept in it, finish reason "stop"), besides EOS."""
    stop: tuple[str, ...] = ()
    """Strings that end the completion once its decoded text contains one; needs a tokenizer."""
    n: int = 1
    """Samples of this prompt; they share one prefill."""
    seed: int | None = None
    """Makes the request reproducible (whatever else runs in the batch); None = derived from the
    engine seed and the request's arrival number."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS token(s)."""
    park_kv: bool = False
    """Built-in engine: when a sample finishes (stop or length), keep its KV cache ("park" it,
    up to ``engine.max_parked`` sequences, least recently parked evicted first) so that a
    continuation of it (`Rollout.append_environment` + ``add_request(..., resume=)``) prefills
    only its new tokens. Other backends ignore it."""
    logprobs: int = 0
    """Also return, per completion token, the ``logprobs`` most likely tokens and their
    log-probs under the distribution the token was drawn from (`Rollout.top_logprobs`);
    0 = off (nothing extra is computed)."""
    prompt_logprobs: int | None = None
    """Also return, per prompt token, its log-prob under the model given the tokens before it
    (``log_softmax(logits)``, temperature and truncation not applied) and, when > 0, the
    ``prompt_logprobs`` most likely tokens at that position (`Rollout.prompt_logprobs`); from the
    request's own prefill. None = off. The first prompt token has none (NaN)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether top-k/top-p may cut the vocabulary (never for greedy decoding)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)

    def validate(self, vocab_size: int, *, has_tokenizer: bool = True) -> None:
        """Raise `InvalidRequest` naming the first bad field and its accepted range."""
        if not self.temperature >= 0:  # also catches NaN
            raise InvalidRequest(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise InvalidRequest(f"n must be >= 1, got {self.n}")
        if not 0 <= self.logprobs <= vocab_size:
            raise InvalidRequest(f"logprobs must be in [0, {vocab_size}] (the vocabulary; 0 = off), "
                                 f"got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= vocab_size:
            raise InvalidRequest(f"prompt_logprobs must be None or in [0, {vocab_size}] (the vocabulary), "
                                 f"got {self.prompt_logprobs}")
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequest(
                f"stop_token_ids must be in [0, {vocab_size}) (the vocabulary), got {bad}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest(f"stop must hold non-empty strings, got {self.stop!r}")
        if self.stop and not has_tokenizer:
            raise InvalidRequest("stop strings need a tokenizer; pass tokenizer= to the Engine")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidRequest(f"seed must be an int or None, got {self.seed!r}")

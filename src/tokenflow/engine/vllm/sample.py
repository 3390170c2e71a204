"""One sample as the vLLM backend runs it, and the checkpoint facts a weight update is checked
against."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.loading.weights import IGNORED_SUFFIXES
from tokenflow.rollout import Rollout


@dataclass(eq=False)
class Sample:
    """One sample of one request, as vLLM runs it (a resumed sample continues a partial, or a
    multi-turn rollout after its environment tokens)."""

    request_id: str
    sample_index: int
    group_id: int
    prompt_id: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    prefix: Rollout | None = None
    turn: int | None = None
    """`Rollout.turns` value of the tokens generated here (None: no turns recorded)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    """Per token, its ``params.logprobs`` most likely alternatives (empty when not asked for)."""
    reported: int = 0
    """Tokens already handed out by ``new_tokens``."""
    vllm_id: str = ""
    internal_id: str | None = None
    """vLLM's own id for the request (the one it keys its per-request state by)."""
    routing: np.ndarray | None = None
    """This request's routing record (tokenflow's layout), once vLLM has returned it."""
    prompt_scores: dict | None = None
    """``params.prompt_logprobs`` asked: the `Rollout`'s prompt log-prob fields, once vLLM has
    returned them (with the request's first output)."""

    def take_prompt_scores(self, entries) -> None:
        """Keep vLLM's prompt log-probs (one entry per prompt token, None for the first; a
        continuation's prompt includes its prefix, which is cut off) as `Rollout` fields."""
        k = self.params.prompt_logprobs
        if k is None or self.prompt_scores is not None or not entries:
            return
        n = len(self.prompt_ids)
        lps = np.full(n, np.nan, dtype=np.float32)
        ids, values = np.full((n, k), -1, dtype=np.int32), np.full((n, k), np.nan, dtype=np.float32)
        for i in range(1, n):
            entry = entries[i]
            lps[i] = entry[self.prompt_ids[i]].logprob
            if k:
                best_ids, best = top_alternatives(entry, k)
                ids[i, :len(best_ids)], values[i, :len(best)] = best_ids, best
        self.prompt_scores = {"prompt_logprobs": lps}
        if k:
            self.prompt_scores.update(prompt_top_ids=ids, prompt_top_logprobs=values)

    def rollout(self, finish_reason: str, text: str | None, routed_experts: np.ndarray | None = None) -> Rollout:
        """The sample as a `Rollout`, joined onto its resumed prefix; ``routed_experts`` covers
        the whole result (see `tokenflow.engine.vllm.routing.join`)."""
        new = Rollout(prompt_ids=np.asarray(self.prompt_ids, dtype=np.int32),
                      completion_ids=np.asarray(self.tokens, dtype=np.int32),
                      logprobs=np.asarray(self.logprobs, dtype=np.float32),
                      versions=np.asarray(self.versions, dtype=np.int32),
                      finish_reason=finish_reason, temperature=self.params.temperature,
                      support_logmass=np.zeros(len(self.tokens), dtype=np.float32),
                      request_id=self.request_id, sample_index=self.sample_index,
                      group_id=self.group_id, prompt_id=self.prompt_id, info={"seed": self.seed},
                      routed_experts=routed_experts if self.prefix is None else None,
                      turns=None if self.turn is None else np.full(len(self.tokens), self.turn, np.int16),
                      top_logprobs=list(self.top) if self.params.logprobs else None,
                      **(self.prompt_scores or {}))
        out = self.prefix.extend(new, routed_experts) if self.prefix is not None else new
        out.text = text
        return out


def top_alternatives(entry: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` most likely tokens of one vLLM log-prob entry (token id -> Logprob, holding the
    top ``n`` by rank and the sampled token), most likely first."""
    best = sorted(entry.items(), key=lambda kv: kv[1].rank)[:n]
    return (np.asarray([t for t, _ in best], dtype=np.int32),
            np.asarray([lp.logprob for _, lp in best], dtype=np.float32))


def checkpoint_shapes(folder: Path, hf_config) -> tuple[dict, dict]:
    """Names and shapes of the checkpoint's tensors (read from the safetensors headers): what a
    weight update must carry. A tied ``lm_head.weight`` is optional."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors weights")
    shapes = {}
    for f in files:
        with safe_open(str(f), "pt") as fh:
            for name in fh.keys():
                if not name.endswith(IGNORED_SUFFIXES):
                    shapes[name] = tuple(fh.get_slice(name).get_shape())
    optional = {}
    if getattr(hf_config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in shapes:
        optional["lm_head.weight"] = shapes["model.embed_tokens.weight"]
        shapes.pop("lm_head.weight", None)
    return shapes, optional

"""Teacher scoring for on-policy distillation.

A frozen teacher reads each sampled completion in one prefill-only forward pass per group (no
decoding, no KV cache) on its own built-in engine, in its own worker process, and gives every
generated token the reward

    r_t = log p_T(a_t | prefix) − log μ(a_t | prefix)

so that the return of a token is the sampled reverse KL, KL(π ‖ p_T) estimated on the
student's own sample (REFERENCES.md, "Distillation and per-token scores"). Both log-probs are
taken at the sampling temperature T (``log softmax(logits / T)``, full vocabulary).

log π_θ is the **behaviour log-prob** μ recorded by the engine when it sampled the token: at
staleness 0 it is π_θ itself, it costs no extra forward pass, and it makes the reward a fixed
property of the sample (the trainer's off-policy corrections handle the gap to π_θ when stale).

The teacher's tokenizer must equal the student's (same ids for the same text): the teacher
scores the student's token ids as they are, never decoded and re-encoded.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from tokenflow.scoring.token_scorer_protocol import SampleView, TokenScores

log = logging.getLogger(__name__)


class TokenizerMismatch(ValueError):
    pass


def check_same_tokenizer(student: str, teacher: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's, naming the difference."""
    from transformers import AutoTokenizer

    s, t = AutoTokenizer.from_pretrained(student), AutoTokenizer.from_pretrained(teacher)
    sv, tv = s.get_vocab(), t.get_vocab()
    if sv != tv:
        only_s = sorted(set(sv) - set(tv))[:5]
        only_t = sorted(set(tv) - set(sv))[:5]
        moved = sorted(k for k in set(sv) & set(tv) if sv[k] != tv[k])[:5]
        raise TokenizerMismatch(
            f"the teacher {teacher!r} has a different tokenizer from the student {student!r} "
            f"(vocab sizes {len(tv)} vs {len(sv)}; only the student's: {only_s}, only the teacher's: "
            f"{only_t}, different ids: {moved}); distillation scores the student's token ids as they are, "
            "so use a teacher of the same tokenizer family")
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(s, attr) != getattr(t, attr):
            raise TokenizerMismatch(f"the teacher's {attr} ({getattr(t, attr)}) differs from the student's "
                                    f"({getattr(s, attr)}); use a teacher of the same tokenizer family")


def prefill_logprobs(engine, sequences: list[list[int]], starts: list[int],
                     temperatures: list[float]) -> list[np.ndarray]:
    """log softmax(logits/T)[a_t] of tokens ``seq[start:]`` of every sequence, from one batched
    prefill of ``engine``'s model (right-padded; causal attention keeps padding out of the way).

    The one place the teacher touches the engine's internals.
    """
    import torch

    runner = engine.runner
    with torch.inference_mode():
        hidden = runner.hidden_states([list(s) for s in sequences])
        out = []
        for b, (seq, start, temp) in enumerate(zip(sequences, starts, temperatures)):
            logits = runner.model.compute_logits(hidden[b, start - 1:len(seq) - 1]).float()
            if temp > 0:
                logits = logits / temp
            targets = torch.as_tensor(np.asarray(seq[start:], dtype=np.int64), device=logits.device)
            lp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
            out.append(lp.double().cpu().numpy())
    return out


class TeacherScorer:
    """Per-token distillation reward from a frozen teacher on its own engine (see module doc)."""

    name = "teacher"

    def __init__(self, model: str, device: str = "cpu", threads: int | None = 1, **_: object) -> None:
        from tokenflow.config.engine import EngineConfig
        from tokenflow.engine import Engine

        self.engine = Engine(model, EngineConfig(device=device, threads=threads, dtype="float32"))

    def score(self, prompt: str, samples: list[SampleView], example: dict) -> TokenScores:
        return self.score_many([(prompt, samples, example)])[0]

    def score_many(self, jobs: list[tuple[str, list[SampleView], dict]]) -> list[TokenScores]:
        """Several groups in one prefill; each group's share of the time is its share of samples."""
        start = time.perf_counter()
        flat = [s for _, samples, _ in jobs for s in samples]
        live = [i for i, s in enumerate(flat) if len(s.completion_ids)]
        seqs = [np.concatenate([flat[i].prompt_ids, flat[i].completion_ids]).tolist() for i in live]
        teacher = dict(zip(live, prefill_logprobs(self.engine, seqs, [len(flat[i].prompt_ids) for i in live],
                                                  [flat[i].temperature for i in live]) if live else []))
        elapsed = time.perf_counter() - start
        out, offset = [], 0
        for _, samples, _ in jobs:
            rewards = [np.zeros(len(s.completion_ids), dtype=np.float32) for s in samples]
            kl_sum, tokens = 0.0, 0
            for k, s in enumerate(samples):
                lp_teacher = teacher.get(offset + k)
                if lp_teacher is None:
                    continue
                mask = s.loss_mask > 0
                diff = np.where(mask, lp_teacher - s.behaviour.astype(np.float64), 0.0)
                rewards[k] = diff.astype(np.float32)
                kl_sum -= float(diff.sum())
                tokens += int(mask.sum())
            offset += len(samples)
            out.append(TokenScores(rewards, {"reverse_kl": kl_sum / max(tokens, 1),
                                             "time_s": elapsed * len(samples) / max(len(flat), 1)}))
        return out

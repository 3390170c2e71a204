"""Process reward model scoring: a model scores each step; the step's score goes to its tokens.

A completion is cut into steps at the separator token (``scorer.prm.separator``, e.g. "," or
"\\n\\n"); each step ends at its separator, and the last step at the completion's last token. The
PRM reads the prompt plus the whole completion in one forward pass per group and scores each
step at the position of its last token:

* ``token_classification``: the label logits there — sigmoid of the logit with one label,
  softmax probability of label 1 with two;
* ``causal``: the next-token distribution there, p(good) / (p(good) + p(bad)).

Every token of step k then carries reward s_k (REFERENCES.md: "a process reward assigns each
step's score to that step's tokens"). With REINFORCE++ and γ = 0 a token's advantage is its
step's (whitened) score; with γ > 0 later steps' scores flow back; GAE takes them as r_t.
"""

from __future__ import annotations

import time

import numpy as np

from tokenflow.scoring.token_scorer_protocol import SampleView, TokenScores


def step_ends(completion_ids: np.ndarray, separator_id: int) -> list[int]:
    """Index of the last token of each step: every separator, plus the final token."""
    ends = [int(i) for i in np.flatnonzero(completion_ids == separator_id)]
    last = len(completion_ids) - 1
    if last >= 0 and (not ends or ends[-1] != last):
        ends.append(last)
    return ends


def spread_step_scores(n: int, ends: list[int], scores: list[float]) -> np.ndarray:
    """Per-token rewards: tokens ends[k-1]+1 .. ends[k] all get scores[k]."""
    out = np.zeros(n, dtype=np.float32)
    begin = 0
    for end, s in zip(ends, scores):
        out[begin:end + 1] = s
        begin = end + 1
    return out


class ProcessRewardScorer:
    name = "prm"

    def __init__(self, model: str, kind: str = "token_classification", separator: str = ",",
                 good_token: str = "+", bad_token: str = "-", device: str = "cpu",
                 threads: int | None = 1, **_: object) -> None:
        import torch
        from transformers import AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        self.device = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available())
                                   else "cpu")
        self.kind = kind
        tok = AutoTokenizer.from_pretrained(model)
        self.separator_id = self._single_token(tok, separator, "separator")
        if kind == "causal":
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(model)
            self.good_id = self._single_token(tok, good_token, "good_token")
            self.bad_id = self._single_token(tok, bad_token, "bad_token")
        else:
            from transformers import AutoModelForTokenClassification

            self.model = AutoModelForTokenClassification.from_pretrained(model)
            if self.model.config.num_labels not in (1, 2):
                raise ValueError(f"scorer.prm: a token-classification PRM needs 1 or 2 labels, "
                                 f"{model!r} has {self.model.config.num_labels}")
        self.model.to(self.device).eval()

    @staticmethod
    def _single_token(tok, text: str, what: str) -> int:
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"scorer.prm.{what} {text!r} is {len(ids)} tokens for this tokenizer; "
                             "it must be exactly one")
        return ids[0]

    def step_scores(self, samples: list[SampleView]) -> list[list[float]]:
        """Each sample's step scores, from one right-padded forward pass over the group."""
        import torch

        seqs = [np.concatenate([s.prompt_ids, s.completion_ids]) for s in samples]
        longest = max(len(q) for q in seqs)
        ids = torch.zeros(len(seqs), longest, dtype=torch.long)
        attention = torch.zeros(len(seqs), longest, dtype=torch.long)
        for b, q in enumerate(seqs):
            ids[b, :len(q)] = torch.from_numpy(q.astype(np.int64))
            attention[b, :len(q)] = 1
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=attention.to(self.device)).logits.float()
        out = []
        for b, s in enumerate(samples):
            pos = torch.tensor([len(s.prompt_ids) + e for e in step_ends(s.completion_ids, self.separator_id)],
                               dtype=torch.long, device=logits.device)
            at = logits[b, pos]
            if self.kind == "causal":
                pair = torch.log_softmax(at[:, [self.good_id, self.bad_id]], dim=-1)
                score = pair[:, 0].exp()
            elif at.shape[-1] == 1:
                score = torch.sigmoid(at[:, 0])
            else:
                score = torch.softmax(at, dim=-1)[:, 1]
            out.append(score.double().cpu().tolist())
        return out

    def score(self, prompt: str, samples: list[SampleView], example: dict) -> TokenScores:
        start = time.perf_counter()
        live = [i for i, s in enumerate(samples) if len(s.completion_ids)]
        rewards = [np.zeros(len(s.completion_ids), dtype=np.float32) for s in samples]
        steps = 0
        if live:
            for i, scores in zip(live, self.step_scores([samples[i] for i in live])):
                s = samples[i]
                ends = step_ends(s.completion_ids, self.separator_id)
                rewards[i] = spread_step_scores(len(s.completion_ids), ends, scores) * (s.loss_mask > 0)
                steps += len(ends)
        return TokenScores(rewards, {"steps_per_sample": steps / max(len(live), 1),
                                     "time_s": time.perf_counter() - start})

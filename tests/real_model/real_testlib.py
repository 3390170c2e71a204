"""Shared by the real-model tests: chat prompts, float32 bounds, a multi-turn environment."""

from __future__ import annotations

import torch

from tokenflow.envs.calculator import CalculatorEnv

QUESTIONS = [
    "What is 17 + 25?", "Name three primary colors.", "Write a haiku about the sea.",
    "What is the capital of France?", "Explain photosynthesis in one sentence.", "List the days of the week.",
    "How do I boil an egg?", "Translate 'good morning' to Spanish.",
]

U32 = 2.0 ** -24
"""float32's unit roundoff: one rounding moves a value x by at most u·|x|."""


def roundings(hf) -> int:
    """Roundings on the path to one logit: about 23 per decoder layer (norm and its scale; the
    q/k/v, o, gate/up and down projections' outputs; rotary; scores, softmax, P·V; SiLU and the
    product; two residual adds) and 5 around them (embedding, final norm, output head), as in
    tests/engine/test_parity.py. SmolLM2-135M: 23 × 30 + 5 = 695."""
    return 23 * hf.config.num_hidden_layers + 5


def float32_bounds(hf, logits: torch.Tensor) -> tuple[float, float]:
    """(max bound, RMS bound) on the difference of log-probs computed by two float32
    implementations of the same model (the engine, transformers).

    Both compute the same sums in different orders (other matmul blockings: the hidden size 576
    and the MLP's 1536 are split differently; attention over GQA groups vs repeated keys; fused vs
    unfused norms). With m the largest |logit| as the scale of the values rounded, each of the n
    roundings moves a logit by at most u·m (first order, every error pushing the same way): each
    implementation is within n·u·m of the exact logits, the two within 2·n·u·m of each other, and
    a log-softmax moves at most twice its inputs' largest error: 4·n·u·m for the log-probs. As
    independent errors of mean 0 and variance ≤ u²m²/3, the two runs' logits differ by
    √(2n/3)·u·m in root mean square, the log-probs (twice) by 2·√(2n/3)·u·m. For m ≈ 40 this is
    6.7e-3 (max) and 1.0e-4 (RMS); measured: 1.3e-5 and ~1e-6 (tests report them)."""
    n = roundings(hf)
    m = logits.abs().max().item()
    return 4 * n * U32 * m, 2 * (2 * n / 3) ** 0.5 * U32 * m


def chat_ids(tokenizer, text: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


@torch.no_grad()
def hf_logprobs(hf, prompt, completion) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' float32 logits at each completion token's position, and its log-prob."""
    ids = torch.tensor([list(prompt) + list(completion)])
    logits = hf(ids, use_cache=False).logits[0, len(prompt) - 1: len(prompt) - 1 + len(completion)].float()
    lp = torch.log_softmax(logits.double(), -1).gather(1, torch.as_tensor(completion, dtype=torch.long)[:, None])[:, 0]
    return logits, lp


class CalculatorFirstTurnCalls(CalculatorEnv):
    """The calculator environment, its model's first turn read as the call ``mul(a, b)`` whatever
    it wrote: SmolLM2 does not write the plain call format unprompted, and the test is of the ids
    and masks of a multi-turn episode with a tool result in its template, not of the model."""

    max_turns = 3

    def reset(self, example: dict):
        self._parsed = self._stepped = 0
        self._example = example
        messages, tools = super().reset(example)
        # a short first answer (the model rambles on a bare "86*67+31")
        messages[0]["content"] = f"What is {example['a']} times {example['b']}? Answer in one short sentence."
        return messages, tools

    def _with_call(self, message: dict) -> dict:
        call = {"id": "call00000", "type": "function",
                "function": {"name": "mul", "arguments": {"a": self._example["a"], "b": self._example["b"]}}}
        return {"role": "assistant", "content": message.get("content") or "", "tool_calls": [call]}

    def parse(self, assistant_message: dict) -> dict:  # what the episode records
        self._parsed += 1
        return self._with_call(assistant_message) if self._parsed == 1 else super().parse(assistant_message)

    async def step(self, assistant_message: dict):  # what it answers
        self._stepped += 1
        if self._stepped == 1:
            assistant_message = self._with_call(assistant_message)
        return await super().step(assistant_message)

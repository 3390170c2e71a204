"""The ``scorer`` config section: token-shaped scorers that run beside the task's reward.

    [scorer.teacher]            # on-policy distillation
    model = "runs/teacher"
    distill_coef = 1.0

    [scorer.prm]                # process reward model
    model = "runs/prm"
    separator = ","

    [scorer]
    token = "my_rewards.py:per_token"   # a user's @token_scorer function

Each adds per-token rewards (times its coefficient) to every training sample; the task's reward
stays the outcome reward. Conventions: ``docs/scorers.md``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenflow.config.base import ConfigModel


class TeacherConfig(ConfigModel):
    """A frozen teacher scoring the student's samples: r_t = distill_coef·(log p_T(a_t) − log μ(a_t))."""

    model: str
    """Hugging Face model folder of the teacher ("default": the shipped model). Its tokenizer
    must equal the student's."""
    distill_coef: float = Field(default=1.0, gt=0)
    """Weight of the per-token distillation reward against the task's outcome reward."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """Where the teacher's engine runs (in its own worker process)."""
    threads: int | None = Field(default=1, ge=1)
    """torch CPU threads of the teacher worker; None keeps torch's default."""


class PRMConfig(ConfigModel):
    """A process reward model scoring each step of a completion; the step's score goes to every
    token of the step."""

    model: str
    """Hugging Face model folder (causal LM or token classification)."""
    kind: Literal["token_classification", "causal"] = "token_classification"
    """"token_classification": the score is read from the label logits at the step's last
    token (sigmoid with one label, softmax of label 1 with two). "causal": the score is
    p(good) / (p(good) + p(bad)) of the next token after the step's last token."""
    separator: str = ","
    """The text that ends a step (one token); the completion's last token ends the last step."""
    good_token: str = "+"
    """Causal PRMs: the token meaning "this step is right"."""
    bad_token: str = "-"
    """Causal PRMs: the token meaning "this step is wrong"."""
    coef: float = Field(default=1.0, gt=0)
    """Weight of the step scores against the task's outcome reward."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    threads: int | None = Field(default=1, ge=1)


class ScorerConfig(ConfigModel):
    """Token-shaped scorers beside the task's reward (per-sample or per-group outcome)."""

    token: str | None = None
    """A per-token scorer function, ``module:function`` marked with
    ``tokenflow.scoring.token_scorer``: ``fn(prompt, completions, example, completion_ids)``
    returns one reward array per sample."""
    token_coef: float = Field(default=1.0, gt=0)
    """Weight of ``token``'s rewards."""
    teacher: TeacherConfig | None = None
    """On-policy distillation from a frozen teacher (``[scorer.teacher]``)."""
    prm: PRMConfig | None = None
    """A process reward model (``[scorer.prm]``)."""
    sandbox_fallback: bool = False
    """Let a reward's code sandbox (``tokenflow.scoring.sandbox.Sandbox``) run without
    bubblewrap: no private root, the program then sees the host's file tree read-only. Off, a
    machine where bubblewrap cannot run fails the scorer's first ``Sandbox()`` with the reason
    (docs/scorers.md). Sets ``TOKENFLOW_SANDBOX_FALLBACK=1`` for the scorer processes."""

    @property
    def any_token_scorer(self) -> bool:
        return self.token is not None or self.teacher is not None or self.prm is not None

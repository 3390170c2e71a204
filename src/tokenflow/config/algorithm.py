"""The ``algorithm`` config section: advantage estimator, policy loss, corrections, KL, bonuses.

Every choice is one line (``algorithm.advantage = "rloo"``, ``algorithm.clip_high = 0.28``).
Combinations that cannot work are refused when the section is built, with a message naming the
fields to change. Checks that need the trainer section too (GAE needs a value head) live in
:func:`tokenflow.config.trainer.check_compatible`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tokenflow.config.base import ConfigModel
from tokenflow.registry import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES

# Names are open: any registered estimator, loss or aggregation (built in, or added by a plugin;
# see tokenflow.registry). Unknown names are refused with the known ones listed.
AdvantageName = str
PolicyLossName = str
AggregationName = str


class AlgorithmConfig(ConfigModel):
    """What the trainer optimizes. Conventions and formulas: ``docs/algorithms.md``."""

    advantage: AdvantageName = "grpo"
    """Advantage estimator: "grpo" (group mean baseline, divided by the group std when
    scale_std), "dr_grpo" (group mean baseline, never divided by the std), "rloo" (leave-one-out
    mean), "reinforce_pp" (return normalised over the batch), "reinforce_pp_baseline" (group mean
    subtracted first), "gae" (token-level GAE with a value head; needs trainer.value_head), or
    any estimator a plugin registers (docs/plugins.md)."""

    scale_std: bool = True
    """GRPO only: divide the centred reward by the group's sample std (ddof=1) plus eps."""

    eps: float = Field(default=1e-6, gt=0)
    """Added to every std before dividing (GRPO, REINFORCE++ and whitening)."""

    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount per model-generated token (GAE and REINFORCE++ returns)."""

    lam: float = Field(default=0.95, ge=0, le=1)
    """GAE's λ: 0 gives one-step TD advantages, 1 gives Monte-Carlo returns minus V."""

    whiten_advantages: bool = False
    """After the estimator, normalise advantages over all loss tokens of the step (mean 0, std
    1). Usual with GAE; REINFORCE++ does this by definition."""

    policy_loss: PolicyLossName = "ppo"
    """"ppo" (clipped token ratio; the behaviour weight multiplies the loss outside the clip),
    "gspo" (clipped sequence ratio, the geometric mean of the token ratios; the behaviour weight
    is per sequence too) or "cispo" (−sg(clip(r))·A·log π_θ, r the whole importance weight: the
    behaviour weight goes inside the clip). docs/algorithms.md, "Policy losses"."""

    objective: Literal["direct", "decoupled"] = "decoupled"
    """Which ratio is clipped. "decoupled" (AReaL): ρ = π_θ/π_prox, π_prox being the policy before
    the batch's first optimizer step, and each token's loss is multiplied by the detached
    behaviour weight w = π_prox/μ, truncated to min(w, tis_cap). With one optimizer step per
    batch (trainer.mini_batches = trainer.epochs = 1, the default) ρ ≡ 1 where the gradient is
    taken, so the clip never binds and PPO is −min(w, C)·A·log π_θ in gradient; the clip is a
    trust region around the batch's starting policy from its second optimizer step on.
    "direct": ρ = π_θ/μ, clipped against the engine's behaviour log-probs at every step, so
    under staleness the clip also cuts the gradient of tokens whose probability moved while the
    rollout waited (docs/algorithms.md, "Why decoupled is the default"). π_prox costs no pass
    where a forward at its weights is deterministic (the first step's); a stochastic forward
    (dropout, router jitter) and later mini-batches get a no-grad pass in eval mode."""

    behaviour_logprobs: bool = True
    """The engine records per-token behaviour log-probs. Set false for an engine that cannot;
    then μ is replaced by π_prox (an extra forward pass), no off-policy correction applies, and
    both objectives are the same (ρ = π_θ/π_prox, no weight)."""

    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """ε_low: the ratio (CISPO: the importance weight) is clipped below at 1 − clip_low. Under the
    decoupled objective with one optimizer step per batch PPO's and GSPO's ratio is 1, so the
    clip acts only from a batch's second step (trainer.mini_batches, trainer.epochs)."""

    clip_high: float = Field(default=0.2, ge=0)
    """ε_high: the ratio (CISPO: the importance weight) is clipped above at 1 + clip_high (DAPO's
    clip-higher: 0.28)."""

    aggregation: AggregationName = "token_mean"
    """How token losses become one number, with the normaliser over the whole step's batch:
    "token_mean" (Σ over tokens / number of loss tokens), "seq_mean_token_mean" (each sequence's
    token mean, averaged over sequences), "seq_mean_token_sum" (each sequence's token sum,
    averaged over sequences), "dr_grpo_constant" (Σ over tokens / (max_completion_tokens ×
    number of sequences))."""

    max_completion_tokens: int | None = Field(default=None, ge=1)
    """The constant length in Dr. GRPO's normaliser; required by aggregation="dr_grpo_constant"."""

    tis_cap: float | None = Field(default=2.0, ge=0)
    """Truncated importance sampling: cap C on the behaviour weight w = π_prox/μ (decoupled) or
    π_θ/μ (direct), used as min(w, C), detached. The default 2 bounds the weight every token's
    loss is multiplied by (uncapped, w reached 318 in 20-step runs of the default workload at
    staleness 2, and truncation cost no accuracy; docs/algorithms.md, "A bounded behaviour
    weight"). 0 turns TIS off (None does too, from Python; TOML has no null). Ignored without
    behaviour log-probs (w ≡ 1 there)."""

    is_mask_low: float | None = Field(default=None, ge=0)
    """IS masking: drop tokens whose behaviour weight w is below this. None = no lower bound."""

    is_mask_high: float | None = Field(default=None, gt=0)
    """IS masking: drop tokens whose behaviour weight w is above this. None = no upper bound."""

    opsm_delta: float | None = Field(default=None, ge=0)
    """Off-policy sequence masking: drop a sequence whose mean advantage is negative and whose
    mean per-token (log μ − log π_θ) exceeds δ. None turns OPSM off."""

    max_token_age: int | None = Field(default=None, ge=0)
    """Version rejection: tokens more than this many policy versions older than the trainer are
    dropped from the loss (and from its normaliser). None keeps every token."""

    keep_sampling_mask: bool = True
    """Where a token carries its recorded sampling support, set the trainer's logits outside it
    to −∞ before the log-softmax and compare with the truncated behaviour log-prob."""

    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL-to-reference loss term; 0 turns it off (and loads no reference)."""

    kl_in_reward: bool = False
    """Put the KL penalty in the per-token reward instead of the loss, as REINFORCE++ and PPO
    for RLHF do: each generated token gets −kl_coef·(log μ − log π_ref), μ being the engine's
    behaviour log-prob, before the returns (k1 on the sampled token, whatever kl_estimator
    says). Needs a token-level advantage (reinforce_pp, reinforce_pp_baseline, gae)."""

    kl_estimator: Literal["k1", "k3"] = "k3"
    """Per-token KL estimator: k1 = log π − log π_ref; k3 = π_ref/π − log(π_ref/π) − 1."""

    reference_model: str | None = None
    """Path or name of the frozen reference model for the KL term; None uses a frozen copy of
    the trainer's starting weights."""

    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus (subtracted from the loss); 0 turns it off."""

    value_coef: float = Field(default=0.5, ge=0)
    """Weight of the value-head loss 0.5·(V − R)² (GAE only)."""

    value_clip: float | None = Field(default=None, gt=0)
    """PPO value clipping: V is kept within ± this of the value before the step. None = off."""

    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a group is kept iff 0 < #correct < G, G being its scored samples
    and correct a task reward ≥ 0.5 before shaping (the threshold of held-out accuracy,
    ``tokenflow.rollout.CORRECT_REWARD``). An all-correct or all-wrong group is dropped when it is
    scored, and admission refills the step with new prompts, so every batch is full of groups
    that carry signal. Counted per step as ``rollout/dropped_groups``. A graded reward's
    differences among all-wrong (or all-correct) samples are dropped with their group, as DAPO
    defines it."""

    dynamic_sampling_max_batches: int = Field(default=10, ge=1)
    """Guard for dynamic sampling: at most this many × rollout.prompts_per_step groups are
    dropped between two consecutive batches; past that, all-correct and all-wrong groups are kept
    (with a warning) until the next batch is taken, so a solved or hopeless task cannot stall
    the run."""

    overlong_buffer_tokens: int | None = Field(default=None, ge=1)
    """DAPO's soft overlong punishment: the last this-many tokens before sampling.max_tokens
    (L_cache). A training completion longer than max_tokens − L_cache gets a penalty growing
    linearly to −overlong_penalty at max_tokens, added to its reward. Multi-turn rollouts: the
    length is each model turn's (max_tokens bounds a turn; environment tokens never count) and
    the episode gets its worst turn's penalty. None turns it off."""

    overlong_penalty: float = Field(default=1.0, gt=0)
    """The overlong penalty at max_tokens (DAPO uses 1, the size of its ±1 reward)."""

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, v: str) -> str:
        ADVANTAGES.entry(v)
        return v

    @field_validator("policy_loss")
    @classmethod
    def _known_policy_loss(cls, v: str) -> str:
        POLICY_LOSSES.entry(v)
        return v

    @field_validator("aggregation")
    @classmethod
    def _known_aggregation(cls, v: str) -> str:
        AGGREGATIONS.entry(v)
        return v

    @field_validator("tis_cap")
    @classmethod
    def _tis_off(cls, v: float | None) -> float:
        # One spelling of "off" that a TOML file (and so a resumed run's config.toml) can hold.
        return 0.0 if v is None else v

    @model_validator(mode="after")
    def _check(self) -> "AlgorithmConfig":
        # What each chosen component refuses is declared with it (its registry entry's check).
        ADVANTAGES.validate(self.advantage, self)
        POLICY_LOSSES.validate(self.policy_loss, self)
        AGGREGATIONS.validate(self.aggregation, self)
        if self.clip_low > self.clip_high:
            raise ValueError(
                f"algorithm.clip_low ({self.clip_low}) > algorithm.clip_high ({self.clip_high}): "
                "clip-higher needs clip_high ≥ clip_low; raise clip_high or lower clip_low"
            )
        lo, hi = self.is_mask_low, self.is_mask_high
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(
                f"algorithm.is_mask_low ({lo}) must be below algorithm.is_mask_high ({hi})"
            )
        if not self.behaviour_logprobs:
            # Either objective is fine: without μ both clip π_θ/π_prox and no weight applies.
            # TIS is on by default; only a cap the config sets explicitly is refused.
            needs = [n for n in ("tis_cap", "is_mask_low", "is_mask_high", "opsm_delta")
                     if getattr(self, n) is not None and (n != "tis_cap" or (self.tis_cap and n in self.model_fields_set))]
            if needs:
                raise ValueError(
                    f"algorithm.{', algorithm.'.join(needs)} need(s) the engine's behaviour "
                    "log-probs, but algorithm.behaviour_logprobs is false; turn them off or "
                    "record behaviour log-probs"
                )
        if self.kl_in_reward:
            token_level = [n for n in ADVANTAGES.names() if ADVANTAGES.props(n)["token_rewards"]]
            if self.kl_coef <= 0:
                raise ValueError("algorithm.kl_in_reward needs algorithm.kl_coef > 0 (the penalty's weight)")
            if not ADVANTAGES.props(self.advantage)["token_rewards"]:
                raise ValueError(
                    f'algorithm.kl_in_reward puts a penalty on every token, but advantage = "{self.advantage}" '
                    f"uses only the outcome; use one of {', '.join(token_level)} or put the KL in the loss")
            if not self.behaviour_logprobs:
                raise ValueError("algorithm.kl_in_reward needs the engine's behaviour log-probs "
                                 "(algorithm.behaviour_logprobs = true)")
        if self.value_clip is not None and not self.uses_values:
            raise ValueError(
                f'algorithm.value_clip is set but algorithm.advantage = "{self.advantage}" '
                f"trains no value head; use an estimator with values ({', '.join(self.value_estimators())}) "
                "or unset value_clip"
            )
        return self

    @property
    def uses_values(self) -> bool:
        """Whether the estimator needs a value head (its ``needs_values`` property)."""
        return bool(ADVANTAGES.props(self.advantage)["needs_values"])

    @staticmethod
    def value_estimators() -> list[str]:
        """Registered estimators that need a value head (for messages)."""
        return [n for n in ADVANTAGES.names() if ADVANTAGES.props(n)["needs_values"]]

    @property
    def zero_advantage_is_inert(self) -> bool:
        """Whether a sequence whose advantage is 0 on every loss token adds exactly nothing to
        the loss and its gradient: the policy loss declares it vanishes with the advantage
        (its registry property ``zero_at_zero_advantage``), and no other term reads the
        sequence (no KL-to-reference loss, no entropy bonus, no value loss). Aggregation weights
        depend on the sequence itself and the step's counts only, so the trainer may leave such
        a sequence out if it keeps it in the counts."""
        kl_in_loss = self.kl_coef > 0 and not self.kl_in_reward
        return (bool(POLICY_LOSSES.props(self.policy_loss)["zero_at_zero_advantage"])
                and not kl_in_loss and self.entropy_coef == 0 and not self.uses_values)

    @property
    def needs_prox_pass(self) -> bool:
        """Whether the loss reads π_prox (the decoupled objective, or no behaviour log-probs).
        The trainer reads it off the first optimizer step's forward when it can
        (``Trainer.prox_from_forward``) and runs a no-grad pass before the batch's updates for
        the rest."""
        return self.objective == "decoupled" or not self.behaviour_logprobs

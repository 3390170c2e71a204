"""The whole training config: one typed tree, one TOML file, dotted overrides.

    [rollout]
    prompts_per_step = 16
    max_staleness = 1        # 0 = synchronous

Sections: run, model, task, episode, scorer, rollout, sampling, engine, algorithm, trainer, sync, runtime,
metrics; each is defined in the module of ``tokenflow.config`` named after its key (or its group's:
``config/run.py`` holds run, model and metrics; ``config/task.py`` task and episode;
``config/rollout.py`` rollout and sampling).
``tokenflow train --help-config`` lists every key with its default and documentation.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.config.base import ConfigModel
from tokenflow.config.engine import EngineConfig
from tokenflow.config.rollout import RolloutConfig, SamplingConfig
from tokenflow.config.run import MetricsConfig, ModelConfig, RunConfig
from tokenflow.config.runtime import RuntimeConfig
from tokenflow.config.scorer import ScorerConfig
from tokenflow.config.sync import SyncConfig, sync_every_error
from tokenflow.config.task import EpisodeConfig, TaskConfig
from tokenflow.config.trainer import TrainerConfig, check_compatible


class TrainConfig(ConfigModel):
    run: RunConfig = Field(default_factory=RunConfig)
    """Run length, seed, evaluation and checkpoint cadence, output folder."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy to train."""
    task: TaskConfig = Field(default_factory=TaskConfig)
    """Prompts and reward."""
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    """Turn and token limits of multi-turn episodes (tasks with an environment)."""
    scorer: ScorerConfig = Field(default_factory=ScorerConfig)
    """Token-shaped scorers beside the task's reward: a teacher (distillation), a PRM, a function."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Batch shape and the staleness budget."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """How training rollouts are sampled."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """The rollout engine."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantages, policy loss, off-policy corrections."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Optimizer and batching of the learner."""
    sync: SyncConfig = Field(default_factory=SyncConfig)
    """Weight transport from trainer to engine."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """Where the parts run."""
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    """Metric sinks, traces, progress display."""

    @model_validator(mode="before")
    @classmethod
    def _derive_total_steps(cls, data):
        """A cosine schedule decays over the run: trainer.total_steps defaults to run.steps."""
        if isinstance(data, dict):
            trainer = data.get("trainer")
            if isinstance(trainer, dict) and trainer.get("schedule") == "cosine" and "total_steps" not in trainer:
                run = data.get("run") if isinstance(data.get("run"), dict) else {}
                data = {**data, "trainer": {**trainer, "total_steps": run.get("steps", RunConfig().steps)}}
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> "TrainConfig":
        check_compatible(self.trainer, self.algorithm)
        want = self.rollout.rollouts_per_step
        if "rollouts_per_step" in self.trainer.model_fields_set and self.trainer.rollouts_per_step != want:
            raise ValueError(
                f"trainer.rollouts_per_step ({self.trainer.rollouts_per_step}) must equal "
                f"rollout.prompts_per_step × rollout.group_size ({want}); set only the rollout section")
        # Derived, not duplicated: the trainer's batch is the rollout section's step.
        object.__setattr__(self.trainer, "rollouts_per_step", want)
        if self.trainer.mini_batches > want:
            raise ValueError(
                f"trainer.mini_batches ({self.trainer.mini_batches}) exceeds the rollouts of one batch "
                f"(rollout.prompts_per_step × rollout.group_size = {want}): a mini-batch needs at least one "
                "rollout; lower trainer.mini_batches or raise rollout.prompts_per_step")
        if self.engine.max_num_seqs < self.rollout.group_size:
            # A group's samples are admitted together; found here rather than as the engine
            # worker's crash on the first prompt.
            raise ValueError(
                f"engine.max_num_seqs ({self.engine.max_num_seqs}) is below rollout.group_size "
                f"({self.rollout.group_size}): the engine runs a group's samples together; raise "
                "engine.max_num_seqs or lower rollout.group_size")
        if problem := sync_every_error(self.sync.every, self.rollout.max_staleness):
            raise ValueError(problem)
        from tokenflow.engine.backends import check_run_settings

        check_run_settings(self)  # what the engine's backend lacks, from its declared capabilities
        if self.scorer.any_token_scorer:
            from tokenflow.registry import ADVANTAGES, token_level_estimators

            if not ADVANTAGES.props(self.algorithm.advantage)["token_rewards"]:
                raise ValueError(
                    f'the scorer section adds per-token rewards, but algorithm.advantage = '
                    f'"{self.algorithm.advantage}" uses only the outcome; use one of {", ".join(token_level_estimators())}')
        alg = self.algorithm
        if alg.overlong_buffer_tokens is not None and alg.overlong_buffer_tokens > self.sampling.max_tokens:
            raise ValueError(
                f"algorithm.overlong_buffer_tokens ({alg.overlong_buffer_tokens}) exceeds sampling.max_tokens "
                f"({self.sampling.max_tokens}): the penalty zone must lie within the completion length")
        if alg.dynamic_sampling and self.scorer.any_token_scorer:
            raise ValueError(
                "algorithm.dynamic_sampling drops groups whose samples are all correct or all wrong, but the "
                "scorer section adds per-token rewards, which give such groups a signal of their own; turn one off")
        if self.algorithm.aggregation == "dr_grpo_constant" and self.algorithm.max_completion_tokens is None:
            object.__setattr__(self.algorithm, "max_completion_tokens", self.sampling.max_tokens)
        return self

    @property
    def synchronous(self) -> bool:
        return self.rollout.max_staleness == 0

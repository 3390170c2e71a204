"""The ``[run]``, ``[model]`` and ``[metrics]`` sections: how long the run is and where it writes,
the policy it trains, and what it records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenflow.config.base import ConfigModel


class RunConfig(ConfigModel):
    name: str | None = None
    """Run name; the run folder is ``runs/<name>/`` unless ``output_dir`` is set. Default: a timestamp."""
    output_dir: str | None = None
    """Run folder (resolved config, metrics.jsonl, checkpoints, summary.json)."""
    seed: int = 0
    """Seeds prompts order, sampling and model initialisation of value heads."""
    steps: int = Field(default=50, ge=1)
    """Optimizer steps to train (one step = one policy version)."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate held-out greedy accuracy every N steps (0: only before and after training)."""
    eval_limit: int | None = Field(default=None, ge=1)
    """Evaluate on at most this many held-out prompts (None: the whole split)."""
    baseline_eval: bool = True
    """Evaluate the starting model (step 0) while the first batches generate. False: skip it
    (``baseline_accuracy`` is null), e.g. where the starting model was scored already: the
    evaluation shares the engines with the first batch and delays step 1 (the TRL benchmark
    scores every model, the starting one included, with `tokenflow eval`)."""
    checkpoint_every: int = Field(default=10, ge=0)
    """Write a checkpoint every N steps (0: only at the end, unless ``final_checkpoint`` is false)."""
    final_checkpoint: bool = True
    """Write a checkpoint when the run ends. False (smoke runs, quick experiments): the run ends
    without one, so its folder is not finished for ``--resume``, which continues from the last
    periodic checkpoint (``checkpoint_every``) and trains the steps after it again, or starts
    over from step 0 when there is none."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """How many of the most recent checkpoints to keep."""
    checkpoint_background: bool = True
    """Write checkpoints without stopping training: the trainer copies its state to CPU memory
    (its only pause, ``time/checkpoint_stall_s``) and writes the files in a background thread,
    and the orchestrator closes the checkpoint (manifest, rename) in one of its own. False: the
    trainer and the orchestrator write everything before the next step."""
    samples_per_step: int = Field(default=2, ge=0)
    """Decoded samples of each training step written to ``samples.jsonl`` (prompt and completion
    text, reward and its components, policy versions, token age), beside every held-out sample
    of each evaluation; ``tokenflow samples RUN`` prints them. 0: held-out samples only."""
    save_rollouts: bool = False
    """Write every consumed rollout (tokens, behaviour log-probs, versions, reward) to rollouts.jsonl."""


class ModelConfig(ConfigModel):
    path: str = "default"
    """Hugging Face-format model folder; "default" is the tiny arithmetic model shipped with tokenflow,
    "default-moe" the same model upcycled into a 4-expert Mixtral (`tokenflow.shipped_models.make_moe_model`),
    "default-tool" the tiny tool-calling model of the calculator environment
    (`tokenflow.shipped_models.make_tool_model`, examples/tool_use.toml); "smollm2-135m-instruct" a real
    instruct model (135M parameters, ChatML), built into the cache on first use
    (docs/howto/real-model.md)."""
    trust_remote_code: bool = False
    """Allow model code from the checkpoint folder (off: only architectures transformers knows)."""


class MetricsConfig(ConfigModel):
    sinks: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Where metrics go; JSONL is always written."""
    wandb_project: str = "tokenflow"
    """W&B project (sink "wandb")."""
    wandb_mode: Literal["online", "offline", "disabled"] = "offline"
    """W&B mode; offline writes files without a network."""
    trace: bool = False
    """Write a timeline trace (Chrome trace-event JSON, opens in Perfetto) to the run folder."""
    progress: bool = True
    """Show the live progress view in the terminal."""
    no_signal_warn_steps: int = Field(default=5, ge=0)
    """Warn when the run cannot learn: after this many consecutive steps in which every group's
    rewards were equal, or the policy's entropy collapsed (and at once when every sample of a step
    failed scoring). 0 turns the warnings off."""

"""Config sections owned by the runtime: run, model, task, rollout, sampling, sync, runtime, metrics.

The engine, algorithm and trainer sections live beside their code
(``tokenflow.engine.config``, ``tokenflow.algorithms.config``, ``tokenflow.trainer.config``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

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
    checkpoint_every: int = Field(default=10, ge=0)
    """Write a checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """How many of the most recent checkpoints to keep."""
    checkpoint_background: bool = True
    """Write checkpoints without stopping training: the trainer copies its state to CPU memory
    (its only pause, ``time/checkpoint_stall_s``) and writes the files in a background thread,
    and the orchestrator closes the checkpoint (manifest, rename) in one of its own. False: the
    trainer and the orchestrator write everything before the next step."""
    save_rollouts: bool = False
    """Write every consumed rollout (tokens, behaviour log-probs, versions, reward) to rollouts.jsonl."""


class ModelConfig(ConfigModel):
    path: str = "default"
    """Hugging Face-format model folder; "default" is the tiny arithmetic model shipped with tokenflow,
    "default-moe" the same model upcycled into a 4-expert Mixtral (`tokenflow.tools.make_moe_model`),
    "default-tool" the tiny tool-calling model of the calculator environment
    (`tokenflow.tools.make_tool_model`, examples/tool_use.toml); "smollm2-135m-instruct" a real
    instruct model (135M parameters, ChatML), built into the cache on first use
    (docs/howto/real-model.md)."""
    trust_remote_code: bool = False
    """Allow model code from the checkpoint folder (off: only architectures transformers knows)."""


class EpisodeConfig(ConfigModel):
    """Limits of multi-turn episodes (tasks with ``task.env``; docs/environments.md)."""

    max_turns: int | None = Field(default=None, ge=1)
    """Model turns per episode; default: the environment's own ``max_turns``."""
    max_total_tokens: int = Field(default=512, ge=1)
    """Completion tokens per episode, generated and environment tokens together
    (``sampling.max_tokens`` bounds each model turn)."""
    step_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one environment ``reset`` or ``step``; past it the sample fails and the run
    goes on."""
    agent_timeout_s: float = Field(default=120.0, gt=0)
    """Agent tasks (``task.agent``): deadline of one agent call, from start to return; past it
    the sample fails, its session closes and the run goes on."""


class TaskConfig(ConfigModel):
    name: str = "arithmetic"
    """"arithmetic" (built in), "dataset" (prompts from a local JSONL/Parquet file + your reward),
    "env" (multi-turn episodes of ``env``, examples drawn from the environment class), or a task a
    plugin registers (docs/plugins.md)."""
    seed: int = 0
    """Seed of the task's prompt stream (arithmetic) or epoch shuffles (dataset)."""
    num_eval: int = Field(default=256, ge=1)
    """Held-out prompts (arithmetic)."""
    train_path: str | None = None
    """Training prompts: a local .jsonl/.json/.parquet file (dataset task)."""
    eval_path: str | None = None
    """Held-out prompts file (dataset task); default: hold out ``eval_fraction`` of train_path."""
    eval_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Share of train_path held out for evaluation when eval_path is not given."""
    prompt_field: str = "prompt"
    """Column holding the prompt text."""
    reward: str | None = None
    """Reward function as "module:function", "path/to/file.py:function", or the name of a
    registered scorer (docs/plugins.md). Not with ``env`` (an environment's rubric scores)."""
    env: str | None = None
    """Environment class for multi-turn episodes and tool use, as "module:Class" or
    "path/to/file.py:Class" (docs/environments.md). Needs name = "env" (examples from the class)
    or name = "dataset" (examples are the rows of train_path)."""
    agent: str | None = None
    """Agent function, "module:function" or "path/to/file.py:function", called once per sample
    with a base URL and the example; it talks to the policy through that OpenAI-compatible URL
    (a training session) and every call is trained on (docs/serve.md, "Training agents"). Needs
    ``env``: its examples and rubric (its reset and step are not used)."""
    chat_template: bool = False
    """Wrap each prompt in the tokenizer's chat template as a user message."""
    system_prompt: str | None = None
    """Optional system message when chat_template is on."""

    options: dict[str, Any] = Field(default_factory=dict)
    """Settings of a plugin task, as a table (``[task.options]``); built-in tasks take none."""

    @field_validator("name")
    @classmethod
    def _known_task(cls, v: str) -> str:
        from tokenflow.registry import TASKS

        TASKS.entry(v)
        return v

    @model_validator(mode="after")
    def _task_accepts_settings(self) -> "TaskConfig":
        from tokenflow.registry import TASKS

        if self.agent and not self.env:
            raise ValueError('task.agent is set without task.env: an agent task takes its examples and its rubric '
                             'from an Environment class (e.g. task.env = "tokenflow.envs.calculator:CalculatorEnv")')
        if self.agent and ":" not in self.agent:
            raise ValueError(f"task.agent = {self.agent!r} must be 'module:function' or 'path/to/file.py:function'")
        if self.env and self.name not in ("env", "dataset"):
            raise ValueError(f'task.env is set but task.name = "{self.name}"; use task.name = "env" (examples '
                             'from the environment class) or "dataset" (examples from task.train_path)')
        TASKS.validate(self.name, self)  # what the chosen task needs is declared with it
        return self


class RolloutConfig(ConfigModel):
    prompts_per_step: int = Field(default=16, ge=1)
    """Prompts (groups) consumed by one optimizer step."""
    group_size: int = Field(default=8, ge=1)
    """Samples per prompt (the GRPO group, the engine's n)."""
    max_staleness: int = Field(default=1, ge=0)
    """Admission bound K: at most (K+1) × rollouts per step admitted and not yet consumed. 0 = synchronous."""
    batch_order: Literal["admission", "ready"] = "ready"
    """Which groups make a step's batch. "admission": the prompts_per_step oldest admitted
    groups, waiting for all of them, so no token is older than max_staleness. "ready": the
    oldest prompts_per_step groups already scored; a slow group is overtaken by younger ones
    and can be trained older than max_staleness."""

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


class SamplingConfig(ConfigModel):
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature for training rollouts (evaluation is always greedy)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1 = off)."""
    top_k: int = Field(default=0, ge=0)
    """Keep the k most likely tokens (0 = off)."""
    max_tokens: int = Field(default=96, ge=1)
    """Maximum completion length in tokens."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings (the end-of-sequence token always stops)."""


class SyncConfig(ConfigModel):
    transport: Literal["shared_memory", "broadcast"] = "shared_memory"
    """How weights reach the engine: shared memory (one machine) or a packed torch.distributed broadcast."""
    every: int = Field(default=1, ge=1)
    """Push weights to the engine every N optimizer steps."""
    bucket_mb: float = Field(default=32.0, gt=0)
    """Bucket size for the packed broadcast, in MiB."""
    streams: int = Field(default=2, ge=1)
    """Gloo (CPU) broadcast: TCP connections per peer; each bucket is striped across them, since
    one connection does not fill the wire. NCCL (GPU) ignores it."""
    checksum: bool = False
    """Verify each update with a checksum of the loaded weights."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Longest wait for any sync collective before the run fails naming the peer."""


class RuntimeConfig(ConfigModel):
    backend: Literal["local", "ray"] = "local"
    """"local": processes on this machine, no services. "ray": Ray actors (pip install "tokenflow-rl[ray]")."""
    scorer_workers: int = Field(default=1, ge=1)
    """Reward worker processes (Ray backend: reward actors)."""
    score_timeout_s: float = Field(default=10.0, gt=0)
    """Per-sample reward timeout; a sample past it is marked failed, not the run."""
    worker_timeout_s: float = Field(default=300.0, gt=0)
    """Longest silence from a worker process before the run stops with its name."""
    num_engines: int = Field(default=1, ge=1)
    """Engine workers (processes, or Ray actors); each prompt group goes to the least-loaded one."""
    min_engines: int = Field(default=1, ge=1)
    """Ray backend: the fewest engines `tokenflow engines remove` and ``elastic`` may leave running."""
    max_engines: int | None = Field(default=None, ge=1)
    """Ray backend: the most engines `tokenflow engines add` and ``elastic`` may run (None: no bound
    on the command; ``elastic`` needs one)."""
    elastic: bool = False
    """Ray backend: add an engine while the trainer waits on generation and remove one while the
    engines wait on the trainer, between ``min_engines`` and ``max_engines`` (docs/distributed.md,
    "Elastic engines")."""
    elastic_idle_frac: float = Field(default=0.5, gt=0, le=1)
    """``elastic``: the waiting fraction (of a step's wall time, trainer or engines) that counts as waiting."""
    elastic_patience: int = Field(default=2, ge=1)
    """``elastic``: steps in a row of one side waiting before an engine is added or removed."""
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    """Local backend: how engine and trainer processes start. "forkserver": forked from a server
    process started before the run's input checks, which imports torch, transformers and the
    worker code once while they run (a fork then starts a worker in milliseconds). "spawn": each
    worker is a fresh interpreter that imports everything itself (slower start, nothing shared)."""
    ray_address: str | None = None
    """Ray cluster to join, e.g. "ray://head:10001" or "auto" (None: start a local one, unless
    the caller already called ray.init, whose cluster is used)."""
    ray_engine_cpus: float = Field(default=1.0, gt=0)
    """CPUs each engine actor reserves (Ray backend)."""
    ray_engine_gpus: float = Field(default=0.0, ge=0)
    """GPUs each engine actor reserves (Ray backend); fractions share a GPU."""
    ray_trainer_cpus: float = Field(default=1.0, gt=0)
    """CPUs each trainer rank's actor reserves (Ray backend)."""
    ray_trainer_gpus: float = Field(default=0.0, ge=0)
    """GPUs each trainer rank's actor reserves (Ray backend)."""
    ray_scorer_cpus: float = Field(default=0.0, ge=0)
    """CPUs each of the ``scorer_workers`` reward actors reserves (Ray backend). 0 lets them run
    beside actors that hold every CPU; raise it for heavy reward functions so Ray spreads them."""
    ray_placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = None
    """Reserve all engine and trainer actors at once as one Ray placement group with this
    strategy (None: place each actor on its own)."""
    max_worker_restarts: int = Field(default=3, ge=0)
    """Times each worker (the trainer, each engine, the scorer pool) is replaced when it dies,
    while the run goes on (0: a death stops the run, with the resume command). A new trainer
    starts from the last checkpoint and re-trains the batches taken since, so the weights and
    the prompt ledger come out as if it had not died; a new engine loads the current weights
    and its in-flight groups are generated again; a new scorer pool scores its groups again
    (docs/robustness.md, "A worker dies"). On Ray, dead engine and scorer actors are
    restarted by Ray this many times, and dead trainer actors are replaced as above. Before this key was
    runtime.max_engine_restarts (Ray engines only), which is still read as this one."""
    restart_window_s: float = Field(default=60.0, ge=0)
    """A worker that dies again within this many seconds of being replaced stops the run
    instead (a crash loop is not healed); 0 turns the check off."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_restarts(cls, data: Any) -> Any:
        """``max_engine_restarts`` (the Ray backend's engine restarts) became ``max_worker_restarts``."""
        if isinstance(data, dict) and "max_engine_restarts" in data:
            data = dict(data)
            old = data.pop("max_engine_restarts")
            if "max_worker_restarts" in data and data["max_worker_restarts"] != old:
                raise ValueError("runtime.max_engine_restarts is now runtime.max_worker_restarts (it covers the "
                                 "trainer and the scorers too); set only runtime.max_worker_restarts")
            data["max_worker_restarts"] = old
        return data

    @model_validator(mode="after")
    def _engine_bounds(self) -> "RuntimeConfig":
        top = self.max_engines
        if self.min_engines > self.num_engines or (top is not None and top < self.num_engines):
            raise ValueError(f"runtime.num_engines ({self.num_engines}) must lie within runtime.min_engines "
                             f"({self.min_engines}) and runtime.max_engines ({top})")
        if self.elastic and self.backend != "ray":
            raise ValueError('runtime.elastic adds and removes Ray engine actors; set runtime.backend = "ray"')
        if self.elastic and top is None:
            raise ValueError("runtime.elastic needs runtime.max_engines (the most engines it may start)")
        return self


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

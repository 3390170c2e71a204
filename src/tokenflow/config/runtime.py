"""The ``[runtime]`` section: where the parts run (local processes or Ray actors), how many
engines, worker timeouts and restarts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tokenflow.config.base import ConfigModel


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
    lend_trainer_threads: bool = True
    """Local backend, CPU, with ``engine.threads`` and ``trainer.threads`` both set: while the
    trainer waits for a batch, the engines take its threads, and give them back as a batch goes to
    it (at the next decode step). On a machine whose cores the two share, the side that waits
    lends its cores to the side that works (docs/performance.md, "Lending the trainer's threads").
    False: the engines keep ``engine.threads`` until the last step (they take the trainer's
    threads for the final evaluation either way)."""
    check_memory: bool = True
    """Before any process starts, estimate each worker's peak host memory (weights, gradients
    and AdamW state, activations × trainer.micro_batch_tokens, logits, the engine's KV cache;
    ``tokenflow train --dry-run`` prints it) and refuse a run that cannot fit in the memory
    available (MemAvailable, the cgroup's limit). False: warn and start anyway."""

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

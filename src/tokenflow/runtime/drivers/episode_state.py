"""What the episode driver keeps: the `EpisodeSpec` a ``Generate`` carries, and one running
episode's state (`RunningEpisode`: its engine request, environment, bridge, rows and pending call)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from tokenflow.rollout import Rollout


@dataclass(frozen=True)
class EpisodeSpec:
    """What a ``Generate`` carries for an environment task (small and picklable)."""

    env: str
    """The environment class, ``module:Class`` or ``path/file.py:Class``."""
    example: dict
    """The task row handed to ``Environment.reset``."""
    max_turns: int | None = None
    """Model turns per episode; None: the environment's own ``max_turns``."""
    max_total_tokens: int = 1024
    """Completion tokens per episode, generated and environment tokens together."""
    step_timeout_s: float = 10.0
    """Deadline of one ``reset`` or ``step`` call."""
    agent: str | None = None
    """An agent task's function, ``module:function``: the sample is played by it, through a
    training session (`tokenflow.runtime.drivers.agents`), not by the environment's reset and step."""
    agent_timeout_s: float = 120.0
    """Deadline of one agent call, from its start to its return."""
    options: dict = field(default_factory=dict)
    """``[task.options]``: the environment's constructor gets those it names
    (`tokenflow.envs.make_environment`)."""


@dataclass
class RunningEpisode:
    request_id: str
    """The group's request id (the ``Generate``'s)."""
    index: int
    group_id: int
    prompt_id: int
    seed: int
    env: object = None
    bridge: object = None
    max_turns: int = 1
    prompt_ids: list[int] = field(default_factory=list)
    rollout: Rollout | None = None
    """The current training row (prompt_ids + completion so far)."""
    rows: list[Rollout] = field(default_factory=list)
    """Finished earlier rows (only when the template does not preserve prefixes)."""
    record: object = None
    """The `tokenflow.envs.Episode` the rubric scores (messages, step rewards, info, state)."""
    last_message: dict | None = None
    """The last assistant turn as `Environment.parse` recorded it (shapes the environment ids)."""
    future: Future | None = None
    deadline: float = 0.0
    pending: str = ""
    """What the future is: "reset" or "step"."""
    finish: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def turns(self) -> int:
        return self.record.turns if self.record is not None else 0

    @property
    def engine_rid(self) -> str:
        """Each episode is its own engine request (n = 1), continued turn after turn."""
        return f"{self.request_id}#{self.index}"

"""The ``[task]`` and ``[episode]`` sections: the prompts and reward, and the limits of a task's
multi-turn episodes (tasks with ``task.env``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from tokenflow.config.base import ConfigModel


class TaskConfig(ConfigModel):
    name: str = "arithmetic"
    """"arithmetic" (built in), "dataset" (prompts from a local JSONL/Parquet file + your reward),
    "env" (multi-turn episodes of ``env``, examples drawn from the environment class),
    "reasoning_gym" (a reasoning-gym dataset named in ``options``; docs/reasoning_gym.md),
    "verifiers" (a verifiers environment named in ``options``; docs/verifiers.md), or a task a
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
    """Settings, as a table (``[task.options]``): of a plugin task, or with ``env`` of the
    environment class (passed by keyword to its constructor and its ``train_example`` /
    ``eval_examples``, each getting the keys its signature names; docs/environments.md,
    "Options"), or of reasoning_gym (``dataset``/``config`` or ``datasets``, ``answer``). Other
    built-in tasks take none."""

    @model_validator(mode="before")
    @classmethod
    def _task_settings(cls, data: Any) -> Any:
        """The defaults the chosen task declares (its registry entry's ``settings``) for the keys
        the config leaves out: a task that needs a chat template and a system prompt works in one
        line, and the run's saved config shows what it used."""
        from tokenflow.registry import TASKS, UnknownName

        if not isinstance(data, dict):
            return data
        try:
            settings = TASKS.props(data.get("name", "arithmetic"))["settings"]
        except (UnknownName, TypeError):  # the name's own validator says what is wrong with it
            return data
        return {**(settings or {}), **data}

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
        if self.env and self.name not in ("env", "dataset", "verifiers"):  # verifiers: its own env
            raise ValueError(f'task.env is set but task.name = "{self.name}"; use task.name = "env" (examples '
                             'from the environment class) or "dataset" (examples from task.train_path)')
        TASKS.validate(self.name, self)  # what the chosen task needs is declared with it
        return self


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

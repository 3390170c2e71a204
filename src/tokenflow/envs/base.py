"""What a multi-turn rollout talks to: `Environment`, and what one of its steps returns.

One instance plays one episode, driven like this (`tokenflow.envs.episode.play_reference_episodes`
is a small reference driver; the runtime's is in the engine worker)::

    env = EnvClass()
    messages, tools = env.reset(example)          # opening messages; tools offered this episode
    ids = bridge.prompt_ids(messages)             # ChatBridge(tokenizer, tools)
    for turn in range(env.max_turns):
        turn_ids = <the model samples, stopping at bridge.turn_end_ids>
        raw = bridge.assistant_message(turn_ids)  # text decoded only to be read, never re-encoded
        message = env.parse(raw)                  # the turn as recorded (tool calls split out)
        observations, reward, done, info = await env.step(raw)
        if done:
            break
        ids += turn_ids + bridge.environment_ids(observations, assistant=message)
    env.close()

The rules the driver keeps:

* ``step`` runs after every assistant turn, the ``max_turns``-th included (it may hold the final
  answer). If that step is not ``done`` the episode is cut there (``Episode.truncated``) and
  its observations are dropped.
* An assistant turn that did not end with the template's turn end (the model ran out of tokens)
  ends the episode without a step: there is no well-formed turn to answer.
* The episode's reward is the rubric's weighted sum (`tokenflow.envs.rubric.Rubric`) plus the
  sum of the non-None rewards ``step`` returned; with no rubric, the step rewards alone.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from tokenflow.envs.tool_calls import FORMATS

@dataclass
class StepResult:
    """What one step returns; unpacks as ``observations, reward, done, info = result``."""

    observations: list[dict] = field(default_factory=list)
    """Messages to append after the assistant turn (role "tool" or "user")."""
    reward: float | None = None
    """A reward earned by this turn, added to the episode's reward; None: nothing to add."""
    done: bool = False
    """The episode is over (the last message was a final answer, the game ended, ...)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Counters and notes for logging; numbers are summed over the episode's steps."""

    def __iter__(self):
        return iter((self.observations, self.reward, self.done, self.info))


class Environment(abc.ABC):
    """A multi-turn episode: opening messages, then one `step` per assistant turn.

    Subclass it, implement `step` (and usually `reset`), and name the class in the config as
    ``task.env = "module:Class"`` or ``"path/to/file.py:Class"``. For tool use, subclass
    `tokenflow.envs.tool_env.ToolEnvironment`, which implements `step`.

    An environment that generates its own examples (so that a task needs no data file) defines
    two classmethods: ``train_example(index, seed) -> dict`` (the same dict for the same index,
    which is what makes resume exact) and ``eval_examples(seed, n) -> list[dict]`` (a held-out
    split that the training stream never draws). Otherwise examples are the rows of
    ``task.train_path``.

    ``[task.options]`` configure the class: the constructor and the two classmethods each get,
    by keyword, the options their signature names (``tokenflow.envs.loading``); a subclass
    that takes options calls ``super().__init__()``.
    """

    max_turns: ClassVar[int] = 4
    """Most assistant turns in one episode."""
    tool_format: ClassVar[str] = "hermes"
    """How the model writes tool calls: "hermes" (``<tool_call>{json}</tool_call>``) or "plain"
    (``name(arg1,arg2)`` on its own line); see `tokenflow.envs.tool_calls`."""
    tools: ClassVar[list[Callable]] = []
    """Tool functions offered to the model: typed, with Google-style docstrings. An episode with
    other tools sets ``self.tools`` in `reset`."""
    rubric: ClassVar[Any] = None
    """A `tokenflow.envs.rubric.Rubric` that scores finished episodes (typed loosely: the rubric
    module builds on this one); None: the episode's reward is the sum of its step rewards."""
    system_prompt: ClassVar[str | None] = None
    """A system message the default `reset` puts first."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.tool_format not in FORMATS:
            raise TypeError(f"{cls.__qualname__}.tool_format = {cls.tool_format!r}; use one of {', '.join(FORMATS)}")
        if not isinstance(cls.max_turns, int) or cls.max_turns < 1:
            raise TypeError(f"{cls.__qualname__}.max_turns = {cls.max_turns!r}; it must be an int >= 1")

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        """Whatever the environment keeps during an episode; reward functions may read it."""

    def reset(self, example: dict) -> tuple[list[dict], list[Callable]]:
        """Start an episode: the opening messages and the tools offered in it.

        The default reads ``example["messages"]`` (a list of messages) or ``example["prompt"]``
        (the text of one user message, after `system_prompt` if set), and offers ``self.tools``.
        """
        if isinstance(example.get("messages"), list):
            messages = [dict(m) for m in example["messages"]]
        elif isinstance(example.get("prompt"), str):
            messages = [{"role": "user", "content": example["prompt"]}]
        else:
            raise ValueError(f"{type(self).__qualname__}.reset: the example has neither a 'messages' list nor a "
                             f"'prompt' string (keys: {', '.join(sorted(example)) or 'none'}); "
                             "override reset() to build the opening messages")
        if self.system_prompt and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, list(self.tools)

    def parse(self, assistant_message: dict) -> dict:
        """The assistant turn as the episode records it (OpenAI shape). The default keeps it as
        it is; `ToolEnvironment` splits tool calls out of the content."""
        return dict(assistant_message)

    @abc.abstractmethod
    async def step(self, assistant_message: dict) -> StepResult:
        """Answer one assistant turn (``{"role": "assistant", "content": text}``): the messages to
        append, a reward for this turn if any, and whether the episode is over."""

    def close(self) -> None:
        """Release what the episode held (processes, containers, files). Called once, at the end."""

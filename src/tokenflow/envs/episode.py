"""Episodes: what a played conversation records, and a small reference driver.

`play_reference_episodes` plays a batch of episodes turn by turn with any ``generate`` callable
(a transformers model, the built-in engine) and `ChatBridge` token ids, keeping the rules of
`tokenflow.envs.base`. It is what `tokenflow.shipped_models.make_tool_model` measures the tool
model with and what the tests drive environments with. It is the reference, not what training
runs: the training runtime drives episodes in its engine worker
(`tokenflow.runtime.drivers.episodes`), continuing each sequence in the engine instead of
re-submitting it; ``tests/envs/test_reference_driver.py`` checks that the two play the same
greedy episodes. `run_episodes` is the old name of the reference driver, kept as a deprecated
alias (``tokenflow.envs.run_episodes``).
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from dataclasses import dataclass, field
from numbers import Number
from typing import Any, Callable, Sequence

from tokenflow.envs.base import Environment, StepResult
from tokenflow.envs.bridge import ChatBridge


@dataclass
class Episode:
    """One played episode: what the rubric scores."""

    example: dict
    messages: list[dict] = field(default_factory=list)
    """Opening messages, then each assistant turn (as `Environment.parse` records it) followed by
    its observations."""
    step_rewards: list[float] = field(default_factory=list)
    """The non-None rewards the steps returned, in order."""
    info: dict[str, Any] = field(default_factory=dict)
    """The steps' info: numbers summed, anything else the last value."""
    state: dict[str, Any] = field(default_factory=dict)
    """The environment's ``state`` when the episode ended."""
    turns: int = 0
    """Assistant turns taken."""
    truncated: bool = False
    """Ended by ``max_turns`` or by a turn that ran out of tokens, not by the environment."""

    @property
    def completion(self) -> str:
        """The content of the last assistant message ("" if there is none)."""
        for m in reversed(self.messages):
            if m.get("role") == "assistant":
                return m.get("content") or ""
        return ""

    def record(self, message: dict, result: StepResult | None, keep_observations: bool = True) -> None:
        """Add one assistant turn and what its step returned."""
        self.messages.append(message)
        if result is None:
            return
        if keep_observations:
            self.messages.extend(result.observations)
        if result.reward is not None:
            self.step_rewards.append(float(result.reward))
        for key, value in result.info.items():
            old = self.info.get(key)
            summable = isinstance(value, Number) and isinstance(old, Number)
            self.info[key] = old + value if summable else value


@dataclass
class Trajectory:
    """An episode with its token ids, shaped like a `tokenflow.rollout.Rollout`'s."""

    episode: Episode
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    """The model's turns and the environment's ids between them, in order."""
    loss_mask: list[int] = field(default_factory=list)
    """One per completion id: 1 where the model sampled it, 0 for environment ids."""


Generate = Callable[[list[list[int]], tuple[int, ...]], Any]
"""``generate(prompts, stop_token_ids) -> list of sampled ids per prompt`` (or an awaitable of it):
one model turn per prompt, ending with one of ``stop_token_ids`` unless it ran out of tokens."""


async def play_reference_episodes(env_cls: type[Environment], examples: Sequence[dict], tokenizer,
                                  generate: Generate, max_len: int | None = None, *,
                                  options: dict | None = None, **bridge_kwargs) -> list[Trajectory]:
    """Play one episode per example, all turns of one round in one ``generate`` call. An episode
    whose ids reach ``max_len`` (the model's context) ends there, truncated. ``options``: the
    environment's ``[task.options]`` (`tokenflow.envs.loading.make_environment`)."""
    from tokenflow.envs.loading import make_environment

    envs = [make_environment(env_cls, options) for _ in examples]
    bridges: dict[tuple, ChatBridge] = {}
    trajs: list[Trajectory] = []
    used: list[ChatBridge] = []
    try:
        for env, example in zip(envs, examples):
            messages, tools = env.reset(example)
            key = tuple(id(t) for t in tools)
            if key not in bridges:
                bridges[key] = ChatBridge(tokenizer, tools, **bridge_kwargs)
            used.append(bridges[key])
            trajs.append(Trajectory(Episode(example, list(messages)), used[-1].prompt_ids(messages)))
        stop = tuple(sorted({t for b in bridges.values() for t in b.turn_end_ids}))
        active = list(range(len(envs)))
        while active:
            outs = generate([trajs[i].prompt_ids + trajs[i].completion_ids for i in active], stop)
            if inspect.isawaitable(outs):
                outs = await outs
            stepping = []
            for i, out in zip(active, outs):
                t, out = trajs[i], [int(x) for x in out]
                t.completion_ids += out
                t.loss_mask += [1] * len(out)
                t.episode.turns += 1
                raw = used[i].assistant_message(out)
                message = envs[i].parse(raw)
                if used[i].ends_turn(out):
                    stepping.append((i, raw, message))
                else:
                    t.episode.record(message, None)
                    t.episode.truncated = True
            results = await asyncio.gather(*(envs[i].step(raw) for i, raw, _ in stepping))
            active = []
            for (i, _, message), result in zip(stepping, results):
                episode = trajs[i].episode
                last = episode.turns >= envs[i].max_turns
                episode.record(message, result, keep_observations=result.done or not last)
                if result.done:
                    continue
                if last:
                    episode.truncated = True
                    continue
                env_ids = used[i].environment_ids(result.observations, assistant=message)
                trajs[i].completion_ids += env_ids
                trajs[i].loss_mask += [0] * len(env_ids)
                if max_len is not None and len(trajs[i].prompt_ids) + len(trajs[i].completion_ids) >= max_len:
                    episode.truncated = True
                    continue
                active.append(i)
    finally:
        for env in envs:
            env.close()
    for env, t in zip(envs, trajs):
        t.episode.state = env.state
    return trajs


def run_episodes(*args, **kwargs):
    """Deprecated: the old name of `play_reference_episodes` (same arguments, same coroutine),
    kept because ``tokenflow.envs.run_episodes`` is public. Not to be confused with the training
    driver's blocking `tokenflow.runtime.drivers.episodes.run_episodes`."""
    warnings.warn("tokenflow.envs.run_episodes is deprecated; call tokenflow.envs.play_reference_episodes "
                  "(the same reference driver)", DeprecationWarning, stacklevel=2)
    return play_reference_episodes(*args, **kwargs)

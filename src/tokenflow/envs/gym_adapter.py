"""Gym-style text environments as tokenflow environments: `GymEnv`, configured, not subclassed.

A Gym-style text environment is an object a factory makes (``textarena.make``,
``gymnasium.make``, ``skyrl_gym.make``, a class), that starts with ``reset`` (or SkyRL-gym's
``init``) and answers each action text with ``step``. `GymEnv` plays one such object per
episode::

    [task]
    name = "env"
    env = "tokenflow.envs.gym_adapter:GymEnv"

    [task.options]
    make = "textarena:make"                   # the factory, "module:callable" or "file.py:callable"
    id = "GuessTheNumber-v0"                  # its first argument (left out when not set)
    kwargs = { min_number = 1, max_number = 5 }   # its keyword arguments

The shapes it reads (``api = "auto"`` tells them apart; set it to insist on one):

* ``"gymnasium"``: ``reset(seed=...)`` returns ``obs`` or ``(obs, info)``; ``step(text)``
  returns ``(obs, reward, terminated, truncated, info)`` or the older ``(obs, reward, done, info)``.
* ``"skyrl"`` (SkyRL-gym's ``BaseTextEnv``): ``init(prompt)`` returns ``(messages, metadata)``;
  ``step(text)`` returns a mapping with ``observations``, ``reward``, ``done``, ``metadata``.
  Its envs read their example from the constructor: ``example_arg = "extras"`` hands it over.
* ``"textarena"`` (single-player games): ``reset(num_players=1, seed=...)``, then
  ``get_observation()``; ``step(text)`` returns ``(done, info)``; the reward is
  ``close()``'s, once the game is done. Observation wrappers (which render the whole history
  again every turn) are read past: each turn's new game messages become one user message (the
  echo of the model's own action left out); action wrappers apply.

An observation becomes messages: a string one user message, a message dict or a list of them
as they are. A reward becomes the step's reward (the episode's reward is their sum), ``done``
(or ``terminated or truncated``) ends the episode. Numbers and strings of ``info`` reach the
episode's info. Examples come from seeds (``train_example`` / ``eval_examples``, the seed given
to ``reset``), so the same index plays the same game and resume is exact; with
``task.name = "dataset"`` a row is the example (its ``seed``, if any, is used).

A call that raises fails the episode's sample with a `GymEnvError` naming the environment, the
call and the action; so does a return value of a shape none of the above has. Calls into
TextArena games are serialized by one lock: TextArena seeds Python's global ``random`` in
``reset``, and resets (like steps) run on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import threading
from functools import lru_cache
from numbers import Number
from typing import Any, Mapping

from tokenflow.envs.base import Environment, StepResult
from tokenflow.envs.loading import EnvironmentLoadError

APIS = ("auto", "gymnasium", "skyrl", "textarena")
EVAL_STREAM = "eval"
"""The held-out examples' seeds come from their own stream, never the training stream's."""

_TEXTARENA = threading.RLock()
"""Serializes the calls into TextArena games (see the module docstring)."""


class GymEnvError(RuntimeError):
    """A wrapped environment raised, or returned something `GymEnv` cannot read."""


@lru_cache(maxsize=32)
def resolve_factory(make: str):
    """The callable ``make`` names (``module:callable`` or ``path/to/file.py:callable``)."""
    from tokenflow.tasks.reward_loading import load_attribute

    if not isinstance(make, str) or ":" not in make:
        raise EnvironmentLoadError(f"task.options.make = {make!r} must be 'module:callable' or "
                                   "'path/to/file.py:callable' (e.g. 'textarena:make', 'gymnasium:make')")
    obj = load_attribute(make, what="environment factory", key="task.options.make", noun="callable",
                         error=EnvironmentLoadError)
    if not callable(obj):
        raise EnvironmentLoadError(f"task.options.make = {make!r} names a {type(obj).__name__}, not a callable")
    return obj


def seed_of(seed: int, index: int, stream: str = "train") -> int:
    """The ``reset`` seed of example ``index``: the same for the same (seed, index, stream)."""
    return random.Random(f"tokenflow.gym/{seed}/{stream}/{index}").randrange(2**31)


def detect_api(env: Any) -> str:
    """Which shape ``env`` has: SkyRL-gym's (``init``, no ``reset``), TextArena's (a class of the
    ``textarena`` package, or ``get_observation``), else Gymnasium's (``reset`` and ``step``)."""
    has = lambda name: callable(getattr(env, name, None))  # noqa: E731
    if not has("step"):
        raise GymEnvError(f"{type(env).__qualname__} has no step(); a Gym-style text environment has "
                          "reset() (or init()) and step(action)")
    if has("init") and not has("reset"):
        return "skyrl"
    if any(c.__module__.split(".")[0] == "textarena" for c in type(env).__mro__) or has("get_observation"):
        return "textarena"
    if has("reset"):
        return "gymnasium"
    raise GymEnvError(f"{type(env).__qualname__} has neither reset() nor init()")


def _is_textarena_wrapper(obj: Any) -> bool:
    return any(c.__name__ == "Wrapper" and c.__module__ == "textarena.core" for c in type(obj).__mro__)


def innermost(env: Any) -> Any:
    """The game under TextArena's wrappers (``.env`` is their public handle on what they wrap)."""
    while _is_textarena_wrapper(env) and getattr(env, "env", None) is not None:
        env = env.env
    return env


def to_messages(obs: Any) -> list[dict]:
    """An observation as messages: a string is one user message; a message dict, or a list of
    them, as they are; TextArena's ``(from, text, type)`` tuples one user message of the texts
    (the model's own action left out); anything else its ``str``."""
    if obs is None:
        return []
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}] if obs.strip() else []
    if isinstance(obs, Mapping) and "content" in obs:
        return [{**obs, "role": obs.get("role", "user")}]
    if isinstance(obs, (list, tuple)) and obs and all(isinstance(m, Mapping) for m in obs):
        return [m for o in obs for m in to_messages(o)]
    if isinstance(obs, (list, tuple)) and all(isinstance(t, tuple) and len(t) == 3 for t in obs):
        texts = [str(text).strip() for _, text, kind in obs if getattr(kind, "name", kind) != "PLAYER_ACTION"]
        return to_messages("\n".join(t for t in texts if t))
    return to_messages(str(obs))


def plain_info(info: Any) -> dict:
    """The numbers, booleans and strings of an ``info`` / ``metadata`` mapping (what can cross to
    the scorer and be summed); TextArena's per-player ``{0: {...}}`` is read for player 0."""
    if not isinstance(info, Mapping):
        return {}
    if 0 in info and isinstance(info[0], Mapping):
        info = info[0]
    return {str(k): (float(v) if isinstance(v, Number) and not isinstance(v, (bool, int)) else v)
            for k, v in info.items() if isinstance(v, (Number, str))}


class GymEnv(Environment):
    """One episode of a Gym-style text environment (see the module docstring for the options)."""

    max_turns = 16
    """A bound; the wrapped environment's ``done`` normally ends the episode first
    (``[episode] max_turns`` sets another)."""

    def __init__(self, make: str, id: str | None = None, kwargs: dict | None = None, api: str = "auto",
                 example_arg: str | None = None, system_prompt: str | None = None) -> None:
        super().__init__()
        if api not in APIS:
            raise EnvironmentLoadError(f"task.options.api = {api!r}; use one of {', '.join(APIS)}")
        self.make, self.id, self.kwargs = make, id, dict(kwargs or {})
        self.api, self.example_arg, self.system_prompt = api, example_arg, system_prompt
        self.env: Any = None
        self.kind: str | None = None
        self.closed = False

    @property
    def name(self) -> str:
        return self.id or self.make

    # ---- examples: seeds ------------------------------------------------------------------
    @classmethod
    def train_example(cls, index: int, seed: int, make: str | None = None) -> dict:
        if make is not None:
            resolve_factory(make)  # a factory that does not import is named at start, not per episode
        return {"seed": seed_of(seed, index), "index": index}

    @classmethod
    def eval_examples(cls, seed: int, n: int, make: str | None = None) -> list[dict]:
        if make is not None:
            resolve_factory(make)
        return [{"seed": seed_of(seed, i, EVAL_STREAM), "index": i} for i in range(n)]

    # ---- the episode ------------------------------------------------------------------------
    def _call(self, what: str, fn, *args, action: str | None = None, **kwargs):
        try:
            with _TEXTARENA if self.kind == "textarena" else contextlib.nullcontext():
                return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a wrapped environment may raise anything
            shown = "" if action is None else f" on action {action[:80]!r}" + ("..." if len(action) > 80 else "")
            raise GymEnvError(f"{self.name}: {what} raised {type(e).__name__}: {e}{shown}") from e

    def _build(self, example: dict) -> Any:
        factory = resolve_factory(self.make)
        args = [] if self.id is None else [self.id]
        kwargs = {**self.kwargs, **({self.example_arg: example} if self.example_arg else {})}
        return self._call(f"{self.make}(...)", factory, *args, **kwargs)

    def reset(self, example: dict):
        seed = example.get("seed")
        self.state.update(seed=seed, env=self.name)
        self.env = self._build(example)
        self.kind = detect_api(self.env) if self.api == "auto" else self.api
        if self.kind == "skyrl":
            prompt = example.get("prompt", example.get("messages", []))
            prompt = to_messages(prompt) if isinstance(prompt, str) else list(prompt)
            out = self._call("init", self.env.init, prompt)
            obs = out[0] if isinstance(out, tuple) else out
        elif self.kind == "textarena":
            self._call("reset", self.env.reset, num_players=1, seed=seed)
            obs = self._textarena_observation()
        else:
            out = self._call("reset", self.env.reset, **({"seed": seed} if seed is not None and
                                                         _takes(self.env.reset, "seed") else {}))
            obs = out[0] if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping) else out
        messages = to_messages(obs)
        if not messages:
            raise GymEnvError(f"{self.name}: {'init' if self.kind == 'skyrl' else 'reset'} gave no observation "
                              "to open the episode with")
        if self.system_prompt and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, []

    def _textarena_observation(self) -> Any:
        player, obs = self._call("get_observation", innermost(self.env).get_observation)
        if player != 0:
            raise GymEnvError(f"{self.name}: player {player} is to move; only single-player TextArena games "
                              "are supported")
        return obs

    async def step(self, assistant_message: dict) -> StepResult:
        if self.env is None:
            raise GymEnvError(f"{self.name}: step before reset")
        action = assistant_message.get("content") or ""
        return await asyncio.to_thread(self._step, action)

    def _step(self, action: str) -> StepResult:
        out = self._call("step", self.env.step, action, action=action)
        if self.kind == "textarena":
            return self._textarena_result(out)
        if isinstance(out, Mapping):
            missing = [k for k in ("observations", "reward", "done") if k not in out]
            if missing:
                raise GymEnvError(f"{self.name}: step returned a mapping without {', '.join(missing)} "
                                  f"(keys: {', '.join(map(str, out)) or 'none'})")
            return self._result(out["observations"], out["reward"], out["done"], out.get("metadata"))
        if isinstance(out, tuple) and len(out) == 5:
            obs, reward, terminated, truncated, info = out
            info = {**plain_info(info), **({"gym_truncated": 1} if truncated and not terminated else {})}
            return self._result(obs, reward, bool(terminated) or bool(truncated), info)
        if isinstance(out, tuple) and len(out) == 4:
            return self._result(*out)
        shape = f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {type(out).__name__}"
        raise GymEnvError(f"{self.name}: step returned {shape}; expected (obs, reward, terminated, truncated, "
                          "info), (obs, reward, done, info), a mapping with observations/reward/done, or "
                          "TextArena's (done, info)")

    def _textarena_result(self, out: Any) -> StepResult:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise GymEnvError(f"{self.name}: a TextArena step returns (done, info), not {type(out).__name__}")
        done, info = out
        obs = self._textarena_observation()
        reward = None
        if done:
            closed = self._call("close", self.env.close)
            self.closed = True
            rewards, game_info = closed if isinstance(closed, tuple) and len(closed) == 2 else (closed, None)
            reward = (rewards or {}).get(0) if isinstance(rewards, Mapping) else None
            info = {**plain_info(info), **plain_info(game_info)}
        return self._result(obs, reward, done, info)

    def _result(self, obs: Any, reward: Any, done: Any, info: Any) -> StepResult:
        if reward is not None:
            try:
                reward = float(reward)
            except (TypeError, ValueError):
                raise GymEnvError(f"{self.name}: step returned the reward {reward!r}, not a number") from None
        return StepResult(to_messages(obs), reward, bool(done), plain_info(info))

    def close(self) -> None:
        if self.env is not None and not self.closed and callable(getattr(self.env, "close", None)):
            self.closed = True
            self._call("close", self.env.close)


def _takes(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)

"""verifiers environments as a tokenflow task: ``task.name = "verifiers"``.

::

    [task]
    name = "verifiers"
    [task.options]
    env = "examples/verifiers/tf_vf_qa"       # a verifiers taskset id, or the folder of one
    args = {path = "data.jsonl"}              # its taskset config (verifiers' --env.taskset.*)
    renderer_model = "smollm2-135m-instruct"  # the tokenizer of model.path: token-in/token-out

Each sample is one verifiers episode played by verifiers itself (`Env.run_episode`: the taskset's
task, its harness, its interception server, its rubric) against the base URL of a tokenflow
training session, which is all the model it sees: an agent task (`task.agent` is `play`, the
example carries which task of the taskset to play). With ``renderer_model`` set, verifiers' train
client renders the prompts with that tokenizer and calls the session's
``/inference/v1/generate`` with token ids (`tokenflow.serve.token_routes`), bridging later turns
onto the ids the model sampled; without it, its eval client sends chat messages and the session's
own bridge joins the turns. Either way every token trained on is one the engine sampled, with its
behaviour log-prob and policy version, and a call that extends the previous one continues its
training row. The reward is the episode's, from the taskset's own ``@vf.reward`` functions (the
mean over the episode's traces when an environment plays several agents); an episode that raises,
or reports an error, fails its sample; one past ``episode.agent_timeout_s`` is cancelled.

The taskset is read once per process and held in memory (an unbounded one needs the ``limit``
option). Its last ``eval_size`` tasks (default a tenth, at least one) are the held-out split; the
training stream draws the others in seeded epoch shuffles. Tested with verifiers 0.4.0
(`verifiers.v1`); imported only when such a task runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenflow.envs.base import Environment, StepResult
from tokenflow.envs.rubric import Rubric

log = logging.getLogger(__name__)

ENV_SPEC = "tokenflow.envs.verifiers_env:VerifiersEnv"
AGENT_SPEC = "tokenflow.envs.verifiers_env:play"
TESTED_VERSION = "0.4.0"
SESSION_MODEL = "policy"
"""The model name verifiers sends; a training session serves the policy under any name."""


class VerifiersError(RuntimeError):
    """A verifiers episode failed (raised, timed out inside verifiers, or reported errors)."""


def _vf():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError('task.name = "verifiers" needs the verifiers library (tested with verifiers '
                          f'{TESTED_VERSION}): pip install "tokenflow-rl[envs]" ({e})') from None
    return vf


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def taskset_id(env: str) -> str:
    """The verifiers id of ``env``: an importable taskset id as it is; a folder (or a ``.py``
    file) is imported by its name, its parent put on ``sys.path`` (in every process that loads it)."""
    path = Path(env)
    if "/" in env or env.endswith(".py") or path.is_dir():
        if not path.exists():
            raise ValueError(f"task.options.env = {env!r}: no such folder or file")
        parent = str(path.resolve().parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
        return path.stem if path.suffix == ".py" else path.name
    return env


@dataclass
class Loaded:
    env: Any
    """The verifiers `Env`."""
    tasks: list
    """Its taskset's tasks, in order."""


_LOADED: dict[str, Loaded] = {}
_LOCK = threading.Lock()


def load(env: str, args: dict | None = None, env_config: dict | None = None, limit: int | None = None) -> Loaded:
    """The verifiers environment the options name (``vf.load_environment`` on its config: the
    taskset ``env`` with ``args``, the single agent on the local ``subprocess`` runtime rather
    than verifiers' cloud default, then ``env_config`` merged over it), loaded once per process."""
    key = json.dumps([env, args, env_config, limit], sort_keys=True, default=str)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        vf = _vf()
        # verifiers logs every rollout, interception server and HTTP request at INFO: the run's
        # log would be buried under them.
        for name in ("verifiers", "renderers", "aiohttp.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
        raw = {"taskset": {**(args or {}), "id": taskset_id(env)}, "agent": {"runtime": {"type": "subprocess"}}}
        config = vf.resolve_env_config(_merge(raw, env_config or {}))
        loaded_env = vf.load_environment(config)
        taskset = loaded_env.taskset
        if limit is not None:
            taskset = taskset.take(limit)
        elif not taskset.bounded:
            raise ValueError(f"task.options.env = {env!r}: the taskset is unbounded; set task.options.limit "
                             "to the number of its tasks to use")
        tasks = list(taskset)
        if not tasks:
            raise ValueError(f"task.options.env = {env!r}: the taskset has no tasks")
        _LOADED[key] = Loaded(loaded_env, tasks)
        return _LOADED[key]


def held_out(n: int, eval_size: int | None) -> int:
    """How many tasks the held-out split takes (the last ones)."""
    k = max(1, n // 10) if eval_size is None else eval_size
    if not 0 <= k < n:
        raise ValueError(f"task.options.eval_size = {k}: the taskset has {n} tasks; hold out fewer")
    return k


def _example(loaded: Loaded, i: int, options: dict) -> dict:
    data = loaded.tasks[i].data
    return {"prompt": data.prompt_text, "vf_index": i, "vf_options": options}


def _options(env, args, env_config, renderer_model, eval_size, limit) -> dict:
    return {"env": env, "args": args, "env_config": env_config, "renderer_model": renderer_model,
            "eval_size": eval_size, "limit": limit}


def vf_reward(state) -> float:
    """The verifiers episode's reward (its rubric's weighted sum)."""
    return float(state["result"]["reward"])


def vf_turns(state) -> float:
    """Model calls the episode made (a metric)."""
    return float(state["result"]["turns"])


class VerifiersEnv(Environment):
    """The examples and the rubric of a verifiers task; its samples are played by `play`."""

    rubric = Rubric([vf_reward, vf_turns], weights=[1.0, 0.0])

    @classmethod
    def train_example(cls, index: int, seed: int, env: str, args: dict | None = None, env_config: dict | None = None,
                      renderer_model: str | None = None, eval_size: int | None = None,
                      limit: int | None = None) -> dict:
        loaded = load(env, args, env_config, limit)
        m = len(loaded.tasks) - held_out(len(loaded.tasks), eval_size)
        order = list(range(m))
        random.Random(f"{seed}/{index // m}").shuffle(order)
        options = _options(env, args, env_config, renderer_model, eval_size, limit)
        return _example(loaded, order[index % m], options)

    @classmethod
    def eval_examples(cls, seed: int, n: int, env: str, args: dict | None = None, env_config: dict | None = None,
                      renderer_model: str | None = None, eval_size: int | None = None,
                      limit: int | None = None) -> list[dict]:
        loaded = load(env, args, env_config, limit)
        total = len(loaded.tasks)
        k = held_out(total, eval_size)
        options = _options(env, args, env_config, renderer_model, eval_size, limit)
        return [_example(loaded, i, options) for i in range(total - k, total)][:n]

    def reset(self, example):
        return [{"role": "user", "content": example.get("prompt") or ""}], []

    async def step(self, assistant_message):
        return StepResult([], None, True, {})  # never called: the samples are played by `play`


def client_config(base_url: str, renderer_model: str | None):
    """verifiers' client for a session's base URL: the train client (token ids, rendered with
    ``renderer_model``'s tokenizer) when it is given, else the eval client (chat messages)."""
    vf = _vf()
    if renderer_model is None:
        return vf.EvalClientConfig(base_url=base_url, api_key_var="TOKENFLOW_SESSION_KEY")
    from tokenflow.model_store import resolve_model_path

    path = str(resolve_model_path(renderer_model))
    return vf.TrainClientConfig(base_url=base_url, api_key_var="TOKENFLOW_SESSION_KEY", renderer_model_name=path)


def episode_result(episode) -> dict:
    """The reward and what else the rubric reads of a finished verifiers episode; raises
    `VerifiersError` when it failed."""
    errors = [e.message for e in episode.errors]
    for t in episode.traces:
        errors += [e.message for e in t.errors]
    if errors or not episode.traces or not all(t.ok for t in episode.traces):
        first = errors[0] if errors else "an agent run did not complete"
        raise VerifiersError(f"the verifiers episode failed: {first}"
                             + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    rewards = [t.reward for t in episode.traces]
    components: dict[str, float] = {}
    for t in episode.traces:
        for name, r in t.rewards.items():
            components[name] = components.get(name, 0.0) + float(r.score) / len(episode.traces)
    return {"reward": sum(rewards) / len(rewards), "rewards": components,
            "turns": sum(len(t.calls) for t in episode.traces), "traces": len(episode.traces)}


async def play(base_url: str, example: dict) -> dict:
    """The agent function of ``task.name = "verifiers"``: one verifiers episode of the task
    ``example`` names, against the training session at ``base_url``; returns its result
    (`episode_result`), which the rubric reads as ``state["result"]``."""
    options = example["vf_options"]
    loaded = await asyncio.to_thread(load, options["env"], options.get("args"), options.get("env_config"),
                                     options.get("limit"))
    vf = _vf()
    task = loaded.tasks[example["vf_index"]]
    ctx = vf.ModelContext(model=SESSION_MODEL, client=client_config(base_url, options.get("renderer_model")))
    with context_length_known(base_url):
        episode = await loaded.env.run_episode(task, ctx)
    return episode_result(episode)


@contextmanager
def context_length_known(base_url: str):
    """While a session's episode runs, tell the renderers client that this base URL has no
    context length to look up (the session answers an overlong prompt with a 400 itself). Its
    lookup would otherwise ask ``/models`` once per session under a lock bound to the first event
    loop that waited on it (so a second loop in the process fails), and keep one entry per
    session forever."""
    from renderers import client as renderers_client

    key = (base_url if base_url.endswith("/") else base_url + "/", SESSION_MODEL)
    cache = renderers_client._max_prompt_len_cache  # noqa: SLF001 - no public way to give the value
    cache[key] = None
    try:
        yield
    finally:
        cache.pop(key, None)


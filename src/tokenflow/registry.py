"""Open registries: advantage estimators, policy losses, aggregation modes, tasks and scorers by name.

Every choice a config makes by name (``algorithm.advantage = "rloo"``, ``task.name =
"dataset"``) is looked up in a :class:`Registry`, never in a closed list, so third-party code adds
its own without editing tokenflow:

* with a decorator, in any module the run imports::

      from tokenflow.registry import ADVANTAGES

      @ADVANTAGES.register("my_baseline", token_rewards=True)
      def my_baseline(inp, cfg): ...

* or from an installed package, through the entry point group ``tokenflow.plugins``: each entry
  point names a module (imported) or a callable (called with no arguments) that registers its
  components. Plugins load once per process, the first time a registry is asked about a name,
  so spawned workers (scorers, trainer) find them too.

What a component needs from the rest of the run is declared with it, as properties (an
estimator's ``needs_values``, say) and an optional ``check(config)`` that refuses settings it
cannot work with; the config code reads those instead of testing names. Built-in components are
declared here as ``"module:attribute"`` targets, imported on first use, so that validating a
config loads neither torch nor numpy.

This module imports only the standard library.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tokenflow.plugins"


class UnknownName(ValueError):
    """A config names a component no registry holds; the message lists the known ones."""


class PluginError(RuntimeError):
    """An installed plugin failed to load; the message names its entry point."""


@dataclass
class Entry:
    name: str
    target: Any
    """The component itself, or a ``"module:attribute"`` string imported on first use."""
    props: dict = field(default_factory=dict)
    check: Callable[[Any], None] | None = None
    """Called with the config section that chose this entry; raises ValueError to refuse it."""

    def load(self) -> Any:
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            self.target = getattr(importlib.import_module(module), attr)
        return self.target


class Registry:
    """Named components of one kind, e.g. advantage estimators chosen by ``algorithm.advantage``."""

    def __init__(self, kind: str, config_key: str, defaults: dict | None = None) -> None:
        self.kind = kind
        self.config_key = config_key
        self.defaults = dict(defaults or {})
        """Properties every entry has unless it declares otherwise."""
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, target: Any, *, check: Callable | None = None, **props) -> None:
        """Register ``target`` (the component or a ``"module:attribute"`` string) under ``name``."""
        unknown = set(props) - set(self.defaults)
        if unknown:
            raise TypeError(f"{self.kind} {name!r}: unknown propert{'y' if len(unknown) == 1 else 'ies'} "
                            f"{', '.join(sorted(unknown))}; known: {', '.join(sorted(self.defaults)) or 'none'}")
        if name in self._entries and self._entries[name].target is not target:
            log.warning("%s %r registered again; the later registration wins", self.kind, name)
        self._entries[name] = Entry(name, target, {**self.defaults, **props}, check)

    def register(self, name: str, *, check: Callable | None = None, **props) -> Callable:
        """Decorator form of :meth:`add`."""
        def deco(obj):
            self.add(name, obj, check=check, **props)
            return obj
        return deco

    # ---- lookups (each loads the installed plugins first, once per process) -------------------
    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.unknown_message(name)) from None

    def get(self, name: str) -> Any:
        """The component registered as ``name``."""
        return self.entry(name).load()

    def props(self, name: str) -> dict:
        return self.entry(name).props

    def validate(self, name: str, section: Any = None) -> None:
        """Refuse an unknown name (listing the known ones) or settings the component refuses."""
        e = self.entry(name)
        if e.check is not None and section is not None:
            e.check(section)

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def unknown_message(self, name: str) -> str:
        known = self.names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (f"{self.config_key} = {name!r} is not a known {self.kind}{hint}; known: {', '.join(known)}. "
                f"Plugins register more through the {ENTRY_POINT_GROUP!r} entry point group (docs/plugins.md)")

    # Mapping-like access, so ``REGISTRY[name]`` and ``name in REGISTRY`` read as for a dict.
    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


_plugins_loaded = False


def load_plugins() -> None:
    """Import every ``tokenflow.plugins`` entry point (once per process)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:  # noqa: BLE001 - any failure is reported the same way, with its origin
            dist = getattr(ep, "dist", None)
            origin = f" (package {dist.name})" if dist is not None else ""
            raise PluginError(f"tokenflow plugin {ep.name!r} = {ep.value!r}{origin} failed to load: "
                              f"{type(e).__name__}: {e}; fix or uninstall it") from e
        log.debug("loaded tokenflow plugin %s = %s", ep.name, ep.value)


# ---- the registries and the built-in components --------------------------------------------------
ADVANTAGES = Registry("advantage estimator", "algorithm.advantage",
                      defaults={"needs_values": False, "token_rewards": False, "normalised": False})
"""Estimators ``fn(AdvantageInputs, AlgorithmConfig) -> AdvantageResult``. Properties:
``needs_values`` (per-token values from a value head; returns value targets), ``token_rewards``
(uses per-token rewards, so ``kl_in_reward`` may put the KL penalty there), ``normalised``
(already normalises over the batch: ``whiten_advantages`` is not applied again)."""

POLICY_LOSSES = Registry("policy loss", "algorithm.policy_loss",
                         defaults={"zero_at_zero_advantage": False, "sequence_ratio": False,
                                   "clips_weight": False})
"""``fn(logprobs, old_logprobs, adv, clip_low, clip_high, *, mask, seq_index, num_seqs) ->
(per-token loss, clipped)``; see :mod:`tokenflow.algorithms.losses`. Properties:
``zero_at_zero_advantage`` (a sequence whose advantage is 0 on every token gets loss 0 and
gradient 0, whatever its ratios and the other sequences are, so the trainer may skip it);
``sequence_ratio`` (the loss's ratio is per sequence, so the behaviour weight and its TIS cap are
taken per sequence too: the geometric mean of the tokens' weights); ``clips_weight`` (the loss
clips the importance weight itself, so the corrected behaviour weight goes into its ratio before
the clip instead of multiplying the loss after it). See :mod:`tokenflow.algorithms.objective`."""

AGGREGATIONS = Registry("aggregation mode", "algorithm.aggregation")
"""``fn(mask, seq_index, seq_tokens, counts, max_completion_tokens) -> per-token weights``; see
:mod:`tokenflow.algorithms.aggregation`."""

TASKS = Registry("task", "task.name", defaults={"settings": None})
"""``factory(TaskConfig) -> Task``; see :mod:`tokenflow.tasks.base`. Tasks other than "env" and
"dataset" refuse ``task.env`` (checked by ``TaskConfig``). Property: ``settings``, a dict of
``task.*`` defaults the task wants where the config leaves them out (reasoning_gym: the chat
template and the answer format as system prompt)."""

SCORERS = Registry("scorer", "task.reward")
"""Reward functions ``fn(prompt, completion, example) -> float | dict``, named by ``task.reward``
(which also accepts ``"module:function"``)."""


def _dr_grpo_check(alg) -> None:
    if alg.scale_std and "scale_std" in alg.model_fields_set:
        raise ValueError('algorithm.advantage = "dr_grpo" never divides by the std, but algorithm.scale_std '
                         'is true; use advantage = "grpo" with scale_std, or drop scale_std')


def _dr_grpo_constant_check(alg) -> None:
    if alg.max_completion_tokens is None:
        raise ValueError('algorithm.aggregation = "dr_grpo_constant" needs algorithm.max_completion_tokens '
                         "(the constant length in its normaliser)")


def _no_options(task) -> None:
    if task.options:
        raise ValueError(f"task.options ({', '.join(sorted(task.options))}) is for plugin tasks and environment "
                         f"classes (task.env); task.name = {task.name!r} takes none: remove [task.options]")


def _env_settings_check(task) -> None:
    """Settings that conflict with task.env (an environment scores and opens its own episodes)."""
    if ":" not in task.env:
        raise ValueError(f"task.env = {task.env!r} must be 'module:Class' or 'path/to/file.py:Class'")
    if task.reward:
        raise ValueError("task.env and task.reward are both set: an environment's episodes are scored by its "
                         "rubric (Environment.rubric) and step rewards; remove task.reward, or make the "
                         "function part of the rubric")
    if task.system_prompt:
        raise ValueError("task.system_prompt does not apply to an environment: its reset() writes the opening "
                         "messages (set Environment.system_prompt instead)")


def _env_check(task) -> None:
    if not task.env:  # with task.env, [task.options] go to the environment class (tokenflow.envs.loading)
        _no_options(task)
        raise ValueError('task.name = "env" needs task.env = "module:Class" (an Environment subclass)')
    if task.train_path or task.eval_path:
        raise ValueError('task.name = "env" draws examples from the environment class; for examples from a '
                         'file use task.name = "dataset" with task.env and task.train_path')
    _env_settings_check(task)


def _dataset_check(task) -> None:
    if not task.env:  # with task.env, [task.options] go to the environment class
        _no_options(task)
    if not task.train_path:
        raise ValueError('task.name = "dataset" needs task.train_path (a .jsonl or .parquet file)')
    if task.env:
        _env_settings_check(task)
        return
    if not task.reward:
        raise ValueError('task.name = "dataset" needs task.reward = "module:function"')


RG_SYSTEM_PROMPT = ("Answer the question. Think briefly, then give only the final answer inside "
                    "<answer></answer> tags, for example <answer>42</answer>.")
"""The default ``task.system_prompt`` of task.name = "reasoning_gym": its default answer rule
reads ``<answer>`` tags (tokenflow.tasks.reasoning_gym)."""
_RG_OPTIONS = ("dataset", "config", "datasets", "answer")
_RG_ANSWERS = ("tags", "last_line", "boxed", "whole", "last_number")  # tokenflow.tasks.reasoning_gym.ANSWER_RULES


def _rg_config_check(where: str, config: Any) -> None:
    if not isinstance(config, dict):
        raise ValueError(f"{where} must be a table of the dataset's config keywords, not {config!r}")
    owned = sorted({"seed", "size"} & set(config))
    if owned:
        raise ValueError(f"{where} sets {', '.join(owned)}: the prompt stream is unbounded and seeded by "
                         "task.seed; remove them")


def _reasoning_gym_check(task) -> None:
    """The shape of [task.options]; the dataset names and configs are checked against the library
    when the task is built (tokenflow.tasks.reasoning_gym), so validating a config imports nothing."""
    from importlib.util import find_spec

    if find_spec("reasoning_gym") is None:
        raise ValueError('task.name = "reasoning_gym" needs the reasoning-gym library: '
                         'pip install "tokenflow-rl[envs]"')
    if task.reward or task.train_path or task.eval_path:
        raise ValueError('task.name = "reasoning_gym" draws its prompts from reasoning-gym and scores them with '
                         "the dataset's own scorer; remove task.reward, task.train_path and task.eval_path")
    opts = task.options
    unknown = sorted(set(opts) - set(_RG_OPTIONS))
    if unknown:
        hint = " (the system prompt is task.system_prompt)" if "system_prompt" in unknown else ""
        raise ValueError(f"task.options: reasoning_gym takes no option {', '.join(map(repr, unknown))}{hint}; "
                         f"it takes {', '.join(_RG_OPTIONS)}")
    if ("dataset" in opts) == ("datasets" in opts):
        raise ValueError('task.name = "reasoning_gym" needs exactly one of task.options.dataset = "name" (with '
                         "task.options.config = {...}) and task.options.datasets = {name = {weight = w, "
                         "config = {...}}, ...}")
    if "dataset" in opts:
        if not isinstance(opts["dataset"], str):
            raise ValueError(f"task.options.dataset must be a reasoning-gym dataset name, not {opts['dataset']!r}")
        _rg_config_check("task.options.config", opts.get("config", {}))
    else:
        if "config" in opts:
            raise ValueError("task.options.config goes with task.options.dataset; with a mixture, give each "
                             "dataset its own: datasets = {name = {weight = w, config = {...}}}")
        if not isinstance(opts["datasets"], dict) or not opts["datasets"]:
            raise ValueError("task.options.datasets must be a non-empty table {name = {weight = w, config = {...}}}")
        for name, spec in opts["datasets"].items():
            where = f"task.options.datasets.{name}"
            if not isinstance(spec, dict) or set(spec) - {"weight", "config"}:
                raise ValueError(f"{where} must be a table with weight and/or config, not {spec!r}")
            weight = spec.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
                raise ValueError(f"{where}.weight must be a positive number, not {weight!r}")
            _rg_config_check(f"{where}.config", spec.get("config", {}))
    if opts.get("answer", "tags") not in _RG_ANSWERS:
        raise ValueError(f"task.options.answer = {opts['answer']!r} is not an answer rule; use one of "
                         f"{', '.join(_RG_ANSWERS)}")


VF_SETTINGS = {"env": "tokenflow.envs.verifiers_env:VerifiersEnv", "agent": "tokenflow.envs.verifiers_env:play"}
"""What task.name = "verifiers" is: an agent task whose examples, rubric and agent are
tokenflow's verifiers adapter (tokenflow.envs.verifiers_env); the environment is an option."""
_VF_OPTIONS = ("env", "args", "env_config", "renderer_model", "eval_size", "limit")


def _verifiers_check(task) -> None:
    from importlib.util import find_spec

    if find_spec("verifiers") is None:
        raise ValueError('task.name = "verifiers" needs the verifiers library: pip install "tokenflow-rl[envs]"')
    for key, value in VF_SETTINGS.items():
        if getattr(task, key) != value:
            raise ValueError(f'task.name = "verifiers" sets task.{key} itself; remove task.{key}')
    if task.train_path or task.eval_path:
        raise ValueError('task.name = "verifiers" takes its tasks from the verifiers environment; remove '
                         "task.train_path and task.eval_path")
    _env_settings_check(task)
    opts = task.options
    unknown = sorted(set(opts) - set(_VF_OPTIONS))
    if unknown:
        raise ValueError(f"task.options: verifiers takes no option {', '.join(map(repr, unknown))}; it takes "
                         f"{', '.join(_VF_OPTIONS)}")
    if not isinstance(opts.get("env"), str) or not opts["env"]:
        raise ValueError('task.name = "verifiers" needs task.options.env = "<taskset id or folder>" (and its '
                         "arguments as task.options.args = {...})")
    for key in ("args", "env_config"):
        if not isinstance(opts.get(key, {}), dict):
            raise ValueError(f"task.options.{key} must be a table, not {opts[key]!r}")


_A = "tokenflow.algorithms.advantages:"
ADVANTAGES.add("grpo", _A + "grpo")
ADVANTAGES.add("dr_grpo", _A + "dr_grpo", check=_dr_grpo_check)
ADVANTAGES.add("rloo", _A + "rloo")
ADVANTAGES.add("reinforce_pp", _A + "reinforce_pp", token_rewards=True, normalised=True)
ADVANTAGES.add("reinforce_pp_baseline", _A + "reinforce_pp_baseline", token_rewards=True, normalised=True)
ADVANTAGES.add("gae", _A + "gae", needs_values=True, token_rewards=True)

_L = "tokenflow.algorithms.losses:"
POLICY_LOSSES.add("ppo", _L + "ppo_clip", zero_at_zero_advantage=True)
POLICY_LOSSES.add("gspo", _L + "gspo", zero_at_zero_advantage=True, sequence_ratio=True)
POLICY_LOSSES.add("cispo", _L + "cispo", zero_at_zero_advantage=True, clips_weight=True)

_G = "tokenflow.algorithms.aggregation:"
AGGREGATIONS.add("token_mean", _G + "token_mean")
AGGREGATIONS.add("seq_mean_token_mean", _G + "seq_mean_token_mean")
AGGREGATIONS.add("seq_mean_token_sum", _G + "seq_mean_token_sum")
AGGREGATIONS.add("dr_grpo_constant", _G + "dr_grpo_constant", check=_dr_grpo_constant_check)

TASKS.add("arithmetic", "tokenflow.tasks.arithmetic:from_config", check=_no_options)
TASKS.add("dataset", "tokenflow.envs.task:from_dataset_config", check=_dataset_check)
TASKS.add("env", "tokenflow.envs.task:from_config", check=_env_check)
TASKS.add("reasoning_gym", "tokenflow.tasks.reasoning_gym:from_config", check=_reasoning_gym_check,
          settings={"chat_template": True, "system_prompt": RG_SYSTEM_PROMPT})  # the `envs` extra
TASKS.add("verifiers", "tokenflow.envs.task:from_config", check=_verifiers_check,
          settings=VF_SETTINGS)  # the `verifiers` extra

SCORERS.add("arithmetic", "tokenflow.tasks.arithmetic:arithmetic_reward")
SCORERS.add("math_verify", "tokenflow.scoring.math_reward:math_verify_reward")  # the `math` extra


def token_level_estimators() -> list[str]:
    """Estimators that take per-token rewards (their registry entry declares ``token_rewards``)."""
    return [n for n in ADVANTAGES.names() if ADVANTAGES.props(n)["token_rewards"]]

"""Environment tasks: where the examples of ``task.env`` episodes come from.

* ``task.name = "env"``: from the environment class itself, which defines
  ``train_example(index, seed) -> dict`` and ``eval_examples(seed, n) -> list[dict]`` (so a
  built-in environment needs no file; ``task.seed`` and ``task.num_eval`` apply).
* ``task.name = "dataset"`` with ``task.env``: the rows of ``task.train_path`` (and
  ``task.eval_path``, or the held-out ``task.eval_fraction``), each handed to ``reset`` as is.

``[task.options]`` go by keyword to the class's constructor and example methods, each getting
the keys its signature names (`tokenflow.envs.loading.options_for`).

Either way the episodes are scored by the environment (``Environment.rubric`` and step rewards),
so ``task.reward`` must not be set, and the opening messages come from ``reset``, so neither
does ``task.system_prompt``. A prompt's ``text`` is the example's ``task.prompt_field`` when it is
a string (for logs), else empty; the runtime renders ``reset``'s messages instead.
"""

from __future__ import annotations

from tokenflow.envs.base import Environment
from tokenflow.envs.loading import EnvironmentLoadError, load_environment, make_environment, options_for
from tokenflow.tasks.base import Prompt


class EnvTask:
    """A `tokenflow.tasks.base.Task` whose prompts are examples for an environment's episodes."""

    reward_fn = None
    """None: an environment's episodes are scored by its rubric, not a per-completion function."""
    reward_spec = None

    def __init__(self, env_spec: str, source=None, *, seed: int = 0, num_eval: int = 256,
                 prompt_field: str = "prompt", options: dict | None = None) -> None:
        """``source`` is a task whose prompts' examples are the rows (a `DatasetTask`); None draws
        them from the environment class. ``options`` (``[task.options]``) go to the class by
        keyword (`tokenflow.envs.loading`)."""
        self.env_spec = env_spec
        self.options = dict(options or {})
        self.env_cls: type[Environment] = load_environment(env_spec, self.options, examples=source is None)
        self.name = getattr(source, "name", None) or self.env_cls.__name__
        self.source = source
        self.seed = seed
        self.num_eval = num_eval
        self.prompt_field = prompt_field
        if source is None:
            missing = [m for m in ("train_example", "eval_examples") if not callable(getattr(self.env_cls, m, None))]
            if missing:
                raise EnvironmentLoadError(
                    f"{env_spec} does not generate examples (no {' or '.join(missing)} classmethod); define "
                    'train_example(index, seed) and eval_examples(seed, n), or use task.name = "dataset" '
                    "with task.train_path")
        self._eval: list[Prompt] | None = None

    def make_env(self) -> Environment:
        """One environment instance, built with its options."""
        return make_environment(self.env_cls, self.options)

    def _example_options(self, method: str) -> dict:
        return options_for(getattr(self.env_cls, method), self.options, skip=2)

    def _prompt(self, index: int, example: dict) -> Prompt:
        text = example.get(self.prompt_field)
        return Prompt(id=index, text=text if isinstance(text, str) else "", example=example)

    def train_prompt(self, index: int) -> Prompt:
        if self.source is not None:
            return self.source.train_prompt(index)
        return self._prompt(index, self.env_cls.train_example(index, self.seed,
                                                              **self._example_options("train_example")))

    def eval_prompts(self) -> list[Prompt]:
        if self.source is not None:
            return self.source.eval_prompts()
        if self._eval is None:
            examples = self.env_cls.eval_examples(self.seed, self.num_eval, **self._example_options("eval_examples"))
            self._eval = [self._prompt(i, ex) for i, ex in enumerate(examples)]
        return self._eval

    def num_train_prompts(self) -> int | None:
        return self.source.num_train_prompts() if self.source is not None else None


def from_config(cfg) -> EnvTask:
    """The registered factory (``task.name = "env"``)."""
    return EnvTask(cfg.env, seed=cfg.seed, num_eval=cfg.num_eval, prompt_field=cfg.prompt_field,
                   options=cfg.options)


def from_dataset_config(cfg):
    """The registered factory of ``task.name = "dataset"``: a file of prompts and a reward
    (`tokenflow.tasks.dataset`), or with ``task.env`` set an environment whose examples are the
    file's rows. It lives here, above both, so that the dataset task never imports environments."""
    from tokenflow.tasks import dataset

    if not getattr(cfg, "env", None):
        return dataset.from_config(cfg)
    rows = dataset.DatasetTask(cfg.train_path, None, eval_path=cfg.eval_path, eval_fraction=cfg.eval_fraction,
                               prompt_field=cfg.prompt_field, seed=cfg.seed, require_prompt=False)
    return EnvTask(cfg.env, rows, seed=cfg.seed, num_eval=cfg.num_eval, prompt_field=cfg.prompt_field,
                   options=cfg.options)

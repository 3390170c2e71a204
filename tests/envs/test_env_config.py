"""task.env: loading the class, the config's refusals, and where an environment's examples come from."""

from __future__ import annotations

import json
import textwrap

import pytest

from tokenflow.config.loading import ConfigError, load_config
from tokenflow.config.root import TrainConfig
from tokenflow.envs import EnvironmentLoadError, load_environment
from tokenflow.envs.calculator import CalculatorEnv
from tokenflow.tasks import build_task

CALC = "tokenflow.envs.calculator:CalculatorEnv"


@pytest.fixture()
def env_file(tmp_path):
    f = tmp_path / "my_envs.py"
    f.write_text(textwrap.dedent("""
        from tokenflow.envs import Environment, StepResult, ToolEnvironment

        class Echo(Environment):
            async def step(self, assistant_message):
                return StepResult([], 1.0, True, {})

        class NoStep(Environment):
            pass

        class NeedsArgs(ToolEnvironment):
            def __init__(self, url):
                super().__init__()

        class NotAnEnv:
            pass

        answer = 42
    """))
    return f


def test_load_environment_by_module_and_by_file(env_file):
    assert load_environment(CALC) is CalculatorEnv
    echo = load_environment(f"{env_file}:Echo")
    assert echo.__name__ == "Echo" and echo.__module__ == "my_envs"  # importable by name in workers


@pytest.mark.parametrize("name,needle", [
    ("NoStep", "does not implement step"),
    ("NeedsArgs", "needs argument(s) url"),
    ("NotAnEnv", "not a tokenflow.envs.Environment"),
    ("answer", "is an int, not a class"),
    ("Ecko", "has no class 'Ecko' (did you mean 'Echo'?)"),
])
def test_load_environment_refuses_what_is_not_a_usable_environment(env_file, name, needle):
    with pytest.raises(EnvironmentLoadError) as err:
        load_environment(f"{env_file}:{name}")
    assert needle in str(err.value)


def test_load_environment_names_what_cannot_be_imported(tmp_path):
    with pytest.raises(EnvironmentLoadError, match="cannot import environment module 'no_such_pkg.envs'.*task.env"):
        load_environment("no_such_pkg.envs:Env")
    with pytest.raises(EnvironmentLoadError, match="environment file .* does not exist; check task.env"):
        load_environment(f"{tmp_path}/missing.py:Env")
    broken = tmp_path / "broken_env.py"
    broken.write_text("import nothing_here\n")
    with pytest.raises(EnvironmentLoadError, match="fails to import .*ModuleNotFoundError"):
        load_environment(f"{broken}:Env")
    with pytest.raises(EnvironmentLoadError, match="must be 'module:Class'"):
        load_environment("CalculatorEnv")


@pytest.mark.parametrize("overrides,needle", [
    (["--task.env", CALC], 'task.env is set but task.name = "arithmetic"'),
    (["--task.name", "env"], 'task.name = "env" needs task.env'),
    (["--task.name", "env", "--task.env", CALC, "--task.reward", "m:f"], "task.env and task.reward are both set"),
    (["--task.name", "env", "--task.env", CALC, "--task.train_path", "x.jsonl"], 'use task.name = "dataset"'),
    (["--task.name", "env", "--task.env", CALC, "--task.system_prompt", "Be brief"], "task.system_prompt does not apply"),
    (["--task.name", "env", "--task.env", "CalculatorEnv"], "must be 'module:Class'"),
    (["--task.name", "dataset", "--task.train_path", "x.jsonl", "--task.env", CALC, "--task.reward", "m:f"],
     "task.env and task.reward are both set"),
])
def test_conflicting_settings_are_refused_at_start(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(TrainConfig, None, overrides)


def test_env_task_draws_examples_from_the_environment_class():
    cfg = load_config(TrainConfig, None, ["--task.name", "env", "--task.env", CALC, "--task.num_eval", "64"])
    task = build_task(cfg.task)
    assert task.env_cls is CalculatorEnv and task.reward_fn is None and task.num_train_prompts() is None
    first = task.train_prompt(5)
    assert first == task.train_prompt(5) and first.id == 5  # resume relies on it
    assert first.text == first.example["prompt"]
    held_out = task.eval_prompts()
    assert len(held_out) == 64
    train = {task.train_prompt(i).text for i in range(3000)}
    assert not train & {p.text for p in held_out}


def test_dataset_task_with_an_env_hands_the_rows_to_reset(tmp_path, env_file):
    rows = tmp_path / "episodes.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "level": i}) + "\n"
                            for i in range(10)))
    cfg = load_config(TrainConfig, None, ["--task.name", "dataset", "--task.train_path", str(rows),
                                          "--task.env", f"{env_file}:Echo", "--task.eval_fraction", "0.2"])
    task = build_task(cfg.task)
    assert task.env_cls.__name__ == "Echo" and task.reward_fn is None
    assert task.num_train_prompts() == 8 and len(task.eval_prompts()) == 2
    example = task.train_prompt(0).example
    assert "level" in example and task.env_cls().reset(example)[0][0]["role"] == "user"


def test_an_env_without_example_generators_needs_a_file(env_file):
    cfg = load_config(TrainConfig, None, ["--task.name", "env", "--task.env", f"{env_file}:Echo"])
    with pytest.raises(EnvironmentLoadError, match="does not generate examples.*train_example"):
        build_task(cfg.task)


OPTIONS_ENV = textwrap.dedent("""
    from tokenflow.envs.calculator import CalculatorEnv, example_of

    class Graded(CalculatorEnv):
        '''One class for several datasets: [task.options] pick the questions and a tag.'''

        def __init__(self, tag: str = "none"):
            super().__init__()
            self.tag = tag

        def reset(self, example):
            self.state["tag"] = self.tag
            return super().reset(example)

        @classmethod
        def train_example(cls, index, seed, products_only: bool = False):
            ex = super().train_example(index, seed)
            return example_of(ex["a"], ex["b"], None) if products_only else ex

        @classmethod
        def eval_examples(cls, seed, n, products_only: bool = False):
            out = super().eval_examples(seed, n)
            return [example_of(e["a"], e["b"], None) for e in out] if products_only else out
""")


@pytest.fixture()
def options_env(tmp_path):
    f = tmp_path / "graded_env.py"
    f.write_text(OPTIONS_ENV)
    return f"{f}:Graded"


def test_task_options_reach_the_constructor_and_the_example_methods(options_env):
    cfg = load_config(TrainConfig, None, ["--task.name", "env", "--task.env", options_env, "--task.num_eval", "8",
                                          "--task.options.products_only", "true", "--task.options.tag", "gsm"])
    task = build_task(cfg.task)
    assert all(task.train_prompt(i).example["c"] is None for i in range(50))
    assert all(p.example["c"] is None for p in task.eval_prompts())
    env = task.make_env()
    assert env.tag == "gsm"
    env.reset(task.train_prompt(0).example)
    assert env.state["tag"] == "gsm"
    plain = build_task(load_config(TrainConfig, None, ["--task.name", "env", "--task.env", options_env]).task)
    assert any(plain.train_prompt(i).example["c"] is not None for i in range(50))  # defaults without options
    assert plain.make_env().tag == "none"


def test_an_option_no_part_of_the_environment_takes_is_refused_by_name(options_env, env_file, tmp_path):
    cfg = load_config(TrainConfig, None, ["--task.name", "env", "--task.env", options_env,
                                          "--task.options.levels", "3"])
    with pytest.raises(EnvironmentLoadError, match=r"task.options.levels: the environment .*Graded takes no "
                                                    r"option 'levels'.*Graded.__init__, Graded.train_example"):
        build_task(cfg.task)
    with pytest.raises(EnvironmentLoadError, match=r"task.options.url: .*CalculatorEnv takes no option 'url'"):
        build_task(load_config(TrainConfig, None, ["--task.name", "env", "--task.env", CALC,
                                                   "--task.options.url", "x"]).task)
    # From a file, examples are rows: an option only the example methods take is unused, so refused.
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "12*34", "a": 12, "b": 34, "c": None, "answer": 408}) + "\n")
    cfg = load_config(TrainConfig, None, ["--task.name", "dataset", "--task.train_path", str(rows), "--task.env",
                                          options_env, "--task.options.products_only", "true"])
    with pytest.raises(EnvironmentLoadError, match=r"task.options.products_only: .*none of Graded.__init__ has"):
        build_task(cfg.task)
    # A required constructor argument is an option to set.
    assert load_environment(f"{env_file}:NeedsArgs", {"url": "http://x"}).__name__ == "NeedsArgs"
    with pytest.raises(EnvironmentLoadError, match=r"needs argument\(s\) url.*set task.options.url"):
        load_environment(f"{env_file}:NeedsArgs")
    # Other built-in tasks still take no options.
    with pytest.raises(ConfigError, match=r"task.options \(tag\) is for plugin tasks"):
        load_config(TrainConfig, None, ["--task.options.tag", "x"])

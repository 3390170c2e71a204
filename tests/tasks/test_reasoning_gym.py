"""task.name = "reasoning_gym": a resume-exact prompt stream, a held-out split never trained on, the
dataset's own scorer behind an answer rule, mixtures by weight, options refused with the fix."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("reasoning_gym")

from tokenflow.config.loading import load_config  # noqa: E402
from tokenflow.config.root import TrainConfig  # noqa: E402
from tokenflow.errors import ConfigError  # noqa: E402
from tokenflow.registry import _RG_ANSWERS  # noqa: E402
from tokenflow.tasks import build_task  # noqa: E402
from tokenflow.tasks.reasoning_gym import (  # noqa: E402
    ANSWER_RULES,
    ReasoningGymError,
    ReasoningGymTask,
    extract_answer,
    reasoning_gym_reward,
)

SMALL_SUMS = {"dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                         "max_digits": 1}}
TINY_LEGS = {"dataset": "leg_counting", "config": {"min_animals": 1, "max_animals": 1, "min_instances": 1,
                                                   "max_instances": 3}}


def task_config(options: dict, *extra: str):
    return load_config(TrainConfig, None, {"task": {"name": "reasoning_gym", "options": options},
                                           **dict(zip(extra[::2], extra[1::2]))}).task


def test_the_prompt_at_an_index_is_the_same_in_a_fresh_task_and_in_any_order():
    a = ReasoningGymTask(SMALL_SUMS, seed=5, num_eval=16)
    b = ReasoningGymTask(SMALL_SUMS, seed=5, num_eval=16)
    forward = [a.train_prompt(i) for i in range(0, 2500, 7)]   # crosses chunk boundaries
    backward = [b.train_prompt(i) for i in reversed(range(0, 2500, 7))][::-1]  # a resumed run's order
    assert forward == backward and forward[3].id == 21
    assert [p.text for p in forward] != [p.text for p in
                                        (ReasoningGymTask(SMALL_SUMS, seed=6, num_eval=16).train_prompt(i)
                                         for i in range(0, 2500, 7))]


def test_held_out_questions_are_distinct_and_never_drawn_for_training():
    # One animal, 1-3 of it: about 110 distinct questions, so the held-out 32 come up in the
    # training stream again and again, and must be redrawn.
    t = ReasoningGymTask(TINY_LEGS, seed=0, num_eval=32)
    held = [p.text for p in t.eval_prompts()]
    assert len(held) == len(set(held)) == 32 and [p.id for p in t.eval_prompts()] == list(range(32))
    trained = {t.train_prompt(i).text for i in range(2000)}
    assert not trained & set(held) and len(trained) > 50


def test_a_space_too_small_for_the_held_out_split_is_an_error_naming_the_fix():
    with pytest.raises(ReasoningGymError, match="lower task.num_eval"):
        ReasoningGymTask(TINY_LEGS, num_eval=500).eval_prompts()


def test_the_reward_is_the_datasets_score_of_the_tagged_answer():
    t = ReasoningGymTask({"dataset": "basic_arithmetic"}, num_eval=4)
    p = t.train_prompt(0)
    right = p.example["entry"]["answer"]
    assert reasoning_gym_reward(p.text, f"so <answer> {right} </answer>", p.example) == \
        {"reward": 1.0, "format": 1.0, "correct": 1.0}
    wrong = str(int(right) + 1)
    assert reasoning_gym_reward(p.text, f"<answer>{wrong}</answer>", p.example) == \
        {"reward": 0.0, "format": 1.0, "correct": 0.0}
    assert reasoning_gym_reward(p.text, f"the answer is {right}", p.example)["format"] == 0.0
    # the last tagged answer counts, as reasoning-gym reads it
    assert reasoning_gym_reward(p.text, f"<answer>{wrong}</answer> no: <answer>{right}</answer>",
                                p.example)["correct"] == 1.0


def test_answer_rules():
    text = "work\n\\boxed{\\frac{1}{2}} then <answer>7</answer>\n  42  \n"
    assert extract_answer(text, "tags") == "7"
    assert extract_answer(text, "boxed") == "\\frac{1}{2}"
    assert extract_answer(text, "last_line") == "42"
    assert extract_answer(text, "whole") == text.strip()
    assert extract_answer(text, "last_number") == "42" and extract_answer("so x = -3.5.", "last_number") == "-3.5"
    assert extract_answer("no answer", "tags") is None and extract_answer("\\boxed{1", "boxed") is None
    assert extract_answer(" \n", "whole") is None and extract_answer("", "last_line") is None
    assert extract_answer("no digits", "last_number") is None
    assert set(ANSWER_RULES) == set(_RG_ANSWERS)  # the config check knows every rule
    t = ReasoningGymTask({**SMALL_SUMS, "answer": "last_line"}, num_eval=4)
    p = t.train_prompt(0)
    assert reasoning_gym_reward(p.text, f"thinking\n{p.example['entry']['answer']}", p.example)["reward"] == 1.0


def test_a_mixture_draws_each_dataset_by_its_weight():
    n, share = 4000, 0.25
    t = ReasoningGymTask({"datasets": {"basic_arithmetic": {"weight": 1}, "leg_counting": {"weight": 3}}},
                         num_eval=8)
    drawn = [t.train_prompt(i).example["dataset"] for i in range(n)]
    # Each draw is basic_arithmetic with probability 1/4: the count is binomial, sd = sqrt(n p (1-p)).
    tolerance = 4 * math.sqrt(share * (1 - share) / n)
    assert abs(drawn.count("basic_arithmetic") / n - share) < tolerance
    assert set(drawn) == {"basic_arithmetic", "leg_counting"}
    assert {p.example["dataset"] for p in t.eval_prompts()} <= set(drawn)


def test_the_config_defaults_to_the_chat_template_and_the_answer_format_as_system_prompt():
    cfg = task_config(SMALL_SUMS)
    assert cfg.chat_template and "<answer>" in cfg.system_prompt
    own = load_config(TrainConfig, None, {"task": {"name": "reasoning_gym", "options": SMALL_SUMS,
                                                   "system_prompt": "Be brief."}}).task
    assert own.system_prompt == "Be brief." and own.chat_template
    # without a chat template there is no system message: the instruction goes before the question
    plain = load_config(TrainConfig, None, {"task": {"name": "reasoning_gym", "options": SMALL_SUMS,
                                                     "chat_template": False}}).task
    prompt = build_task(plain).train_prompt(0)
    assert prompt.text == plain.system_prompt + "\n\n" + prompt.example["entry"]["question"]
    assert load_config(TrainConfig, None, {}).task.system_prompt is None  # other tasks: unchanged


@pytest.mark.parametrize("options, message", [
    ({}, "exactly one of task.options.dataset"),
    ({"dataset": "leg_counting", "datasets": {"chain_sum": {}}}, "exactly one of"),
    ({"dataset": "leg_counting", "system_prompt": "x"}, "is task.system_prompt"),
    ({"dataset": "leg_counting", "config": {"seed": 3}}, "seeded by task.seed"),
    ({"dataset": "leg_counting", "answer": "xml"}, "use one of tags, last_line"),
    ({"datasets": {"leg_counting": {"weight": 0}}}, "positive number"),
    ({"datasets": {"leg_counting": {"weigth": 2}}}, "weight and/or config"),
    ({"datasets": {"leg_counting": {}}, "config": {}}, "give each dataset its own"),
])
def test_bad_options_are_refused_when_the_config_loads(options, message):
    with pytest.raises(ConfigError, match=message):
        task_config(options)


def test_unknown_datasets_and_configs_are_refused_when_the_task_is_built():
    with pytest.raises(ReasoningGymError, match="no dataset 'leg_count'.*did you mean 'leg_counting'"):
        build_task(task_config({"dataset": "leg_count"}))
    with pytest.raises(ReasoningGymError, match="config of dataset 'leg_counting' is refused.*takes .*max_animals"):
        build_task(task_config({"dataset": "leg_counting", "config": {"max_animal": 3}}))
    with pytest.raises(ReasoningGymError, match="'chain_sum' is invalid"):
        build_task(task_config({"datasets": {"chain_sum": {"config": {"min_terms": 5, "max_terms": 2}}}}))


def test_a_missing_library_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "reasoning_gym" else real(name, *a))
    with pytest.raises(ConfigError, match=r'pip install "tokenflow-rl\[envs\]"'):
        task_config(SMALL_SUMS)


@pytest.mark.slow
def test_a_short_run_trains_on_a_reasoning_gym_dataset(tmp_path):
    from tests.runtime.runtime_testlib import small_config, step_rows
    from tokenflow.model_store import resolve_model_path
    from tokenflow.runtime.launch import train

    # The shipped tool model: a chat template and a tokenizer that spells letters. It writes no
    # answer tags, so the whole completion is the answer: every sample goes through the dataset's
    # scorer in the scorer processes.
    cfg = small_config("--model.path", resolve_model_path("default-tool"), "--task.name", "reasoning_gym",
                       "--task.options", '{dataset = "basic_arithmetic", config = {min_terms = 2, max_terms = 2, '
                       'max_digits = 1}, answer = "whole"}', "--task.num_eval", "8", "--run.steps", "2",
                       "--run.checkpoint_every", "0", "--run.eval_limit", "8")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    rows = step_rows(tmp_path / "run")
    assert len(rows) == 2 and all(r["reward/failed_frac"] == 0 and "reward/correct_mean" in r for r in rows)
    assert any(r["reward/format_mean"] > 0 for r in rows)


def test_tokenflow_eval_refuses_an_unknown_dataset_in_one_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "eval", "default-tool", "--task.name",
                          "reasoning_gym", "--task.options", '{dataset = "leg_count"}'],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "did you mean 'leg_counting'" in out.stderr
    assert "Traceback" not in out.stderr

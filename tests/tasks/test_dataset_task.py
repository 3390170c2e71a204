"""A user's task: a local JSONL/Parquet file, a reward named as module:function, clear errors."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tokenflow.tasks.dataset import DatasetError, DatasetTask
from tokenflow.tasks.reward_loading import RewardFunctionError, check_picklable, load_reward_fn


@pytest.fixture()
def reward_file(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(textwrap.dedent("""
        def exact(prompt, completion, example):
            return {"reward": float(completion.strip() == example["answer"]), "length": len(completion)}
    """))
    return f


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_task_streams_epochs_and_holds_out_eval(tmp_path, reward_file):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    task = DatasetTask(str(data), f"{reward_file}:exact", eval_fraction=0.25, seed=1)
    assert len(task.eval_prompts()) == 5
    assert task.num_train_prompts() == 15
    epoch0 = [task.train_prompt(i).text for i in range(15)]
    epoch1 = [task.train_prompt(15 + i).text for i in range(15)]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    assert not set(epoch0) & {p.text for p in task.eval_prompts()}
    p = task.train_prompt(3)
    assert task.reward_fn(p.text, p.example["answer"], p.example)["reward"] == 1.0


@pytest.mark.slow
def test_parquet_task(tmp_path, reward_file):
    import datasets

    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list([{"question": f"q{i}", "answer": str(i)} for i in range(6)]).to_parquet(str(path))
    task = DatasetTask(str(path), f"{reward_file}:exact", eval_fraction=0.0, prompt_field="question")
    assert task.num_train_prompts() == 6


def test_malformed_rows_are_named(tmp_path, reward_file):
    data = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"prompt": ""}, {"text": "no prompt"}])
    with pytest.raises(DatasetError, match=r"2 row\(s\).*lines 2, 3"):
        DatasetTask(str(data), f"{reward_file}:exact")


def test_bad_reward_specs_are_refused(tmp_path, reward_file):
    with pytest.raises(RewardFunctionError, match="module:function"):
        load_reward_fn("no_colon")
    with pytest.raises(RewardFunctionError, match="has no function"):
        load_reward_fn(f"{reward_file}:missing")
    with pytest.raises(RewardFunctionError, match="lambda"):
        check_picklable(lambda p, c, e: 1.0)


def test_a_reward_file_puts_its_folder_on_the_path_once_and_a_broken_one_leaves_none(tmp_path, reward_file, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    load_reward_fn(f"{reward_file}:exact")
    load_reward_fn(f"{reward_file}:exact")
    assert sys.path == [str(reward_file.parent)] + before  # workers import it by name, from there
    broken = tmp_path / "elsewhere" / "broken_reward.py"
    broken.parent.mkdir()
    broken.write_text("def score(:\n")
    with pytest.raises(RewardFunctionError, match="fails to import"):
        load_reward_fn(f"{broken}:score")
    assert str(broken.parent) not in sys.path and len(sys.path) == len(before) + 1

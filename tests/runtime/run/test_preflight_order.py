"""The preflight's order (`tokenflow.runtime.launch.prepare`): the task and its reward function
need no tokenizer, so they are checked before the tokenizer is loaded (which waits for the fork
server's imports, seconds on a laptop): a bad dataset or reward is reported at once."""

from __future__ import annotations

import pytest

from tests.runtime.runtime_testlib import small_config
from tokenflow.errors import InputError
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime import launch
from tokenflow.runtime.run import preflight
from tokenflow.tasks.dataset import DatasetError
from tokenflow.tasks.reward_loading import RewardFunctionError


@pytest.fixture
def no_tokenizer(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded before the task and reward were checked")

    monkeypatch.setattr(preflight, "load_tokenizer", refuse)


def test_an_empty_dataset_is_reported_before_the_tokenizer_loads(tmp_path, no_tokenizer):
    (tmp_path / "empty.jsonl").write_text("")
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(tmp_path / "empty.jsonl"),
                       "--task.reward", "json:loads")
    with pytest.raises(DatasetError, match="holds no rows"):
        launch.prepare(cfg, resolve_model_path(cfg.model.path))


def test_a_reward_that_fails_to_import_is_reported_before_the_tokenizer_loads(tmp_path, no_tokenizer):
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "reward.py").write_text("import no_such_module_for_tokenflow_tests\n")
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(tmp_path / "data.jsonl"),
                       "--task.reward", f"{tmp_path / 'reward.py'}:reward")
    with pytest.raises(RewardFunctionError, match="fails to import"):
        launch.prepare(cfg, resolve_model_path(cfg.model.path))


def test_a_reward_with_the_wrong_parameters_is_reported_before_the_tokenizer_loads(tmp_path, no_tokenizer):
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "reward.py").write_text("def reward(prompt):\n    return 1.0\n")  # loads; the call check refuses it
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(tmp_path / "data.jsonl"),
                       "--task.reward", f"{tmp_path / 'reward.py'}:reward")
    with pytest.raises(InputError, match=r"cannot be called as fn\(prompt, completion, example\)"):
        launch.prepare(cfg, resolve_model_path(cfg.model.path))

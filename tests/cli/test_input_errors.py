"""Bad input ends `tokenflow train` with one line naming the problem and the fix, exit status 2,
no traceback, and no run folder left behind (checked before any worker starts)."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from tokenflow.cli.main import main
from tokenflow.model_store import shipped_model_path


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "rewards.py").write_text(textwrap.dedent("""
        def exact(prompt, completion, example):
            return float(completion.strip() == example["answer"])
        def as_text(prompt, completion, example):
            return "1.0"
        def two_args(prompt, completion):
            return 0.0
        def always_raises(prompt, completion, example):
            raise RuntimeError("broken reward")
        NOT_A_FUNCTION = 3
    """))
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(12)]
    (tmp_path / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def train_error(tmp_path, capsys, *args: str) -> str:
    run = tmp_path / "run"
    code = main(["train", "--output-dir", str(run), "--metrics.progress", "false", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert not run.exists(), "bad input must not leave a run folder behind"
    return lines[0]


def dataset(files, data, reward="exact"):
    return ["--task.name", "dataset", "--task.train_path", str(data), "--task.reward", f"{files / 'rewards.py'}:{reward}"]


def test_prompt_field_missing(files, capsys):
    msg = train_error(files, capsys, *dataset(files, files / "good.jsonl"), "--task.prompt_field", "question")
    assert "'question'" in msg and "task.prompt_field" in msg


def test_reward_file_without_the_function_suggests_one(files, capsys):
    msg = train_error(files, capsys, *dataset(files, files / "good.jsonl", reward="exactt"))
    assert "has no function 'exactt'" in msg and "did you mean 'exact'?" in msg


def test_reward_that_is_not_a_function(files, capsys):
    msg = train_error(files, capsys, *dataset(files, files / "good.jsonl", reward="NOT_A_FUNCTION"))
    assert "is an int, not a function" in msg


def test_malformed_json_line_names_its_line_and_the_detail(files, capsys):
    lines = (files / "good.jsonl").read_text().splitlines()
    lines[4] = '{"prompt": "1+1=", "answer": }'
    (files / "bad.jsonl").write_text("\n".join(lines) + "\n")
    msg = train_error(files, capsys, *dataset(files, files / "bad.jsonl"))
    assert "line 5 is not valid JSON" in msg and "Expecting value" in msg


def test_non_utf8_line(files, capsys):
    (files / "latin1.jsonl").write_bytes((files / "good.jsonl").read_bytes() + '{"prompt": "é"}\n'.encode("latin-1"))
    msg = train_error(files, capsys, *dataset(files, files / "latin1.jsonl"))
    assert "line 13 is not UTF-8" in msg


def test_empty_data_file(files, capsys):
    (files / "empty.jsonl").write_text("")
    msg = train_error(files, capsys, *dataset(files, files / "empty.jsonl"))
    assert "holds no rows" in msg and "'prompt'" in msg


def test_empty_model_folder_is_named_not_sentencepiece(files, capsys):
    (files / "model").mkdir()
    msg = train_error(files, capsys, "--model.path", str(files / "model"))
    assert "holds no config.json" in msg and "sentencepiece" not in msg


def test_model_folder_without_weights_or_with_an_unsupported_architecture(files, capsys):
    model = files / "model"
    shutil.copytree(shipped_model_path("default"), model)
    (model / "model.safetensors").unlink()
    assert "holds no weights" in train_error(files, capsys, "--model.path", str(model))
    shutil.copy(shipped_model_path("default") / "model.safetensors", model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (model / "config.json").write_text(json.dumps(cfg))
    msg = train_error(files, capsys, "--model.path", str(model))
    assert "unsupported architecture" in msg and "LlamaForCausalLM" in msg


def test_prompt_characters_outside_the_vocabulary_are_named_with_their_row(files, capsys):
    lines = (files / "good.jsonl").read_text().splitlines()
    lines[6] = json.dumps({"prompt": "what is 2+2?", "answer": "4"})
    (files / "words.jsonl").write_text("\n".join(lines) + "\n")
    msg = train_error(files, capsys, *dataset(files, files / "words.jsonl"))
    assert "cannot encode" in msg and "'?'" in msg and "'w'" in msg and "words.jsonl line 7" in msg


def test_reward_returning_a_string_is_refused_at_start(files, capsys):
    msg = train_error(files, capsys, *dataset(files, files / "good.jsonl", reward="as_text"))
    assert "str '1.0'" in msg and "must return a float" in msg


def test_reward_with_the_wrong_signature_is_refused_at_start(files, capsys):
    msg = train_error(files, capsys, *dataset(files, files / "good.jsonl", reward="two_args"))
    assert "fn(prompt, completion, example)" in msg


def test_reward_whose_library_is_missing_is_refused_at_start(files, capsys):
    """As task.reward = "math_verify" without the `math` extra: the import fails inside the call."""
    (files / "needs_lib.py").write_text(textwrap.dedent("""
        def reward(prompt, completion, example):
            raise ImportError('needs the no-such-lib library: pip install "tokenflow-rl[nosuch]"')
    """))
    msg = train_error(files, capsys, "--task.name", "dataset", "--task.train_path", str(files / "good.jsonl"),
                      "--task.reward", f"{files / 'needs_lib.py'}:reward")
    assert "cannot run" in msg and 'pip install "tokenflow-rl[nosuch]"' in msg


def test_reward_module_that_does_not_import(files, capsys):
    (files / "broken.py").write_text("import no_such_module_anywhere\n")
    msg = train_error(files, capsys, "--task.name", "dataset", "--task.train_path", str(files / "good.jsonl"),
                      "--task.reward", f"{files / 'broken.py'}:reward")
    assert "fails to import" in msg and "no_such_module_anywhere" in msg

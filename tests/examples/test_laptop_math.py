"""examples/laptop_math: the shipped problems are what the script writes, every answer is its
story's arithmetic, no held-out story is trained on, and the reward reads the required form and
gives nothing for the form alone; `tokenflow eval` splits accuracy into form and substance."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokenflow.evaluation import evaluate
from tokenflow.tasks.dataset import DatasetTask

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "laptop_math"
sys.path.insert(0, str(EXAMPLE))
import make_problems  # noqa: E402
import reward  # noqa: E402

sys.path.remove(str(EXAMPLE))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_shipped_files_are_the_scripts_output(tmp_path):
    make_problems.main(["--out", str(tmp_path)])
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_bytes() == (EXAMPLE / name).read_bytes(), name


def test_every_answer_is_its_storys_arithmetic_and_held_out_stories_are_not_trained():
    train, heldout = _rows(EXAMPLE / "train.jsonl"), _rows(EXAMPLE / "heldout.jsonl")
    assert (len(train), len(heldout)) == (2000, 200)
    worked = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "groups": lambda a, b: a * b,
              "share": lambda a, b: a // b, "two_steps": lambda a, b, c: a + b - c}
    for row in train + heldout:
        story, instruction = row["prompt"].split("\n")
        assert instruction == make_problems.INSTRUCTION
        numbers = [int(x) for x in re.findall(r"\d+", story)]
        assert int(row["answer"]) == worked[row["kind"]](*numbers) >= 0, row
        if row["kind"] == "share":
            assert numbers[0] % numbers[1] == 0, row
    assert not {r["prompt"] for r in heldout} & {r["prompt"] for r in train}
    assert {r["kind"] for r in heldout} == set(worked)


@pytest.mark.parametrize("completion,fmt,correct", [
    ("4 + 3 = 7. The answer is 7.", 1, 1),
    ("the answer is: 7", 1, 1),
    ("The final answer is $7$.", 1, 1),
    ("The answer is 8. No wait, the answer is 7.", 1, 1),  # the last one counts
    ("The answer is 7. No wait, the answer is 8.", 1, 0),
    ("The answer is 70.", 1, 0),
    ("4 + 3 = 7", 0, 0),  # the right number, not in the form: no credit
    ("The answer is seven.", 0, 0),
    ("The answer is **7**.", 1, 1),  # markdown bold
    ("So, the answer is: **7**", 1, 1),
    ("The answer is 7.5.", 0, 0),  # the number ends where it ends: 7.5 is not 7
])
def test_the_reward_reads_the_last_stated_answer(completion, fmt, correct):
    got = reward.score("", completion, {"answer": "7"})
    assert got == {"reward": float(correct), "format": float(fmt), "correct": float(correct)}


@pytest.mark.parametrize("completion,answer,correct", [
    ("The answer is 1000.5", "1000", 0),  # the old pattern read 1000 here
    ("The answer is 1,000.", "1000", 1),  # a thousands separator
    ("The answer is 1,000,000.", "1000000", 1),
    ("The answer is 100.", "1000", 0),
])
def test_the_stated_number_is_read_whole(completion, answer, correct):
    assert reward.score("", completion, {"answer": answer})["correct"] == correct


def test_evaluate_splits_accuracy_into_form_and_substance():
    """Four held-out prompts, answered: correct in the form, wrong in the form, right number
    without the form, nothing. Accuracy 1/4; in the form 2/4; accuracy among those 1/2."""
    task = DatasetTask(str(EXAMPLE / "train.jsonl"), str(EXAMPLE / "reward.py") + ":score",
                       eval_path=str(EXAMPLE / "heldout.jsonl"))
    prompts = task.eval_prompts()[:4]
    answers = [p.example["answer"] for p in prompts]
    completions = [f"The answer is {answers[0]}.", f"The answer is {int(answers[1]) + 1}.", answers[2], ""]
    result = evaluate(lambda ids: completions[:len(ids)], None, task, limit=4, encode=lambda text: [0])
    assert result.accuracy == 0.25 and result.prompts == 4
    assert result.components == {"correct": 0.25, "format": 0.5}
    assert result.accuracy_given == {"correct": 1.0, "format": 0.5}


def test_tokenflow_eval_prints_the_components(tmp_path):
    """The command on the shipped model and the custom task's config (whose reward logs a format part):
    the accuracy is the share in the format times the accuracy among them, as reported."""
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "eval", "default", "--limit", "24", "--json",
                           "--config", "examples/custom_task/config.toml"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["prompts"] == 24 and set(out["components"]) == {"format"}
    fmt, given = out["components"]["format"], out["accuracy_given"]["format"]
    assert out["accuracy"] == pytest.approx(fmt * given) and fmt > 0
    # The text form prints the same numbers, one unwrapped line per component.
    text = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "eval", "default", "--limit", "24",
                           "--config", "examples/custom_task/config.toml"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert text.returncode == 0, text.stderr[-2000:]
    lines = text.stdout.splitlines()
    assert f"greedy accuracy {out['accuracy']:.4f} on 24 prompts" in lines[0]
    assert f"  format: mean {fmt:.4f}; accuracy where it is 1: {given:.4f}" in lines

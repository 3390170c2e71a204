"""samples.jsonl: a real run on the shipped model writes a few decoded samples per step (the
very rollouts the step trained on, their text the tokenizer's decoding of their tokens) and every
held-out sample of each evaluation; `tokenflow samples` prints them."""

from __future__ import annotations

import pytest

from tests.runtime.runtime_testlib import small_config
from tokenflow.cli.main import main
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.launch import train
from tokenflow.runtime.run.preflight import load_tokenizer

pytestmark = pytest.mark.slow  # a real run


@pytest.fixture(scope="module")
def run(tmp_path_factory, default_model):
    run = tmp_path_factory.mktemp("samples") / "run"
    cfg = small_config("--run.steps", "3", "--run.checkpoint_every", "0", "--run.samples_per_step", "3",
                       "--run.save_rollouts", "true")
    summary = train(cfg, run)
    return run, summary, load_tokenizer(default_model)


def test_each_step_writes_decoded_samples_of_the_rollouts_it_trained_on(run):
    run, summary, tokenizer = run
    samples = read_jsonl(run / "samples.jsonl")
    trained = {(r["step"], r["group_id"], r["sample_index"]): r for r in read_jsonl(run / "rollouts.jsonl")}
    prompts = {r["step"]: set(r["prompt_ids"]) for r in read_jsonl(run / "prompts.jsonl")}
    train_rows = [s for s in samples if s["kind"] == "train"]
    assert [s["step"] for s in train_rows] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    for s in train_rows:
        r = trained[(s["step"], s["group_id"], s["sample_index"])]
        assert s["prompt_id"] in prompts[s["step"]]
        assert s["completion"] == r["text"] == tokenizer.decode(r["completion_ids"], skip_special_tokens=True)
        assert s["prompt"] + s["completion"] == tokenizer.decode(r["prompt_ids"] + r["completion_ids"],
                                                                skip_special_tokens=True)
        assert s["reward"] == r["reward"] and s["versions"] == sorted(set(r["versions"]))
        ages = [s["step"] - 1 - v for v in r["versions"]]
        assert s["token_age_max"] == max(ages) and s["token_age_mean"] == pytest.approx(sum(ages) / len(ages))
        assert s["tokens"] == len(r["completion_ids"]) and s["components"] == {}
    # Three samples of a step's four groups come from three different groups.
    assert all(len({s["group_id"] for s in train_rows if s["step"] == k}) == 3 for k in (1, 2, 3))


def test_every_heldout_sample_of_each_evaluation_is_written(run):
    run, summary, _ = run
    evals = [s for s in read_jsonl(run / "samples.jsonl") if s["kind"] == "eval"]
    assert [s["step"] for s in evals] == [0] * 24 + [3] * 24
    for step, accuracy in ((0, summary["baseline_accuracy"]), (3, summary["final_accuracy"])):
        rows = [s for s in evals if s["step"] == step]
        assert sorted(s["prompt_id"] for s in rows) == list(range(24))
        assert sum(s["reward"] >= 0.5 for s in rows) / 24 == pytest.approx(accuracy)
        assert all("+" in s["prompt"] and s["completion"] for s in rows)


def test_tokenflow_samples_prints_them(run, capsys):
    run, _, _ = run
    samples = read_jsonl(run / "samples.jsonl")
    assert main(["samples", str(run), "--step", "2", "--kind", "train"]) == 0
    out = capsys.readouterr().out
    for s in (s for s in samples if s["step"] == 2 and s["kind"] == "train"):
        assert f"prompt {s['prompt_id']} · sample {s['sample_index']}" in out
        assert s["completion"][:20] in out.replace("\n", "")
    assert main(["samples", str(run), "--worst", "--limit", "1", "--kind", "eval"]) == 0
    worst = min((s for s in samples if s["kind"] == "eval"), key=lambda s: s["reward"])
    assert out.count("step 2 · train") == 3 and f"reward {worst['reward']:.3g}" in capsys.readouterr().out
    assert main(["samples", str(run), "--step", "99"]) == 1

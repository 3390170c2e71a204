"""samples.jsonl rows by hand: a rollout without the engine's text is decoded with the run's
tokenizer, the samples of a step are spread over its groups, and a resume drops the rows after
its checkpoint (and the evaluation at its step, which it runs again)."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from tokenflow.metrics.sinks import read_jsonl
from tokenflow.model_store import resolve_model_path
from tokenflow.rollout import Rollout
from tokenflow.runtime.run.run_dir import RunDir
from tokenflow.runtime.run.samples import SampleLog, pick
from tokenflow.tasks.base import Prompt


def test_a_rollout_without_text_is_decoded_and_its_age_counts_generated_tokens_only(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    ids = tokenizer.encode("7+5=12>12", add_special_tokens=False)
    # Two generated tokens of version 1, then environment tokens (loss mask 0) tagged version 3.
    r = Rollout([1], ids, [0.0] * len(ids), [1, 1] + [3] * (len(ids) - 2), loss_mask=[1, 1] + [0] * (len(ids) - 2),
                group_id=5, prompt_id=5, reward=1.0, rewards={"reward": 1.0, "format": 1.0})
    log = SampleLog(tmp_path / "samples.jsonl", tokenizer, per_step=1)
    log.train(4, [[r]], {5: Prompt(id=5, text="7+5=", example={})}, trainer_version=3)
    row, = read_jsonl(tmp_path / "samples.jsonl")
    assert row["completion"] == "7+5=12>12" and row["prompt"] == "7+5="
    assert (row["versions"], row["token_age_mean"], row["token_age_max"]) == ([1, 3], 2.0, 2)
    assert row["components"] == {"format": 1.0} and row["step"] == 4 and row["kind"] == "train"


def test_a_steps_samples_come_from_different_groups():
    batch = [[(g, i) for i in range(4)] for g in range(4)]
    assert pick([r for g in batch for r in g], 2) == [(0, 0), (2, 0)]
    assert pick([r for g in batch for r in g], 4) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert pick([(0, 0)], 3) == [(0, 0)] and pick([(0, 0)], 0) == []


def test_a_resume_drops_the_samples_after_its_checkpoint(tmp_path):
    run = RunDir(tmp_path).create()
    rows = [{"step": 0, "kind": "eval"}, {"step": 1, "kind": "train"}, {"step": 2, "kind": "train"},
            {"step": 2, "kind": "eval"}, {"step": 3, "kind": "train"}]
    run.samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.truncate_after(2)
    assert read_jsonl(run.samples) == rows[:3]


def test_a_first_step_whose_every_reward_is_0_shows_what_the_model_wrote(tmp_path, caplog):
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    ids = tokenizer.encode("12", add_special_tokens=False)

    def group(gid, reward):
        return [Rollout([1], ids, [0.0] * len(ids), [0] * len(ids), group_id=gid, prompt_id=gid, reward=reward,
                        rewards={"reward": reward}, text=f"I think\nit is 1{gid}") for _ in range(2)]

    log = SampleLog(tmp_path / "samples.jsonl", tokenizer, per_step=1)
    prompts = {g: Prompt(id=g, text="7+5=", example={}) for g in range(3)}
    with caplog.at_level("INFO", logger="tokenflow"):
        log.train(1, [group(0, 0.0), group(1, 0.0)], prompts, trainer_version=0)
        log.train(2, [group(0, 0.0), group(2, 1.0)], prompts, trainer_version=1)  # a reward: nothing to show
        log.train(4, [group(0, 0.0)], prompts, trainer_version=3)  # past the first steps
    shown = [r.getMessage() for r in caplog.records if "what the model wrote" in r.getMessage()]
    assert shown == [f"every reward of step 1 is 0; what the model wrote (tokenflow samples {tmp_path}):\n"
                     "  I think ⏎ it is 10"]

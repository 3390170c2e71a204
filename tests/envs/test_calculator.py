"""CalculatorEnv played through play_reference_episodes, the warm-start rows, and the shipped tool model."""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path

import pytest

from tokenflow.envs import ChatBridge, play_reference_episodes
from tokenflow.envs.calculator import CalculatorEnv, example_of
from tokenflow.shipped_models import make_tool_model

TOOL_MODEL = Path(str(resources.files("tokenflow") / "assets" / "tool_model"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tool_model.build_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


def scripted(tokenizer, turns: list[str]):
    """A ``generate`` for one episode that writes ``turns`` in order, each ending with the turn end."""
    remaining = list(turns)

    def generate(prompts, stop):
        assert len(prompts) == 1
        return [tokenizer.encode(remaining.pop(0), add_special_tokens=False) + [stop[0]]]

    return generate


def play(tokenizer, example, turns):
    (traj,) = asyncio.run(play_reference_episodes(CalculatorEnv, [example], tokenizer, scripted(tokenizer, turns)))
    return traj, CalculatorEnv.rubric.score([traj.episode])[0]


def test_tool_calls_then_the_answer_earn_the_reward(tokenizer):
    traj, score = play(tokenizer, example_of(47, 83, 29), ["mul(47,83)", "add(3901,29)", "3930"])
    assert score == {"correct": 1.0, "tool_calls": 2.0, "malformed": 0.0, "reward": 1.0}
    ep = traj.episode
    assert ep.turns == 3 and not ep.truncated
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert ep.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00000", "type": "function", "function": {"name": "mul", "arguments": {"a": 47, "b": 83}}}]}
    assert ep.messages[4]["content"] == "3930"
    text = tokenizer.decode(traj.prompt_ids + traj.completion_ids)
    assert text == ("<bos><tools>add(a,b) mul(a,b)<eot><user>47*83+29<eot><assistant>mul(47,83)<eot><tool>3901<eot>"
                    "<assistant>add(3901,29)<eot><tool>3930<eot><assistant>3930<eot>")
    model = tokenizer.decode([t for t, m in zip(traj.completion_ids, traj.loss_mask) if m])
    assert model == "mul(47,83)<eot>add(3901,29)<eot>3930<eot>"
    # The ids are the template's rendering of the conversation.
    assert traj.prompt_ids + traj.completion_ids == ChatBridge(tokenizer, CalculatorEnv.tools).render_ids(
        ep.messages, add_generation_prompt=False)


def test_forgetting_the_addition_loses_the_reward_and_bad_calls_are_counted(tokenizer):
    _, slip = play(tokenizer, example_of(47, 83, 29), ["mul(47,83)", "3901"])
    assert slip["reward"] == 0.0 and slip["tool_calls"] == 1.0
    traj, bad = play(tokenizer, example_of(12, 10, None), ["mul(12,", "sub(1,2)", "mul(12,10)", "120"])
    assert bad["reward"] == 1.0 and bad["malformed"] == 2.0
    assert traj.episode.messages[2]["content"] == "error: the call to mul is not closed: write mul(...) alone on its line"


def test_max_turns_cuts_an_episode_that_keeps_calling(tokenizer):
    traj, score = play(tokenizer, example_of(12, 10, 5), ["mul(12,10)"] * 4)
    ep = traj.episode
    assert ep.turns == CalculatorEnv.max_turns == 4 and ep.truncated and score["reward"] == 0.0
    assert ep.messages[-1]["role"] == "assistant"  # the last step's observations are dropped
    assert tokenizer.decode(traj.completion_ids).endswith("mul(12,10)<eot>")


def test_a_turn_that_runs_out_of_tokens_ends_the_episode(tokenizer):
    def generate(prompts, stop):
        return [tokenizer.encode("mul(12,1", add_special_tokens=False)]  # no turn end

    (traj,) = asyncio.run(play_reference_episodes(CalculatorEnv, [example_of(12, 10, None)], tokenizer, generate))
    assert traj.episode.truncated and traj.episode.turns == 1 and traj.loss_mask == [1] * 8


def test_warm_start_rows_are_the_ids_a_rollout_produces(tokenizer):
    bridge = ChatBridge(tokenizer, CalculatorEnv.tools)
    example = example_of(23, 45, 67)
    turns = ["mul(23,45)", "add(1035,67)", "1102"]
    ids, mask = asyncio.run(make_tool_model.demonstration_row(CalculatorEnv, example, turns, bridge))
    traj, _ = play(tokenizer, example, turns)
    assert ids == traj.prompt_ids + traj.completion_ids
    assert mask == [0] * len(traj.prompt_ids) + traj.loss_mask


def test_examples_are_deterministic_and_the_held_out_split_is_disjoint():
    assert CalculatorEnv.train_example(3, 0) == CalculatorEnv.train_example(3, 0)
    assert CalculatorEnv.train_example(3, 0) != CalculatorEnv.train_example(3, 1)
    held_out = {e["prompt"] for e in CalculatorEnv.eval_examples(0, 256)}
    assert len(held_out) == 256
    assert not held_out & {CalculatorEnv.train_example(i, 0)["prompt"] for i in range(5000)}
    shapes = [CalculatorEnv.train_example(i, 0)["c"] is None for i in range(2000)]
    assert 0.35 < sum(shapes) / len(shapes) < 0.45  # 40% a*b, 60% a*b+c
    with pytest.raises(ValueError, match="at most"):
        CalculatorEnv.eval_examples(0, 1000)


@pytest.mark.skipif(not (TOOL_MODEL / "model.safetensors").is_file(), reason="tool model not built")
@pytest.mark.slow
def test_the_shipped_tool_model_calls_tools_and_leaves_room_to_learn():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TOOL_MODEL))
    bridge = ChatBridge(tokenizer, CalculatorEnv.tools)
    assert bridge.preserves_prefixes() and tokenizer.convert_ids_to_tokens(list(bridge.turn_end_ids)) == ["<eot>"]
    meta = json.loads((TOOL_MODEL / "warm_start.json").read_text())
    assert 0.3 <= meta["eval_success"] <= 0.5 and meta["mean_model_turns"] >= 2.0
    model = AutoModelForCausalLM.from_pretrained(str(TOOL_MODEL))
    assert sum(p.numel() for p in model.parameters()) < 900_000
    figures = make_tool_model.measure(model, tokenizer, CalculatorEnv.eval_examples(0, 64))
    # Greedily it answers a*b right and forgets +c: RL has the second tool call to learn.
    assert figures["success_a_times_b"] >= 0.8 and figures["success_a_times_b_plus_c"] <= 0.2
    assert figures["mean_model_turns"] >= 1.9

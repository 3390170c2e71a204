"""The reference episode driver (`tokenflow.envs.play_reference_episodes`) against the one training
runs (`tokenflow.runtime.drivers.episodes`: the engine worker's `EpisodeDriver`, driven in-process
by its blocking `run_episodes`): on the same environment and examples, with the shipped tool model
decoding greedily on the built-in engine, both play the same episodes — the same token ids, the
same loss mask, the same conversation and the same reward. The reference re-submits each turn's
whole sequence; training continues it in the engine (parked KV, ``add_request(resume=...)``), so
this is what makes the reference a reference."""

from __future__ import annotations

import asyncio
import os
import warnings

import pytest

from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.envs import play_reference_episodes, run_episodes
from tokenflow.envs.calculator import CalculatorEnv
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime.drivers.episodes import EpisodeSpec
from tokenflow.runtime.drivers.episodes import run_episodes as run_training_episodes
from tokenflow.scoring.episodes import episode_reward

ENV = "tokenflow.envs.calculator:CalculatorEnv"
MAX_TOKENS = 32  # one model turn's budget, in both drivers


@pytest.fixture(scope="module")
def engine():
    path = os.environ.get("TF_TOOL_MODEL") or resolve_model_path("default-tool")
    engine = Engine(path, EngineConfig(device="cpu", dtype="float32", threads=1))
    yield engine
    engine.close()


def _reference(engine, examples):
    context = engine.max_model_len

    def generate(prompts, stop):
        params = [SamplingParams(temperature=0.0, max_tokens=min(MAX_TOKENS, context - len(p)), stop_token_ids=stop)
                  for p in prompts]
        return [list(group[0].completion_ids) for group in engine.generate(prompts, params)]

    return asyncio.run(play_reference_episodes(CalculatorEnv, examples, engine.tokenizer, generate,
                                               max_len=context - 1))


def test_the_reference_driver_plays_the_episodes_training_plays(engine):
    examples = [CalculatorEnv.train_example(i, 0) for i in range(8)]
    groups = run_training_episodes(engine, [EpisodeSpec(ENV, ex) for ex in examples],
                                   SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, n=1))
    trajs = _reference(engine, examples)
    assert len(groups) == len(trajs) == len(examples)
    multi = 0
    for ex, group, traj in zip(examples, groups, trajs):
        (row,) = group  # the tool model's template preserves prefixes: one row per episode
        assert not row.failed
        summary = row.info["episode"]
        record = summary["episode"]
        # The same ids, token for token, and the same split into model and environment ids.
        assert row.prompt_ids.tolist() == traj.prompt_ids, ex["prompt"]
        assert row.completion_ids.tolist() == traj.completion_ids, ex["prompt"]
        assert row.loss_mask.tolist() == traj.loss_mask, ex["prompt"]
        # The same conversation, as the environment recorded it.
        ref = traj.episode
        assert record.messages == ref.messages
        assert (record.turns, record.truncated) == (ref.turns, ref.truncated) == (summary["turns"], ref.truncated)
        assert record.step_rewards == ref.step_rewards and record.info == ref.info
        # The same reward: training's scorer (episode_reward) on the row, the rubric on the reference.
        (trained,) = episode_reward(ex["prompt"], [{**summary, "sample_index": 0}], ex)
        (wanted,) = CalculatorEnv.rubric.score([ref])
        assert trained["reward"] == wanted["reward"]
        multi += ref.turns >= 2
    assert multi >= 2, "the tool model should call a tool in some greedy episodes"


def test_run_episodes_is_a_deprecated_alias_of_the_reference_driver(engine):
    examples = [CalculatorEnv.train_example(0, 0)]
    context = engine.max_model_len

    def generate(prompts, stop):
        params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=stop) for _ in prompts]
        return [list(group[0].completion_ids) for group in engine.generate(prompts, params)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (old,) = asyncio.run(run_episodes(CalculatorEnv, examples, engine.tokenizer, generate, max_len=context - 1))
    assert any(issubclass(w.category, DeprecationWarning) and "play_reference_episodes" in str(w.message)
               for w in caught)
    (new,) = _reference(engine, examples)
    assert old.prompt_ids + old.completion_ids == new.prompt_ids + new.completion_ids

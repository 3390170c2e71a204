"""DAPO as the paper defines it: dynamic sampling keeps a group iff 0 < #correct < G (correct as
held-out accuracy counts it, before shaping), and the overlong penalty is on each model turn's
length, never on environment tokens."""

import numpy as np
import pytest

from tokenflow.buffer import DynamicSampling, RolloutBuffer, uninformative
from tokenflow.rollout import CORRECT_REWARD, Rollout
from tokenflow.scoring.overlong import model_turn_lengths, shape_overlong


def sample(n: int, reward: float | None, gid: int = 0, i: int = 0) -> Rollout:
    return Rollout(prompt_ids=[1], completion_ids=[3] * n, logprobs=[0.0] * n, versions=[0] * n,
                   group_id=gid, prompt_id=gid, sample_index=i, reward=reward,
                   rewards={} if reward is None else {"reward": reward}, failed=reward is None)


def episode(turns: list[tuple[int, int]], reward: float) -> Rollout:
    """A multi-turn rollout: (model tokens, environment tokens after them) per turn."""
    mask, turn = [], []
    for k, (model, env) in enumerate(turns):
        mask += [1] * model + [0] * env
        turn += [k] * (model + env)
    n = len(mask)
    return Rollout(prompt_ids=[1], completion_ids=[3] * n, logprobs=[0.0] * n, versions=[0] * n,
                   loss_mask=mask, turns=turn, reward=reward, rewards={"reward": reward})


def test_an_all_wrong_group_in_the_overlong_zone_is_dropped():
    # Counterexample 1: every sample wrong, but the lengths fall in the overlong zone, so the
    # shaped rewards differ. The old filter (equal shaped rewards) kept this group.
    group = [sample(n, 0.0, i=i) for i, n in enumerate([20, 26, 30, 32])]
    shape_overlong(group, max_tokens=32, buffer_tokens=16, factor=1.0)
    assert len({r.reward for r in group}) == 4  # the shaped rewards are all different
    assert uninformative(group)
    buf = RolloutBuffer(prompts_per_step=1, group_size=4, max_staleness=0, dynamic_sampling=DynamicSampling(10))
    buf.admit(0, 0)
    assert buf.put(group) is False


def test_correct_means_what_held_out_accuracy_means():
    # All correct, shaped apart by the penalty: still all correct, dropped.
    solved = [sample(n, 1.0, i=i) for i, n in enumerate([10, 30])]
    shape_overlong(solved, max_tokens=32, buffer_tokens=16, factor=1.0)
    assert solved[1].reward < CORRECT_REWARD  # shaped below the threshold, yet correct
    assert uninformative(solved)
    # One correct at the threshold, one partial credit below it: 0 < 1 < 2, kept.
    assert not uninformative([sample(5, CORRECT_REWARD), sample(5, 0.49, i=1)])
    # Partial credit on both sides of nothing: two different wrong rewards are still all wrong.
    assert uninformative([sample(5, 0.1), sample(5, 0.3, i=1)])
    # Two different correct rewards are all correct.
    assert uninformative([sample(5, 0.7), sample(5, 1.0, i=1)])
    # Failed samples are left out of G; a group with none scored is kept.
    assert not uninformative([sample(5, 1.0), sample(5, 0.0, i=1), sample(5, None, i=2)])
    assert uninformative([sample(5, 1.0), sample(5, None, i=1)])
    assert not uninformative([sample(5, None), sample(5, None, i=1)])


def test_overlong_penalty_is_per_model_turn():
    # Counterexample 2: a 2-turn episode of 60 + 60 model tokens (and environment tokens between
    # them) under a per-turn limit of 64 with a buffer of 8: each turn is 4 tokens into the zone,
    # so the episode gets −0.5, not the full −1 its 150 completion tokens used to earn.
    ep = episode([(60, 30), (60, 0)], reward=1.0)
    assert model_turn_lengths(ep) == [60, 60]
    shape_overlong([ep], max_tokens=64, buffer_tokens=8, factor=1.0)
    assert ep.rewards["overlong_penalty"] == pytest.approx(-0.5)
    assert ep.reward == pytest.approx(0.5) and ep.info["unshaped_reward"] == 1.0
    # A short turn and a turn cut at the limit: the episode's penalty is its worst turn's.
    cut = episode([(10, 40), (64, 5)], reward=1.0)
    shape_overlong([cut], max_tokens=64, buffer_tokens=8, factor=1.0)
    assert cut.rewards["overlong_penalty"] == pytest.approx(-1.0)
    # Many short turns: no penalty however long the episode.
    chatty = episode([(20, 50)] * 6, reward=0.0)
    shape_overlong([chatty], max_tokens=64, buffer_tokens=8, factor=1.0)
    assert chatty.num_tokens == 420 and chatty.rewards["overlong_penalty"] == 0.0


def test_turns_without_a_turn_record_are_the_runs_of_model_tokens():
    ep = episode([(7, 3), (5, 2), (9, 0)], reward=1.0)
    ep.turns = None
    assert model_turn_lengths(ep) == [7, 5, 9]
    single = sample(12, 1.0)
    assert model_turn_lengths(single) == [12]
    # A single-turn completion is shaped exactly as before: its length is all its tokens.
    shape_overlong([single], max_tokens=16, buffer_tokens=8, factor=1.0)
    assert single.rewards["overlong_penalty"] == pytest.approx(-0.5)


def test_dynamic_sampling_in_the_buffer_keeps_only_mixed_groups():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=0, dynamic_sampling=DynamicSampling(10))
    for gid in range(2):
        buf.admit(gid, gid)
    wrong = [sample(28, 0.0, gid=0), sample(31, 0.0, gid=0, i=1)]
    mixed = [sample(28, 1.0, gid=1), sample(31, 0.0, gid=1, i=1)]
    for g in (wrong, mixed):
        shape_overlong(g, max_tokens=32, buffer_tokens=8, factor=1.0)
    assert buf.put(wrong) is False and buf.put(mixed) is True
    assert buf.stats.groups_dropped == 1
    assert np.isclose(mixed[0].reward, 1.0 - 0.5)  # shaped, kept for training

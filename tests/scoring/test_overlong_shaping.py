"""DAPO's soft overlong punishment: the formula at its edges, and where it lands on a group."""

import pytest

from tokenflow.rollout import Rollout
from tokenflow.runtime.orchestrator.step_metrics import batch_metrics
from tokenflow.scoring.overlong import overlong_penalty, shape_overlong


@pytest.mark.parametrize("length, expected", [
    (1, 0.0), (80, 0.0),        # up to L_max − L_cache = 96 − 16: no penalty
    (81, -0.5 / 16), (88, -0.5 * 8 / 16), (95, -0.5 * 15 / 16),
    (96, -0.5),                 # at the limit: the whole factor
])
def test_penalty_grows_linearly_over_the_last_buffer_tokens(length, expected):
    assert overlong_penalty(length, max_tokens=96, buffer_tokens=16, factor=0.5) == pytest.approx(expected)


def test_a_buffer_as_long_as_the_limit_penalises_from_the_first_token():
    assert overlong_penalty(0, 10, 10, 1.0) == 0.0
    assert overlong_penalty(5, 10, 10, 1.0) == pytest.approx(-0.5)


def rollout(n: int, reward: float | None, **kw) -> Rollout:
    return Rollout(prompt_ids=[1], completion_ids=[3] * n, logprobs=[0.0] * n, versions=[0] * n,
                   reward=reward, rewards={} if reward is None else {"reward": reward, "format": 1.0},
                   failed=reward is None, **kw)


def test_shaping_adds_to_the_reward_keeps_components_and_skips_failed_samples():
    group = [rollout(10, 1.0, sample_index=0), rollout(24, 1.0, sample_index=1), rollout(32, None, sample_index=2)]
    shape_overlong(group, max_tokens=32, buffer_tokens=16, factor=1.0)
    assert [r.reward for r in group] == [1.0, pytest.approx(0.5), None]
    assert group[1].rewards == {"reward": pytest.approx(0.5), "format": 1.0, "overlong_penalty": pytest.approx(-0.5)}
    assert "overlong_penalty" not in group[2].rewards
    m = batch_metrics([group])
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-0.25)  # over the two scored samples
    assert m["rollout/overlong_frac"] == pytest.approx(0.5)
    assert m["reward/mean"] == pytest.approx(0.75)


def test_every_scored_sample_is_shaped_whatever_comes_before_it():
    """A failed sample first does not stop the rest of the group being shaped; a sample marked
    failed keeps whatever reward it carries, and an unscored one (reward None) stays unscored."""
    failed_with_reward = rollout(32, 1.0, sample_index=1)
    failed_with_reward.failed = True
    unscored = rollout(32, None, sample_index=2)
    unscored.failed = False
    group = [rollout(32, None, sample_index=0), failed_with_reward, unscored, rollout(32, 1.0, sample_index=3)]
    shape_overlong(group, max_tokens=32, buffer_tokens=16, factor=1.0)
    assert [r.reward for r in group] == [None, 1.0, None, 0.0]
    assert "overlong_penalty" not in failed_with_reward.rewards and group[3].rewards["overlong_penalty"] == -1.0


def test_model_turns_are_read_from_turns_or_from_runs_of_model_tokens():
    from tokenflow.scoring.overlong import model_turn_lengths

    def r(mask, turns=None):
        n = len(mask)
        return Rollout(prompt_ids=[1], completion_ids=[3] * n, logprobs=[0.0] * n, versions=[0] * n, loss_mask=mask,
                       turns=turns)

    assert model_turn_lengths(r([1, 1, 0, 1, 1, 1, 0])) == [2, 3]  # runs between environment tokens
    assert model_turn_lengths(r([0, 1, 1, 0])) == [2] and model_turn_lengths(r([1, 1, 1, 1])) == [4]
    assert model_turn_lengths(r([0, 0])) == []
    # with turns: model tokens counted per turn (turn 0: two, turn 1: one; the environment tokens not)
    assert model_turn_lengths(r([1, 1, 0, 0, 1], turns=[0, 0, 0, 1, 1])) == [2, 1]


def test_the_penalty_is_that_of_the_longest_model_turn():
    from tokenflow.scoring.overlong import shape_overlong

    n = 7
    x = Rollout(prompt_ids=[1], completion_ids=[3] * n, logprobs=[0.0] * n, versions=[0] * n,
                loss_mask=[1, 1, 0, 1, 1, 1, 0], reward=1.0)
    # max 4, buffer 2: turns of 2 and 3 tokens → penalties 0 and −0.5 (one token into the buffer of 2)
    shape_overlong([x], max_tokens=4, buffer_tokens=2, factor=1.0)
    assert (x.reward, x.info["unshaped_reward"], x.rewards["overlong_penalty"]) == (0.5, 1.0, -0.5)


def test_a_sample_without_model_tokens_gets_no_penalty():
    from tokenflow.scoring.overlong import shape_overlong

    x = Rollout(prompt_ids=[1], completion_ids=[3, 3], logprobs=[0.0] * 2, versions=[0] * 2, loss_mask=[0, 0], reward=1.0)
    shape_overlong([x], max_tokens=1, buffer_tokens=1, factor=1.0)
    assert (x.reward, x.rewards["overlong_penalty"]) == (1.0, 0.0)


def test_an_episode_split_into_rows_gets_its_worst_turns_penalty_on_every_row():
    """Rows of one episode share its sample index; the docstring's rule is per episode, so the
    short row carries the long row's penalty (and another episode keeps its own)."""
    def row(n: int, index: int) -> Rollout:
        return Rollout(prompt_ids=[1], completion_ids=[3] * n, logprobs=[0.0] * n, versions=[0] * n,
                       reward=1.0, sample_index=index)

    long_row, short_row, other = row(3, 0), row(1, 0), row(1, 1)
    # max 4, buffer 2: 3 tokens are one into the buffer → −0.5; 1 token → 0
    shape_overlong([short_row, long_row, other], max_tokens=4, buffer_tokens=2, factor=1.0)
    assert [r.rewards["overlong_penalty"] for r in (long_row, short_row, other)] == [-0.5, -0.5, 0.0]
    assert [r.reward for r in (long_row, short_row, other)] == [0.5, 0.5, 1.0]

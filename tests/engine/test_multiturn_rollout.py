"""The multi-turn fields of the rollout record: `Rollout.turns`, `append_environment`, `extend`."""

from __future__ import annotations

import numpy as np
import pytest

from tokenflow.rollout import Rollout


def generated(n: int = 3, **kw) -> Rollout:
    """A model turn of ``n`` tokens as an engine returns it (versions rising 4, 5, ...)."""
    fields = dict(prompt_ids=[1, 2], completion_ids=list(range(10, 10 + n)),
                  logprobs=-0.5 * np.arange(1, n + 1), versions=4 + np.arange(n), finish_reason="stop",
                  request_id="r", sample_index=2, group_id=3, prompt_id=9, info={"seed": 11})
    return Rollout(**{**fields, **kw})


def test_append_environment_adds_masked_tokens_of_the_same_turn_and_version():
    r = generated(3, support_logmass=[-0.1, 0.0, -0.2], support=[np.array([1, 2]), None, np.array([3])],
                  token_rewards=[0.5, 0.0, 1.0], routed_experts=np.zeros((4, 2, 1), np.uint8), text="abc")
    e = r.append_environment([7, 8])
    assert e.completion_ids.tolist() == [10, 11, 12, 7, 8]
    assert e.loss_mask.tolist() == [1, 1, 1, 0, 0]
    assert e.logprobs.tolist() == [-0.5, -1.0, -1.5, 0.0, 0.0]
    assert e.versions.tolist() == [4, 5, 6, 6, 6]  # the last generated token's version
    assert e.support_logmass.tolist() == pytest.approx([-0.1, 0.0, -0.2, 0.0, 0.0])
    assert e.support[3:] == [None, None] and e.support[0].tolist() == [1, 2]
    assert e.token_rewards.tolist() == [0.5, 0.0, 1.0, 0.0, 0.0]
    assert e.turns.dtype == np.int16 and e.turns.tolist() == [0] * 5
    assert e.routed_experts is None and e.text is None
    assert (e.finish_reason, e.request_id, e.sample_index, e.group_id, e.prompt_id) == ("stop", "r", 2, 3, 9)
    assert e.ends_with_environment and not r.ends_with_environment
    # The original is unchanged (a new rollout, not an in-place edit).
    assert r.num_tokens == 3 and r.turns is None and r.routed_experts is not None


def test_append_environment_keeps_the_current_turn_and_skips_environment_versions():
    r = generated(2, turns=[0, 0]).append_environment([5])
    r2 = r.extend(generated(2, versions=[9, 9], turns=[1, 1])).append_environment([6, 6])
    assert r2.turns.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert r2.versions.tolist() == [4, 5, 5, 9, 9, 9, 9]
    # Environment tokens after environment tokens: still the last *generated* token's version.
    assert r2.append_environment([1]).versions[-1] == 9
    assert r2.support is None and r2.support_logmass is None and r2.token_rewards is None


def test_append_environment_refuses_empty_and_negative_ids():
    with pytest.raises(ValueError, match="at least one"):
        generated().append_environment([])
    with pytest.raises(ValueError, match=">= 0"):
        generated().append_environment([3, -1])


def test_extend_joins_turns_treating_a_missing_side_as_turn_zero():
    a, b = generated(2), generated(3, turns=[1, 1, 1])
    assert a.extend(b).turns.tolist() == [0, 0, 1, 1, 1]
    assert b.extend(a).turns.tolist() == [1, 1, 1, 0, 0]
    assert a.extend(generated(1)).turns is None  # single-turn stays single-turn
    assert a.extend(b).loss_mask.tolist() == [1] * 5


def test_turns_must_have_one_entry_per_completion_token():
    with pytest.raises(ValueError, match="Rollout.turns has 2 entries but the completion has 3"):
        generated(3, turns=[0, 1])
    assert generated(3, turns=[0, 1, 1]).turns.dtype == np.int16


"""RolloutBuffer's accounting, figure by figure on a hand-played sequence: every metric, the
waits on an explicit clock, the checkpoint state and its reload, and what counts as correct."""

from __future__ import annotations

import logging
import time

import pytest

from tokenflow.buffer import DynamicSampling, RolloutBuffer, uninformative
from tokenflow.rollout import Rollout


def sample(gid: int, versions: list[int], reward: float | None, mask=None, **kw) -> Rollout:
    n = len(versions)
    return Rollout(prompt_ids=[1], completion_ids=[5] * n, logprobs=[0.0] * n, versions=versions, loss_mask=mask,
                   group_id=gid, reward=reward, failed=reward is None, **kw)


def test_waits_are_measured_on_the_given_clock():
    buf = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=0)
    assert buf.can_admit(now=1.0)
    buf.admit(0, 10)
    assert not buf.can_admit(now=2.0)  # full from t = 2
    assert not buf.can_admit(now=3.0)
    with pytest.raises(RuntimeError, match=r"^admit\(\) past the staleness budget; call can_admit\(\) first$"):
        buf.admit(1, 11)
    buf.mark_trainer_waiting(now=2.5)  # the trainer waits from t = 2.5
    buf.mark_trainer_waiting(now=2.9)  # already waiting: the start stays 2.5
    buf.put([sample(0, [0], 0.0), sample(0, [0], 1.0)])
    assert [g[0].group_id for g in buf.take_batch(0, now=4.0)] == [0]
    buf.set_engine_version(1)
    buf.set_engine_version(0)  # a stale report does not shrink the budget
    assert buf.engine_version == 1 and buf.capacity() == 2
    assert buf.can_admit(now=6.0)  # blocked from 2 to 6
    m = buf.metrics()
    assert (m["buffer/admission_wait_s"], m["buffer/batch_wait_s"]) == (4.0, 1.5)
    buf.mark_trainer_waiting(now=7.0)
    assert buf.take_batch(1, now=7.5) is None
    buf.admit(1, 11)
    buf.put([sample(1, [1], 0.0), sample(1, [1], 1.0)])
    buf.take_batch(1, now=9.0)
    assert buf.metrics()["buffer/batch_wait_s"] == 1.5 + 2.0  # waiting from 7.0, not 7.5


def play() -> RolloutBuffer:
    """prompts_per_step 1, groups of 2, K = 1, max_token_age 0, at most one drop per batch."""
    buf = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=1, max_token_age=0,
                        dynamic_sampling=DynamicSampling(max_drops=1))
    for gid in (0, 1):
        buf.admit(gid, 100 + gid)
    assert buf.put([sample(0, [0], 1.0), sample(0, [0], 1.0)]) is False  # all correct: dropped
    buf.admit(2, 102)  # the dropped group's slot
    assert buf.put([sample(2, [1, 1], 0.0), sample(2, [2], None)]) is True  # all wrong, past the cap: kept
    # group 1: the second sample's last token is an environment token (mask 0, its version unused)
    assert buf.put([sample(1, [0, 0], 0.0), sample(1, [0, 7], 1.0, mask=[1, 0])]) is True
    return buf


def test_every_metric_on_a_played_sequence(caplog):
    with caplog.at_level(logging.WARNING, logger="tokenflow.buffer"):
        buf = play()
    assert len(caplog.records) == 1
    assert buf.metrics() == {
        "buffer/fill": 1.0, "buffer/ready_groups": 2.0, "buffer/in_flight_groups": 2.0,
        "buffer/admission_wait_s": 0.0, "buffer/batch_wait_s": 0.0, "buffer/groups_dropped": 1.0,
        "buffer/flat_groups_kept": 1.0, "buffer/rollouts_failed": 1.0, "buffer/tokens_rejected": 0.0,
        "buffer/token_age_mean": 0.0, "buffer/token_age_max": 0.0}
    assert [g[0].group_id for g in buf.take_batch(trainer_version=1)] == [1]  # admitted before group 2
    assert buf.last_batch_dropped == 1
    # group 1 at version 1: three generated tokens of age 1, all older than max_token_age 0
    m = buf.metrics()
    assert (m["buffer/fill"], m["buffer/tokens_rejected"], m["buffer/token_age_mean"], m["buffer/token_age_max"]) \
        == (0.5, 3.0, 1.0, 1.0)
    assert buf.take_batch(trainer_version=3) is not None
    # group 2 at version 3: ages 2, 2 and 1 → ages {1: 4, 2: 2}, mean 8 / 6
    m = buf.metrics()
    assert dict(buf.stats.age_histogram) == {1: 4, 2: 2}
    assert (m["buffer/tokens_rejected"], m["buffer/token_age_max"]) == (6.0, 2.0)
    assert m["buffer/token_age_mean"] == pytest.approx(8 / 6, rel=1e-12)
    assert buf.stats.groups_consumed == 2 and buf.last_batch_dropped == 0


def test_checkpoint_state_holds_the_counts_and_reloads_them():
    buf = play()
    buf.set_engine_version(2)
    state = buf.state_dict()
    assert {k: v for k, v in state.items() if k != "ready"} == {
        "engine_version": 2, "rollouts_admitted": 4, "in_flight": [(1, 101), (2, 102)], "age_histogram": {},
        "groups_dropped": 1, "flat_groups_kept": 1}
    assert sorted(state["ready"]) == [1, 2]
    other = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=1)
    # as JSON gives it back: keys and ids as strings
    other.load_state_dict({**state, "in_flight": [("1", "101"), ("2", "102")], "ready": {"1": state["ready"][1]},
                           "age_histogram": {"3": 5}})
    assert (other.engine_version, other.rollouts_admitted, list(other.in_flight.items())) == (2, 4, [(1, 101), (2, 102)])
    assert list(other.ready) == [1] and dict(other.stats.age_histogram) == {3: 5}
    assert (other.stats.groups_dropped, other.stats.flat_groups_kept) == (1, 1)
    # a state written before the dynamic-sampling counts existed
    older = {k: v for k, v in state.items() if k not in ("groups_dropped", "flat_groups_kept")}
    other.load_state_dict(older)
    assert (other.stats.groups_dropped, other.stats.flat_groups_kept) == (0, 0)


def test_correct_means_a_task_reward_of_at_least_the_threshold_before_shaping():
    assert not uninformative([sample(0, [0], 0.5), sample(0, [0], 0.0)])  # 0.5 is correct
    assert uninformative([sample(0, [0], 0.49), sample(0, [0], 0.0)])
    # shaped apart by the overlong penalty, the same task reward: all wrong
    shaped = [sample(0, [0], 0.0, info={"unshaped_reward": 0.0}), sample(0, [0], -0.2, info={"unshaped_reward": 0.0})]
    assert uninformative(shaped)
    assert not uninformative([sample(0, [0], None), sample(0, [0], None)])


def test_put_of_a_group_not_admitted_names_it():
    buf = RolloutBuffer(prompts_per_step=1, group_size=1, max_staleness=0)
    with pytest.raises(KeyError) as e:
        buf.put([sample(3, [0], 1.0)])
    assert e.value.args[0] == "group 3 was not admitted (or was already put)"


def test_waits_on_the_monotonic_clock_add_up_over_separate_spells():
    buf = RolloutBuffer(prompts_per_step=1, group_size=1, max_staleness=0)
    assert buf.last_batch_dropped == 0 and buf.dynamic_sampling is None
    for spell in range(2):
        buf.admit(spell, spell)
        assert not buf.can_admit()  # blocked from now on the real clock
        buf.mark_trainer_waiting()
        time.sleep(0.02)
        buf.put([sample(spell, [spell], 1.0)])
        assert buf.take_batch(spell) is not None
        buf.set_engine_version(spell + 1)
        assert buf.can_admit()
    # two spells of at least 20 ms each, on both clocks; neither replaced the other
    assert buf.stats.admission_wait_s >= 0.04 and buf.stats.batch_wait_s >= 0.04
    assert (buf.stats.groups_admitted, buf.stats.groups_ready, buf.stats.groups_consumed) == (2, 2, 2)


def test_flat_groups_past_the_cap_are_each_counted_and_warned_about_once(caplog):
    buf = RolloutBuffer(prompts_per_step=4, group_size=2, max_staleness=0, dynamic_sampling=DynamicSampling(max_drops=1))
    for gid in range(3):
        buf.admit(gid, gid)
    with caplog.at_level(logging.WARNING, logger="tokenflow.buffer"):
        assert buf.put([sample(0, [0], 0.0), sample(0, [0], 0.0)]) is False
        assert buf.put([sample(1, [0], 0.0), sample(1, [0], 0.0)]) is True
        assert buf.put([sample(2, [0], 1.0), sample(2, [0], 1.0)]) is True
    assert buf.stats.flat_groups_kept == 2 and buf.stats.groups_ready == 2
    assert [r.getMessage() for r in caplog.records] == [
        "dynamic sampling dropped 1 all-correct or all-wrong groups since the last batch (the cap, "
        "algorithm.dynamic_sampling_max_batches × rollout.prompts_per_step); such groups are kept until the next "
        "batch so the run goes on. When every group is all correct or all wrong the task is solved or too hard "
        "for the model: see docs/howto/doesnt-learn.md. Counted as buffer/flat_groups_kept."]

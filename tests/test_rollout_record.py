"""The `Rollout` record field by field: what construction normalises and refuses (with the
message), `extend` joining every optional field when one side lacks it, `append_environment`
on each optional field, and the small derived properties."""

import numpy as np
import pytest

from tokenflow.rollout import Rollout, task_reward


def test_construction_normalises_dtypes_and_shapes():
    r = Rollout([[1, 2]], [3, 4], [-0.5, -1.5], [1, 2], support_logmass=[0.0, -0.25], token_rewards=[1, 2],
                turns=[0, 1], top_logprobs=[([3, 9], [-0.5, -2.0]), ([4], [-1.5])])
    assert r.prompt_ids.tolist() == [1, 2] and r.prompt_ids.dtype == np.int32
    assert r.completion_ids.dtype == np.int32 and r.versions.dtype == np.int32
    assert r.logprobs.dtype == np.float32 and r.support_logmass.dtype == np.float32
    assert r.token_rewards.dtype == np.float32 and r.turns.dtype == np.int16
    assert r.loss_mask.tolist() == [1, 1] and r.loss_mask.dtype == np.int8
    ids, lp = r.top_logprobs[0]
    assert (ids.dtype, lp.dtype, ids.tolist(), lp.tolist()) == (np.int32, np.float32, [3, 9], [-0.5, -2.0])
    nested = Rollout([1], [2, 3], [[0.0, -1.0]], [0, 0], loss_mask=[[1, 0]], turns=[[0, 1]])  # flattened
    assert nested.loss_mask.tolist() == [1, 0] and nested.loss_mask.dtype == np.int8
    assert nested.logprobs.tolist() == [0.0, -1.0] and nested.turns.tolist() == [0, 1]
    # full-vocabulary log-probs add the support's log-mass; ages are against the trainer's version
    assert r.full_logprobs.tolist() == [-0.5, -1.75] and r.token_ages(5).tolist() == [4, 3]
    assert Rollout([1], [2], [-0.5], [0]).full_logprobs.tolist() == [-0.5]


@pytest.mark.parametrize("field,value,message", [
    ("logprobs", [0.0], "Rollout.logprobs has 1 entries but the completion has 2 tokens; "
                        "per-token arrays must have one entry per completion token"),
    ("loss_mask", [1, 1, 1], "Rollout.loss_mask has 3 entries but the completion has 2 tokens; "
                             "per-token arrays must have one entry per completion token"),
    ("support_logmass", [0.0], "Rollout.support_logmass has 1 entries"),
    ("token_rewards", [0.0], "Rollout.token_rewards has 1 entries"),
    ("top_logprobs", [([1], [0.0])], "Rollout.top_logprobs has 1 entries but the completion has 2 tokens"),
    ("support", [None], "Rollout.support has 1 entries but the completion has 2 tokens"),
    ("routed_experts", np.zeros((3, 1, 1)), "Rollout.routed_experts has shape (3, 1, 1) but must be [2, moe_layers, "
                                            "top_k]: one row per input token (prompt + completion − 1)"),
    ("routed_experts", np.zeros((2, 1)), "Rollout.routed_experts has shape (2, 1) but must be [2,"),
])
def test_per_token_fields_of_the_wrong_length_are_refused_by_name(field, value, message):
    kw = {"prompt_ids": [1], "completion_ids": [2, 3], "logprobs": [0.0, 0.0], "versions": [0, 0], field: value}
    with pytest.raises(ValueError) as e:
        Rollout(**kw)
    assert str(e.value).startswith(message)


def test_a_top_logprobs_entry_with_unequal_parts_is_refused():
    with pytest.raises(ValueError) as e:
        Rollout([1], [2], [0.0], [0], top_logprobs=[([1, 2], [0.0])])
    assert str(e.value) == "a Rollout.top_logprobs entry has 2 ids but 1 log-probs"


def test_routing_of_an_empty_rollout_has_no_rows():
    assert Rollout([], [], [], [], routed_experts=np.zeros((0, 2, 1))).routed_experts.shape == (0, 2, 1)


def test_extend_fills_a_missing_side_of_each_optional_field():
    a = Rollout([1], [2, 3], [-1.0, -2.0], [0, 0], support=[None, np.array([3])], support_logmass=[-0.5, 0.0],
                token_rewards=[0.5, 0.25], top_logprobs=[([2], [-1.0]), ([3], [-2.0])], request_id="q", sample_index=2,
                group_id=7, prompt_id=9, temperature=0.5, text="ab", info={"x": 1, "y": 1}, finish_reason="abort")
    b = Rollout([1, 2, 3], [4], [-3.0], [1], loss_mask=[0], info={"y": 2}, finish_reason="stop")
    j = a.extend(b)
    assert j.completion_ids.tolist() == [2, 3, 4] and j.prompt_ids.tolist() == [1]
    assert j.logprobs.tolist() == [-1.0, -2.0, -3.0] and j.versions.tolist() == [0, 0, 1]
    assert j.loss_mask.tolist() == [1, 1, 0]
    assert [None if s is None else s.tolist() for s in j.support] == [None, [3], None]
    assert j.support_logmass.tolist() == [-0.5, 0.0, 0.0]
    assert j.token_rewards.tolist() == [0.5, 0.25, 0.0]
    assert [t[0].tolist() for t in j.top_logprobs] == [[2], [3], []]
    assert j.turns is None and j.routed_experts is None and j.text is None
    assert (j.request_id, j.sample_index, j.group_id, j.prompt_id, j.temperature) == ("q", 2, 7, 9, 0.5)
    assert j.finish_reason == "stop" and j.info == {"x": 1, "y": 2}
    # the other way round: the first side lacks them
    k = b.extend(a)
    assert [None if s is None else s.tolist() for s in k.support] == [None, None, [3]]
    assert k.support_logmass.tolist() == [0.0, -0.5, 0.0] and k.token_rewards.tolist() == [0.0, 0.5, 0.25]
    assert [t[0].tolist() for t in k.top_logprobs] == [[], [2], [3]]
    plain = Rollout([1], [2], [0.0], [0]).extend(Rollout([1, 2], [3], [0.0], [0]))
    assert (plain.support, plain.support_logmass, plain.top_logprobs, plain.token_rewards) == (None, None, None, None)
    routed = np.zeros((2, 1, 1))
    assert Rollout([1], [2], [0.0], [0]).extend(Rollout([1, 2], [3], [0.0], [0]), routed_experts=routed) \
        .routed_experts.shape == (2, 1, 1)


def test_append_environment_extends_each_optional_field():
    r = Rollout([1], [2, 3], [-1.0, -2.0], [4, 5], support=[None, np.array([3])], support_logmass=[-0.5, -0.25],
                token_rewards=[1.0, 2.0], top_logprobs=[([2], [-1.0]), ([3], [-2.0])], text="x",
                routed_experts=np.zeros((2, 1, 1)), info={"k": 1}, rewards={"acc": 1.0})
    e = r.append_environment([7, 8])
    assert e.completion_ids.tolist() == [2, 3, 7, 8] and e.logprobs.tolist() == [-1.0, -2.0, 0.0, 0.0]
    assert e.versions.tolist() == [4, 5, 5, 5] and e.loss_mask.tolist() == [1, 1, 0, 0]
    assert e.support_logmass.tolist() == [-0.5, -0.25, 0.0, 0.0] and e.token_rewards.tolist() == [1.0, 2.0, 0.0, 0.0]
    assert [None if s is None else s.tolist() for s in e.support] == [None, [3], None, None]
    assert [t[0].tolist() for t in e.top_logprobs] == [[2], [3], [], []]
    assert e.turns.tolist() == [0, 0, 0, 0] and e.routed_experts is None and e.text is None
    assert e.ends_with_environment and not r.ends_with_environment
    e.info["k"], e.rewards["acc"] = 2, 0.0  # copies: the original's are untouched
    assert r.info == {"k": 1} and r.rewards == {"acc": 1.0}
    plain = Rollout([1], [2], [0.0], [3]).append_environment([5])
    assert (plain.support, plain.support_logmass, plain.top_logprobs, plain.token_rewards) == (None, None, None, None)
    # the last generated token's version, not an environment token's after it
    assert Rollout([1], [2, 3], [0.0, 0.0], [3, 7], loss_mask=[1, 0]).append_environment([5]).versions.tolist() == [3, 7, 3]
    # no generated token at all: the last token's version; no token: version 0
    assert Rollout([1], [2], [0.0], [6], loss_mask=[0]).append_environment([5]).versions.tolist() == [6, 6]
    assert Rollout([1], [], [], []).append_environment([5]).versions.tolist() == [0]


def test_append_environment_refusals_name_the_ids():
    r = Rollout([1], [2], [0.0], [0])
    assert r.append_environment([0]).completion_ids.tolist() == [2, 0]  # id 0 is a token like any other
    with pytest.raises(ValueError) as e:
        r.append_environment(list(range(-1, -10, -1)))
    assert str(e.value) == "token ids must be >= 0, got [-1, -2, -3, -4, -5, -6, -7, -8]"  # the first eight
    with pytest.raises(ValueError) as e:
        r.append_environment([])
    assert str(e.value) == "append_environment needs at least one token id"
    with pytest.raises(ValueError) as e:
        r.append_environment([3, 0, -1, -2])
    assert str(e.value) == "token ids must be >= 0, got [-1, -2]"


def test_derived_properties():
    assert Rollout([1], [], [], []).last_turn == 0 and not Rollout([1], [], [], []).ends_with_environment
    assert Rollout([1], [2, 3], [0.0, 0.0], [0, 0], turns=[1, 2]).last_turn == 2
    assert Rollout([1], [2], [0.0], [0]).last_turn == 0
    assert task_reward(Rollout([1], [2], [0.0], [0], reward=0.5, info={"unshaped_reward": 1.0})) == 1.0
    assert task_reward(Rollout([1], [2], [0.0], [0], reward=0.5)) == 0.5
    assert task_reward(Rollout([1], [2], [0.0], [0], reward=0.5, failed=True)) is None
    assert task_reward(Rollout([1], [2], [0.0], [0])) is None

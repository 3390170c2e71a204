"""The in-flight files of a checkpoint: what is written reads back bit for bit, tokens from
weights newer than the checkpoint are cut off before it is written, and a file that holds
anything else is refused naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenflow.errors import CheckpointError
from tokenflow.rollout import Rollout
from tokenflow.runtime.run.inflight_files import BLOB, INDEX, encode_inflight, read_inflight, trim_to_version


def partial(versions, group_id=5, sample_index=1, **kw) -> Rollout:
    n = len(versions)
    return Rollout(prompt_ids=[3, 4, 5], completion_ids=np.arange(10, 10 + n), logprobs=-np.linspace(0.1, 1, n),
                   versions=versions, finish_reason=kw.pop("finish_reason", "abort"), group_id=group_id,
                   sample_index=sample_index, support_logmass=-np.full(n, 0.01), info={"seed": 77},
                   support=[None] * (n - 1) + [np.array([10 + n - 1, 40])],
                   routed_experts=np.zeros((3 + n - 1, 2, 2), dtype=np.uint8), **kw)


def write(folder, step, groups, unkeepable=()):
    for name, data in encode_inflight(step, groups, list(unkeepable)).items():
        (folder / name).write_bytes(data)


def test_tokens_of_newer_weights_are_cut_and_the_rest_reads_back_bit_for_bit(tmp_path):
    whole = partial([2, 2, 3, 3, 4, 4], finish_reason="stop", text="done")
    cut = trim_to_version(whole, 3)
    assert cut.completion_ids.tolist() == whole.completion_ids[:4].tolist()
    assert cut.versions.tolist() == [2, 2, 3, 3] and cut.finish_reason == "abort" and cut.text is None
    assert cut.routed_experts.shape == (3 + 4 - 1, 2, 2) and len(cut.support) == 4
    assert cut.info == {"seed": 77}  # the sample's seed: its continuation draws what it would have
    assert trim_to_version(whole, 4) is whole
    assert trim_to_version(partial([5, 5]), 3).num_tokens == 0

    write(tmp_path, 3, {5: [cut]}, unkeepable=[9])
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 64}))
    groups, unkeepable, source = read_inflight(tmp_path, 3)
    assert unkeepable == [9] and source.endswith(BLOB)
    (back,) = groups[5]
    for name in ("completion_ids", "logprobs", "versions", "support_logmass", "routed_experts"):
        a, b = getattr(cut, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (back.sample_index, back.finish_reason, back.info) == (1, "abort", {"seed": 77})


@pytest.mark.parametrize("groups, why", [
    ({5: [partial([2, 4])]}, "has versions outside \\[0, 3\\]"),  # newer than the checkpoint: never written so
    ({5: [partial([1, 1], group_id=6)]}, "says it is of group 6"),
    ({5: [partial([1] * 60)]}, "has token ids outside \\[0, 64\\)"),
    ({5: [Rollout([1], [2, 3], [-0.5, float("nan")], [0, 0], finish_reason="abort", group_id=5)]}, "has non-finite"),
])
def test_an_in_flight_rollout_that_cannot_be_ours_is_refused_naming_the_file(tmp_path, groups, why):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 64}))
    write(tmp_path, 3, groups)
    with pytest.raises(CheckpointError, match=f"{BLOB} holds a rollout of group 5 that {why}"):
        read_inflight(tmp_path, 3)


def test_an_index_that_does_not_match_its_rollouts_is_refused(tmp_path):
    write(tmp_path, 3, {5: [partial([1])]})
    (tmp_path / INDEX).write_text(json.dumps({"step": 3, "groups": [[5, 2]], "unkeepable": []}))
    with pytest.raises(CheckpointError, match="holds 1 rollouts, inflight.json lists 2"):
        read_inflight(tmp_path, 3)
    (tmp_path / INDEX).write_text(json.dumps({"step": 4, "groups": [[5, 1]], "unkeepable": []}))
    with pytest.raises(CheckpointError, match="not an index of in-flight groups of step 3"):
        read_inflight(tmp_path, 3)
    assert read_inflight(tmp_path / "missing", 3)[:2] == ({}, [])  # a checkpoint from before these files

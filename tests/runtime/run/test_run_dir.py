"""The run folder's accounting on real files, by hand: manifests and each reason a checkpoint is
not whole, what a checkpoint must hold (each refusal by file), which checkpoints count, a finished
run, keep-the-last-N, reset, the rollout log's rows, and what a resume drops from the logs."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from tokenflow.errors import CheckpointError
from tokenflow.rollout import Rollout
from tokenflow.runtime.run.run_dir import RunDir, read_buffer_state, verify_checkpoint, write_buffer_state, write_manifest

STATE = {"step": 2, "cursor": 8, "next_group_id": 4}


def buffer_state(ready=None):
    return {"engine_version": 1, "rollouts_admitted": 4, "in_flight": [[3, 30]], "age_histogram": {"1": 2},
            "ready": ready if ready is not None else {2: [Rollout([1], [2], [0.0], [0], group_id=2, reward=1.0)]}}


def test_a_manifest_lists_every_file_with_its_size_and_checksum(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"abc")
    (tmp_path / "a.json").write_text("{}")
    write_manifest(tmp_path)
    files = json.loads((tmp_path / "manifest.json").read_text())["files"]
    assert files == {"a.json": {"bytes": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
                     "model/w.bin": {"bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}}
    assert verify_checkpoint(tmp_path) is None
    write_manifest(tmp_path)  # the manifest does not list itself
    assert "manifest.json" not in json.loads((tmp_path / "manifest.json").read_text())["files"]


def test_each_reason_a_checkpoint_is_not_whole(tmp_path):
    assert verify_checkpoint(tmp_path) == "it has no manifest (its write never finished)"
    (tmp_path / "manifest.json").write_text("[1]")
    assert verify_checkpoint(tmp_path).startswith("its manifest is unreadable (")
    (tmp_path / "x").write_bytes(b"1234")
    write_manifest(tmp_path)
    (tmp_path / "x").write_bytes(b"12345")
    assert verify_checkpoint(tmp_path) == "x has 5 bytes, the manifest says 4"
    (tmp_path / "x").write_bytes(b"4321")
    assert verify_checkpoint(tmp_path) == "x does not match its checksum"
    (tmp_path / "x").unlink()
    assert verify_checkpoint(tmp_path) == "x is missing"


def committed(tmp_path, step=2, keep=3) -> tuple[RunDir, object]:
    run = RunDir(tmp_path / "run").create()
    staging = run.staging_dir(step)
    (staging / "trainer_state.pt").write_bytes(b"t")
    return run, run.commit_checkpoint(staging, step, {**STATE, "step": step}, buffer_state(), keep=keep)


def test_a_committed_checkpoint_loads_back(tmp_path):
    run, cp = committed(tmp_path)
    assert cp == run.checkpoints / "step_000002" and verify_checkpoint(cp) is None
    assert json.loads((cp / "buffer.json").read_text())["ready"] == [[2, 1]]
    state, buf = RunDir.load_checkpoint(cp)
    kept = state.pop("kept")  # no in-flight rollouts were handed to this commit: none kept
    assert kept[0] == {} and kept[1] == []
    assert state == STATE and buf["in_flight"] == [[3, 30]] and list(buf["ready"]) == [2]
    assert buf["ready"][2][0].completion_ids.tolist() == [2]


DAMAGED = "the checkpoint is damaged or not tokenflow's: delete it to resume from the one before"
INCOMPLETE = "the checkpoint is incomplete: delete it to resume from the one before"


@pytest.mark.parametrize("edit,why", [
    (lambda cp: (cp / "orchestrator.json").unlink(), f"{{cp}}/orchestrator.json is missing; {INCOMPLETE}"),
    (lambda cp: (cp / "orchestrator.json").write_text("{"),
     "{cp}/orchestrator.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
     "(char 1)); the checkpoint is damaged: delete it to resume from the one before"),
    (lambda cp: (cp / "orchestrator.json").write_text("[]"), f"{{cp}}/orchestrator.json holds a list, not a dict; {DAMAGED}"),
    (lambda cp: (cp / "orchestrator.json").write_text('{"step": true, "cursor": 1, "next_group_id": 1}'),
     f"{{cp}}/orchestrator.json has no integer 'step'; {DAMAGED}"),
    (lambda cp: (cp / "orchestrator.json").write_text('{"step": 1, "cursor": 1}'),
     f"{{cp}}/orchestrator.json has no integer 'next_group_id'; {DAMAGED}"),
    (lambda cp: (cp / "buffer.pkl").write_bytes(b"x"),
     "{cp}/buffer.pkl is a pickle (a checkpoint from an older tokenflow); it is not loaded, since unpickling a file "
     "runs code. Start the run again, or resume from a checkpoint this version wrote"),
    (lambda cp: (cp / "buffer.safetensors").unlink(), f"{{cp}}/buffer.safetensors is missing; {INCOMPLETE}"),
    (lambda cp: (cp / "buffer.safetensors").write_bytes(b"junk"),
     f"{{cp}}/buffer.safetensors does not read as the buffer's rollouts (4 bytes: too short for a safetensors header); "
     f"{DAMAGED}"),
    (lambda cp: (cp / "buffer.json").write_text("{}"),
     f"{{cp}}/buffer.json has no valid engine_version, rollouts_admitted, in_flight, ready, age_histogram; {DAMAGED}"),
])
def test_what_a_checkpoint_must_hold_is_refused_by_file(tmp_path, edit, why):
    _, cp = committed(tmp_path)
    edit(cp)
    with pytest.raises(CheckpointError) as e:
        RunDir.load_checkpoint(cp)
    assert str(e.value) == why.format(cp=cp)


def test_a_buffer_state_with_bad_fields_or_counts_is_refused(tmp_path):
    write_buffer_state(tmp_path, buffer_state())
    state = json.loads((tmp_path / "buffer.json").read_text())
    bad = {**state, "engine_version": True, "in_flight": [[1]], "age_histogram": {"x": 1}}
    bad.pop("rollouts_admitted")
    (tmp_path / "buffer.json").write_text(json.dumps(bad))
    with pytest.raises(CheckpointError) as e:
        read_buffer_state(tmp_path)
    assert "has no valid engine_version, rollouts_admitted, in_flight, age_histogram;" in str(e.value)
    (tmp_path / "buffer.json").write_text(json.dumps({**state, "ready": [[2, 3]]}))
    with pytest.raises(CheckpointError, match=r"buffer.json lists 3 rollouts, the file holds 1"):
        read_buffer_state(tmp_path)
    (tmp_path / "buffer.json").write_text(json.dumps({**state, "age_histogram": {"-1": 2}, "ready": [[2, 1]]}))
    assert read_buffer_state(tmp_path)["age_histogram"] == {"-1": 2}


def test_only_whole_step_folders_count_and_a_damaged_one_is_set_aside(tmp_path, caplog):
    run, _ = committed(tmp_path, step=2)
    committed(tmp_path, step=10)
    (run.checkpoints / "notes.txt").write_text("x")
    (run.checkpoints / "other").mkdir()
    assert [p.name for p in run.complete_checkpoints()] == ["step_000002", "step_000010"]
    (run.checkpoint_dir(10) / "orchestrator.json").write_text("{}")
    with caplog.at_level(logging.WARNING):
        assert run.latest_checkpoint() == run.checkpoint_dir(2)
    assert (run.checkpoints / ".bad-step_000010").is_dir() and not run.checkpoint_dir(10).exists()
    assert caplog.records[0].getMessage() == (
        f"checkpoint {run.checkpoint_dir(10)} is damaged (orchestrator.json has 2 bytes, the manifest says 50); "
        "set aside as .bad-step_000010, using the one before it")
    assert RunDir(tmp_path / "nowhere").complete_checkpoints() == [] and RunDir(tmp_path / "nowhere").latest_checkpoint() is None


def test_only_the_last_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3):
        run, _ = committed(tmp_path, step=step, keep=2)
    assert [p.name for p in run.complete_checkpoints()] == ["step_000002", "step_000003"]
    run, _ = committed(tmp_path, step=3, keep=2)  # the same step again replaces it
    assert [p.name for p in run.complete_checkpoints()] == ["step_000002", "step_000003"]


def test_a_run_is_finished_when_its_summary_and_last_checkpoint_reach_the_steps(tmp_path):
    run, _ = committed(tmp_path, step=4)
    assert run.finished(4) is None  # no summary
    run.summary.write_text("{not json")
    assert run.finished(4) is None
    run.summary.write_text(json.dumps({"steps": 4}))
    assert run.finished(4) == {"steps": 4} and run.finished(5) is None
    run.summary.write_text(json.dumps({"steps": 9}))
    assert run.finished(9) is None  # the last checkpoint is step 4


def test_reset_forgets_the_logs_and_the_staging_folders(tmp_path):
    run, _ = committed(tmp_path)
    for path in (run.metrics, run.ledger, run.rollouts, run.summary, run.calibration, run.workers):
        path.write_text("x")
    run.trace_dir.mkdir()
    (run.root / "tensorboard").mkdir()
    run.staging_dir(7)
    run.staging_dir(7)  # a second staging of a step starts empty
    run.reset()
    assert sorted(p.name for p in run.root.iterdir()) == [".tokenflow-run", "checkpoints"]  # the marker stays
    assert [p.name for p in run.checkpoints.iterdir()] == ["step_000002"]


def test_the_rollout_log_and_what_a_resume_drops(tmp_path):
    run = RunDir(tmp_path).create()
    r = Rollout([1, 2], [3], [-0.5], [1], group_id=4, prompt_id=9, sample_index=1, reward=0.5, text="x",
                finish_reason="stop", token_rewards=[0.25], info={"engine": "engine1"})
    run.append_rollouts(3, [r])
    assert json.loads(run.rollouts.read_text()) == {
        "step": 3, "group_id": 4, "prompt_id": 9, "sample_index": 1, "prompt_ids": [1, 2], "completion_ids": [3],
        "logprobs": [-0.5], "versions": [1], "reward": 0.5, "failed": False, "finish_reason": "stop", "text": "x",
        "engine": "engine1", "token_rewards": [0.25]}
    run.metrics.write_text("".join(json.dumps(x) + "\n" for x in (
        {"step": 0, "eval/accuracy": 0.1}, {"step": 1}, {"step": 2, "loss": 1.0}, {"step": 2, "eval/accuracy": 0.5},
        {"step": 3}, {"eval/accuracy": 0.2})))
    run.ledger.write_text("".join(json.dumps({"step": s, "prompt_ids": [s]}) + "\n" for s in (1, 2, 3)))
    run.truncate_after(2)
    # the evaluation at step 2 ran after its checkpoint: dropped; the step-0 one (no "step": 0) kept
    assert [json.loads(x) for x in run.metrics.read_text().splitlines()] == [
        {"step": 0, "eval/accuracy": 0.1}, {"step": 1}, {"step": 2, "loss": 1.0}, {"eval/accuracy": 0.2}]
    assert [json.loads(x)["step"] for x in run.ledger.read_text().splitlines()] == [1, 2]
    assert run.rollouts.read_text() == ""  # step 3's rollouts
    run.truncate_after(0)
    assert [json.loads(x) for x in run.metrics.read_text().splitlines()] == [
        {"step": 0, "eval/accuracy": 0.1}, {"eval/accuracy": 0.2}]


def test_two_ready_groups_come_back_each_with_its_own_rollouts(tmp_path):
    ready = {5: [Rollout([1], [2], [0.0], [0], group_id=5)] * 2, 3: [Rollout([1], [7], [0.0], [0], group_id=3)]}
    write_buffer_state(tmp_path, buffer_state(ready))
    back = read_buffer_state(tmp_path)["ready"]
    assert {g: [r.completion_ids.tolist() for r in rs] for g, rs in back.items()} == {3: [[7]], 5: [[2], [2]]}


def test_a_run_folder_and_a_staging_folder_are_made_with_their_parents(tmp_path):
    run = RunDir(tmp_path / "a" / "b").create()
    assert run.checkpoints.is_dir()
    assert RunDir(tmp_path / "c" / "d").staging_dir(1).is_dir()
    RunDir(tmp_path / "e").reset()  # nothing to forget: no error


def test_a_non_finite_number_never_reaches_a_checkpoint(tmp_path):
    run = RunDir(tmp_path).create()
    with pytest.raises(ValueError):
        run.commit_checkpoint(run.staging_dir(1), 1, {**STATE, "baseline_accuracy": float("nan")}, buffer_state(), keep=1)
    with pytest.raises(ValueError):
        write_buffer_state(tmp_path, {**buffer_state(), "engine_version": float("inf")})


def test_a_failed_write_says_whether_an_earlier_checkpoint_is_there_and_what_to_fix(tmp_path, monkeypatch):
    import errno

    import tokenflow.runtime.run.run_dir as run_dir

    def denied(root):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(run_dir, "write_manifest", denied)
    run = RunDir(tmp_path).create()
    with pytest.raises(CheckpointError) as e:
        run.commit_checkpoint(run.staging_dir(3), 3, STATE, buffer_state(), keep=1)
    assert str(e.value) == ("writing checkpoint step 3 failed ([Errno 13] Permission denied); no earlier checkpoint "
                            "exists; fix the cause, then resume")
    assert list(run.checkpoints.iterdir()) == []


def test_a_second_damaged_copy_of_a_step_replaces_the_first_set_aside(tmp_path):
    run, _ = committed(tmp_path, step=2)
    committed(tmp_path, step=10)
    old_bad = run.checkpoints / ".bad-step_000010"
    old_bad.mkdir()
    (old_bad / "stale").write_text("x")
    (run.checkpoint_dir(10) / "orchestrator.json").write_text("{}")
    assert run.latest_checkpoint() == run.checkpoint_dir(2)
    assert not (old_bad / "stale").exists() and (old_bad / "orchestrator.json").read_text() == "{}"


def test_a_summary_without_steps_is_not_finished(tmp_path):
    run, _ = committed(tmp_path, step=4)
    run.summary.write_text("{}")
    assert run.finished(0) is None


def test_a_rollout_without_token_rewards_logs_null_and_stepless_rows_survive_a_resume(tmp_path):
    run = RunDir(tmp_path).create()
    run.append_rollouts(1, [Rollout([1], [2], [0.0], [0])])
    assert json.loads(run.rollouts.read_text())["token_rewards"] is None
    # no metrics file: the prompt ledger is still cut
    run.ledger.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    run.truncate_after(1)
    assert [json.loads(x)["step"] for x in run.ledger.read_text().splitlines()] == [1]
    run.metrics.write_text("".join(json.dumps(x) + "\n" for x in ({"eval/accuracy": 0.3}, {"step": 1, "eval/accuracy": 0.4},
                                                                   {"step": 1, "loss": 2.0})))
    run.truncate_after(1)  # the evaluation at step 1 goes; a row without a step counts as step 0
    assert [json.loads(x) for x in run.metrics.read_text().splitlines()] == [{"eval/accuracy": 0.3}, {"step": 1, "loss": 2.0}]


def test_in_flight_files_are_committed_byte_for_byte_and_load_back_as_kept_rollouts(tmp_path):
    """What `commit_checkpoint` is handed as ``files`` (the in-flight rollouts) lands in the
    checkpoint as given, in its manifest, and loads back as the kept groups of that step."""
    from tokenflow.runtime.run.inflight_files import encode_inflight

    partial = Rollout([1, 2], [5, 6], [-0.25, -0.5], [1, 2], group_id=3, prompt_id=7, sample_index=1,
                      finish_reason="abort")
    files = encode_inflight(2, {3: [partial]}, [4])
    run = RunDir(tmp_path / "run").create()
    staging = run.staging_dir(2)
    (staging / "trainer_state.pt").write_bytes(b"t")
    cp = run.commit_checkpoint(staging, 2, STATE, buffer_state(), keep=3, files=files)
    for name, data in files.items():
        assert (cp / name).read_bytes() == data
    assert set(files) <= set(json.loads((cp / "manifest.json").read_text())["files"])
    assert verify_checkpoint(cp) is None
    state, _ = RunDir.load_checkpoint(cp)
    groups, unkeepable, _ = state["kept"]
    assert unkeepable == [4] and list(groups) == [3]
    (back,) = groups[3]
    assert back.completion_ids.tolist() == [5, 6] and back.versions.tolist() == [1, 2]
    assert back.logprobs.tolist() == [-0.25, -0.5] and back.finish_reason == "abort"


def test_in_flight_files_of_another_step_are_refused(tmp_path):
    """A checkpoint of step 2 holding step 1's in-flight index (a copied or forged file) does not
    load: resuming would continue rollouts from another point of the run."""
    from tokenflow.runtime.run.inflight_files import encode_inflight

    run = RunDir(tmp_path / "run").create()
    staging = run.staging_dir(2)
    files = encode_inflight(1, {3: [Rollout([1], [5], [-0.25], [1], group_id=3, finish_reason="abort")]}, [])
    cp = run.commit_checkpoint(staging, 2, STATE, buffer_state(), keep=3, files=files)
    with pytest.raises(CheckpointError, match=r"inflight.json is not an index of in-flight groups of step 2"):
        RunDir.load_checkpoint(cp)


def test_a_staging_folder_is_discarded_and_a_missing_one_is_no_error(tmp_path):
    run = RunDir(tmp_path / "run").create()
    staging = run.staging_dir(5)
    (staging / "trainer_state.pt").write_bytes(b"t")
    run.discard_staging(staging)
    assert not staging.exists() and run.checkpoints.is_dir()
    run.discard_staging(staging)  # a write that failed before its folder was made

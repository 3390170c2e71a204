"""The verdicts `tokenflow bench chaos` takes from bench/chaos_checks.py, on hand-made ledgers,
metric files, checkpoints, /dev/shm entries and weights with a known loss, repeat, duplicate,
damage or difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tokenflow.bench import chaos_checks
from tokenflow.runtime.run import resources
from tokenflow.runtime.run.run_dir import write_manifest


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_folder(tmp_path: Path, ledger: list[dict], steps: int, in_flight: list[int]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "prompts.jsonl", ledger)
    (run / "summary.json").write_text(json.dumps({"steps": steps, "in_flight_prompt_ids": in_flight}))
    return run


CLEAN = [{"step": 1, "prompt_ids": [0, 1]}, {"step": 2, "prompt_ids": [2, 3]}, {"step": 3, "prompt_ids": [4, 5]}]


def test_prompt_accounting_of_a_clean_run(tmp_path):
    out = chaos_checks.prompt_accounting(run_folder(tmp_path, CLEAN, 3, [6, 7]))
    assert out == {"prompts_consumed": 6, "prompts_repeated": 0, "prompts_lost": 0,
                   "ledger_steps_missing": 0, "ledger_steps_repeated": 0}


def test_prompt_accounting_finds_a_lost_prompt(tmp_path):
    ledger = [CLEAN[0], {"step": 2, "prompt_ids": [2]}, CLEAN[2]]  # 3 never consumed, not in flight
    out = chaos_checks.prompt_accounting(run_folder(tmp_path, ledger, 3, [6, 7]))
    assert (out["prompts_lost"], out["prompts_repeated"], out["prompts_consumed"]) == (1, 0, 5)


def test_prompt_accounting_finds_a_repeat_and_the_gap_it_leaves(tmp_path):
    ledger = [CLEAN[0], CLEAN[1], {"step": 3, "prompt_ids": [3, 4]}]  # 3 twice, 5 never
    out = chaos_checks.prompt_accounting(run_folder(tmp_path, ledger, 3, [6]))
    assert (out["prompts_repeated"], out["prompts_lost"]) == (1, 1)


def test_prompt_accounting_counts_dynamic_samplings_dropped_prompts_as_seen(tmp_path):
    ledger = [{"step": 1, "prompt_ids": [0, 2], "dropped_prompt_ids": [1]}, {"step": 2, "prompt_ids": [3, 4]}]
    assert chaos_checks.prompt_accounting(run_folder(tmp_path, ledger, 2, []))["prompts_lost"] == 0
    ledger[1]["dropped_prompt_ids"] = [1]  # dropped twice: a repeat
    (tmp_path / "run" / "prompts.jsonl").unlink()
    write_jsonl(tmp_path / "run" / "prompts.jsonl", ledger)
    assert chaos_checks.prompt_accounting(tmp_path / "run")["prompts_repeated"] == 1


def test_prompt_accounting_finds_missing_and_repeated_ledger_steps(tmp_path):
    ledger = [CLEAN[0], CLEAN[1], {"step": 2, "prompt_ids": [4, 5]}]  # step 2 twice, step 3 never
    out = chaos_checks.prompt_accounting(run_folder(tmp_path, ledger, 3, []))
    assert (out["ledger_steps_missing"], out["ledger_steps_repeated"]) == (1, 1)
    assert out["prompts_lost"] == out["prompts_repeated"] == 0


def test_prompt_accounting_of_nothing_consumed(tmp_path):
    out = chaos_checks.prompt_accounting(run_folder(tmp_path, [], 0, []))
    assert out == {"prompts_consumed": 0, "prompts_repeated": 0, "prompts_lost": 0,
                   "ledger_steps_missing": 0, "ledger_steps_repeated": 0}


def test_metric_rows_finds_duplicated_and_missing_rows(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    train = [{"step": s, "loss/total": 0.1} for s in (1, 2, 2, 4)]  # step 2 twice, 3 missing
    evals = [{"step": 0, "eval/accuracy": 0.5}, {"step": 4, "eval/accuracy": 0.6}, {"step": 4, "eval/accuracy": 0.6}]
    write_jsonl(run / "metrics.jsonl", [*train, *evals, {"step": 4, "sync/bytes": 1.0}])
    assert chaos_checks.metric_rows(run, 4) == {"metric_rows_duplicated": 2, "metric_steps_missing": 1}
    write_jsonl(run / "metrics.jsonl", [{"step": s, "loss/total": 0.1} for s in (1, 2, 3, 4)])
    assert chaos_checks.metric_rows(run, 4) == {"metric_rows_duplicated": 0, "metric_steps_missing": 0}
    assert chaos_checks.metric_rows(run, 5)["metric_steps_missing"] == 1


def checkpoint(root: Path, name: str, *, manifest: bool = True) -> Path:
    cp = root / "checkpoints" / name
    (cp / "model").mkdir(parents=True)
    (cp / "orchestrator.json").write_text('{"step": 1}')
    (cp / "model" / "w.bin").write_bytes(b"weights")
    if manifest:
        write_manifest(cp)
    return cp


def test_checkpoints_counts_whole_damaged_set_aside_and_staging_folders(tmp_path):
    run = tmp_path / "run"
    checkpoint(run, "step_000001")
    bad = checkpoint(run, "step_000002")
    (bad / "model" / "w.bin").write_bytes(b"weightz")  # same size, another checksum
    checkpoint(run, "step_000003", manifest=False)  # a write that never finished
    checkpoint(run, ".bad-step_000000")
    checkpoint(run, ".tmp-step_000004", manifest=False)
    assert chaos_checks.checkpoints(run) == {"checkpoints": 3, "checkpoints_bad": 2,
                                             "checkpoints_set_aside": 1, "staging_left": 1}
    assert chaos_checks.checkpoints(tmp_path / "none") == {"checkpoints": 0, "checkpoints_bad": 0,
                                                           "checkpoints_set_aside": 0, "staging_left": 0}


def test_shm_left_names_only_the_runs_own_entries(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(resources, "SHM_DIR", shm)
    a, b = tmp_path / "a", tmp_path / "b"
    ta, tb = resources.run_tag(a), resources.run_tag(b)
    for name in (f"{ta}_slot0", f"sem.{ta}-lock", f"{tb}_slot0", "other_segment", f"x{ta}_slot"):
        (shm / name).write_bytes(b"")
    assert sorted(chaos_checks.shm_left(a)) == sorted([f"{ta}_slot0", f"sem.{ta}-lock"])
    assert sorted(chaos_checks.shm_left(a, b)) == sorted([f"{ta}_slot0", f"sem.{ta}-lock", f"{tb}_slot0"])
    assert chaos_checks.shm_left(tmp_path / "c") == []


def weights(cp: Path, shards: list[dict[str, torch.Tensor]]) -> Path:
    (cp / "model").mkdir(parents=True)
    for i, shard in enumerate(shards):
        save_file(shard, str(cp / "model" / f"model-{i:05d}.safetensors"))
    return cp


def test_weights_diff_is_the_largest_absolute_difference(tmp_path):
    w = {"a": torch.zeros(3, 2), "b": torch.arange(4.0)}
    same = weights(tmp_path / "same", [w])
    assert chaos_checks.weights_diff(same, weights(tmp_path / "copy", [{k: v.clone() for k, v in w.items()}])) == 0.0
    # sharded differently, same tensors: equal
    assert chaos_checks.weights_diff(same, weights(tmp_path / "sharded", [{"a": w["a"]}, {"b": w["b"]}])) == 0.0
    moved = {"a": w["a"].clone(), "b": w["b"].clone()}
    moved["a"][1, 0] = -0.25
    moved["b"][3] += 0.125
    assert chaos_checks.weights_diff(same, weights(tmp_path / "moved", [moved])) == 0.25
    assert chaos_checks.weights_diff(weights(tmp_path / "moved2", [moved]), same) == 0.25  # symmetric


@pytest.mark.parametrize("other", [{"a": torch.zeros(3, 2)}, {"a": torch.zeros(3, 2), "c": torch.arange(4.0)},
                                   {"a": torch.zeros(2, 3), "b": torch.arange(4.0)}])
def test_weights_diff_is_infinite_when_names_or_shapes_differ(tmp_path, other):
    w = weights(tmp_path / "w", [{"a": torch.zeros(3, 2), "b": torch.arange(4.0)}])
    assert chaos_checks.weights_diff(w, weights(tmp_path / "other", [other])) == float("inf")


def test_weights_diff_of_two_empty_checkpoints(tmp_path):
    assert chaos_checks.weights_diff(weights(tmp_path / "a", []), weights(tmp_path / "b", [])) == 0.0

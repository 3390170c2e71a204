"""A checkpoint keeps the rollouts in flight, and a run resumed after a SIGKILL continues them
from their saved tokens: the trainer trains on the saved ids, log-probs and versions bit for bit,
followed by what the engine sampled after the resume, and no prompt is lost or repeated."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.runtime_testlib import SMALL, first_checkpoint, ledger, start_cli, step_rows, wait_until
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.run.inflight_files import read_inflight
from tokenflow.runtime.run.run_dir import RunDir

pytestmark = pytest.mark.slow  # real processes

STEPS = 12  # the first run is killed at its first checkpoint holding a partial rollout: more chances


def _holds_a_partial(ckpt: Path) -> bool:
    groups, _, _ = read_inflight(ckpt, int(ckpt.name.split("_")[-1]))
    return any(r.finish_reason == "abort" for rs in groups.values() for r in rs)


def _with_partials(run: Path) -> Path | None:
    """The first whole checkpoint (before the last step) that kept a partial rollout."""
    return first_checkpoint(run, STEPS, _holds_a_partial)


@pytest.mark.timeout(240)
def test_a_resumed_run_continues_the_rollouts_in_flight_from_their_saved_tokens(tmp_path, default_model):
    run = tmp_path / "run"
    args = [*SMALL, "--output-dir", str(run), "--run.steps", str(STEPS), "--run.checkpoint_every", "1",
            "--run.keep_checkpoints", "20", "--rollout.max_staleness", "2", "--run.save_rollouts", "true",
            "--run.eval_limit", "4",
            # One group decoded at a time: generation is the bottleneck, so every checkpoint finds
            # samples mid-generation (with 256 slots the tiny model finishes a step's groups before
            # the trainer does, and a fast machine checkpoints nothing in flight).
            "--engine.max_num_seqs", "4"]
    proc = start_cli(args, tmp_path / "first.log")
    try:
        wait_until(lambda: _with_partials(run) is not None, 120, "a checkpoint with a partial rollout", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ckpt = _with_partials(run)
    step = int(ckpt.name.split("_")[-1])
    for later in RunDir(run).complete_checkpoints():  # as if killed right after this checkpoint
        if later > ckpt:
            shutil.rmtree(later)
    saved, _, _ = read_inflight(ckpt, step)
    proc = start_cli(["--resume", str(run), "--metrics.progress", "false"], tmp_path / "second.log")
    assert proc.wait(timeout=180) == 0, (tmp_path / "second.log").read_text()[-3000:]

    summary = json.loads((run / "summary.json").read_text())
    counts = summary["inflight_on_resume"]
    kept = [r for rs in saved.values() for r in rs]
    assert counts["kept_rollouts"] == len(kept) >= 1, counts
    assert counts["kept_tokens"] == sum(r.num_tokens for r in kept)
    # Exactly once: every step logged once, every prompt consumed once, none lost.
    assert [r["step"] for r in step_rows(run)] == list(range(1, STEPS + 1))
    consumed = [p for line in ledger(run) for p in line["prompt_ids"]]
    assert len(consumed) == len(set(consumed)) == STEPS * 4
    assert sorted(consumed + summary["in_flight_prompt_ids"]) == list(range(len(consumed) + len(summary["in_flight_prompt_ids"])))

    trained = {(r["group_id"], r["sample_index"]): r for r in read_jsonl(run / "rollouts.jsonl") if r["step"] > step}
    continued = 0
    for r in kept:
        row = trained.get((r.group_id, r.sample_index))
        if row is None:  # still in flight when the run ended (aborted, like any leftover)
            assert r.prompt_id in summary["in_flight_prompt_ids"]
            continue
        n = r.num_tokens
        ids, lps, versions = (np.asarray(row[k]) for k in ("completion_ids", "logprobs", "versions"))
        assert np.array_equal(ids[:n].astype(np.int32), r.completion_ids), "the saved tokens were not kept"
        assert np.array_equal(lps[:n].astype(np.float32), r.logprobs), "the saved behaviour log-probs changed"
        assert np.array_equal(versions[:n].astype(np.int32), r.versions), "the saved versions changed"
        assert (versions[:n] <= step).all() and (versions[n:] >= step).all()
        if r.finish_reason == "abort":
            continued += 1
            assert len(ids) > n or row["finish_reason"] in ("stop", "length")
        else:
            assert len(ids) == n and row["finish_reason"] == r.finish_reason
    assert continued >= 1
    _check_the_continuation_is_the_engines(run, ckpt, step, kept, trained, default_model)


def _check_the_continuation_is_the_engines(run, ckpt, step, kept, trained, default_model) -> None:
    """The tokens after the saved ones are what the engine samples from the saved prefix with the
    checkpoint's weights and the sample's own seed (up to the first token of newer weights)."""
    from tokenflow.config.engine import EngineConfig
    from tokenflow.config.loading import load_config
    from tokenflow.config.root import TrainConfig
    from tokenflow.engine import Engine, SamplingParams
    from tokenflow.runtime.orchestrator.seeds import request_seed

    cfg = load_config(TrainConfig, run / "config.toml", [])
    engine = Engine(ckpt / "model", EngineConfig(device="cpu", threads=1, version=step))
    compared = 0
    for r in (r for r in kept if r.finish_reason == "abort" and (r.group_id, r.sample_index) in trained):
        row = trained[(r.group_id, r.sample_index)]
        versions = np.asarray(row["versions"])
        same = int(np.argmax(versions[r.num_tokens:] != step)) if (versions[r.num_tokens:] != step).any() \
            else len(versions) - r.num_tokens
        if same == 0:
            continue
        s = cfg.sampling
        params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=r.num_tokens + same,
                                stop=tuple(s.stop), n=1, seed=request_seed(cfg.run.seed, r.prompt_id))
        engine.add_request(r.prompt_ids.tolist(), params, request_id="check", resume=r)
        (out,) = [x for x in engine.stream()]
        assert out.completion_ids.tolist() == row["completion_ids"][:r.num_tokens + same]
        compared += 1
    assert compared >= 1, "no continued rollout ran on the checkpoint's weights alone"

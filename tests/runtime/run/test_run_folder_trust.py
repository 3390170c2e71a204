"""A run folder from elsewhere runs no code: checkpoints hold JSON, safetensors and a tensors-only
trainer state, and a file that does not read as what it should be (damaged, or rewritten
together with its manifest by someone who wants code run) stops the resume with one line naming
the file (exit 2), before anything in it is executed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.runtime_testlib import SMALL
from tokenflow.rollout import Rollout
from tokenflow.rollout_files import KEY, RolloutFileError, decode, encode
from tokenflow.runtime.run.run_dir import RunDir, write_manifest


class Payload:
    """Unpickling this creates ``marker``: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def full_rollout(i: int) -> Rollout:
    rng = np.random.default_rng(i)
    n = 5
    return Rollout(
        prompt_ids=rng.integers(0, 100, 3), completion_ids=rng.integers(0, 100, n),
        logprobs=rng.normal(size=n).astype(np.float32), versions=np.array([0, 0, 1, 1, 2]),
        finish_reason="stop", temperature=0.7, support_logmass=-rng.random(n).astype(np.float32),
        support=[None, np.array([1, 5, 9]), np.array([], dtype=np.int32), None, np.array([7])],
        loss_mask=np.array([1, 1, 0, 1, 1]), request_id=f"r{i}", sample_index=i, group_id=3, prompt_id=11,
        reward=0.5, rewards={"correct": 1.0}, token_rewards=rng.normal(size=n), failed=False, text="x + y",
        info={"scorer": {"k": np.float32(0.25)}, "nan": float("nan")},
        routed_experts=rng.integers(0, 4, (3 + n - 1, 2, 2)).astype(np.uint8),
        turns=np.array([0, 0, 0, 1, 1]),
        top_logprobs=[(np.array([3, 4]), np.array([-0.1, -np.inf], dtype=np.float32))] * n)


def test_rollouts_come_back_bit_for_bit():
    rollouts = [full_rollout(i) for i in range(3)] + [Rollout([1], [2], [-0.5], [0])]
    back = decode(encode(rollouts))
    assert len(back) == len(rollouts)
    for a, b in zip(rollouts, back):
        for name in ("prompt_ids", "completion_ids", "logprobs", "versions", "support_logmass", "loss_mask",
                     "token_rewards", "routed_experts", "turns"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(x, y)), name
        assert [None if s is None else s.tolist() for s in (a.support or [])] == \
               [None if s is None else s.tolist() for s in (b.support or [])]
        assert (a.top_logprobs is None) == (b.top_logprobs is None)
        for (ia, la), (ib, lb) in zip(a.top_logprobs or [], b.top_logprobs or []):
            assert np.array_equal(ia, ib) and np.array_equal(la, lb)
        for name in ("finish_reason", "temperature", "request_id", "sample_index", "group_id", "prompt_id",
                     "reward", "rewards", "failed", "text"):
            assert getattr(a, name) == getattr(b, name), name
    assert back[0].info == {"scorer": {"k": 0.25}, "nan": None}  # strict JSON: no bare NaN


def reforged(edit_records) -> bytes:
    """A genuine blob whose JSON records ``edit_records`` changed (the tensors kept)."""
    from safetensors.numpy import load, save

    blob = encode([full_rollout(0)])
    records = json.loads(json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])["__metadata__"][KEY])
    return save(load(blob), metadata={KEY: json.dumps(edit_records(records))})


@pytest.mark.parametrize("forge, why", [
    (lambda: encode([full_rollout(0)])[:20], "header claims"),
    (lambda: b"\x04\x00\x00\x00\x00\x00\x00\x00{}  ", "no rollout records"),
    (lambda: reforged(lambda r: [{**r[0], "__class__": "os.system"}]), "fields a Rollout does not"),
    (lambda: reforged(lambda r: [{**r[0], "arrays": ["prompt_idz"]}]), "fields a Rollout does not"),
    (lambda: reforged(lambda r: [{**r[0], "arrays": [*r[0]["arrays"], "text"]}]), "names array"),
    (lambda: reforged(lambda r: {"not": "a list"}), "not a list"),
    (lambda: reforged(lambda r: [{**r[0], "sample_index": "a"}, 3]), "not an object"),
])
def test_a_forged_blob_is_refused_with_what_is_wrong(forge, why):
    with pytest.raises(RolloutFileError, match=why):
        decode(forge())


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory) -> Path:
    """A real 2-step run with a checkpoint at step 1 (and the final one at step 2)."""
    run = tmp_path_factory.mktemp("trust") / "run"
    args = [*SMALL, "--output-dir", str(run), "--run.steps", "2", "--run.checkpoint_every", "1",
            "--run.keep_checkpoints", "1", "--run.eval_limit", "4"]
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def tampered(src: Path, dst: Path, edit) -> Path:
    """A copy of ``src`` whose last checkpoint ``edit`` changed and whose manifest was rewritten to
    match (as a forger would): the manifest then says nothing is wrong."""
    shutil.copytree(src, dst)
    (dst / "summary.json").unlink()  # so that --resume resumes instead of reporting a finished run
    ckpt = RunDir(dst).complete_checkpoints()[-1]
    edit(ckpt)
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    return dst


def resume(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", "--resume", str(run),
                           "--run.steps", "3"], capture_output=True, text=True, timeout=300)


def _pickled_buffer(ckpt: Path, marker: Path) -> None:
    import pickle

    (ckpt / "buffer.pkl").write_bytes(pickle.dumps({"ready": Payload(marker)}))


def _evil_trainer_state(ckpt: Path, marker: Path) -> None:
    import torch

    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    state["rng"] = Payload(marker)
    torch.save(state, ckpt / "trainer_state.pt")


def _inflight(ckpt: Path, completion_ids: list[int], group_id: int = 7) -> None:
    """In-flight files holding one partial rollout of ``group_id`` (the manifest is rewritten)."""
    step = json.loads((ckpt / "orchestrator.json").read_text())["step"]
    r = Rollout([1, 2], completion_ids, [-0.5] * len(completion_ids), [0] * len(completion_ids),
                finish_reason="abort", group_id=group_id)
    (ckpt / "inflight.json").write_text(json.dumps({"step": step, "groups": [[group_id, 1]], "unkeepable": []}))
    (ckpt / "inflight.safetensors").write_bytes(encode([r]))


@pytest.mark.parametrize("name, edit, file", [
    ("pickled-buffer", _pickled_buffer, "buffer.pkl"),
    ("torn-inflight-json", lambda c, m: (c / "inflight.json").write_text('{"step": 2, "gro'), "inflight.json"),
    ("inflight-token-outside-the-vocabulary", lambda c, m: _inflight(c, [5, 10**6]),
     "inflight.safetensors holds a rollout of group 7 that has token ids outside"),
    ("inflight-group-not-in-flight", lambda c, m: _inflight(c, [5, 6]),
     "inflight.safetensors holds groups [7] that the buffer does not list as in flight"),
    ("trainer-state-payload", _evil_trainer_state, "trainer_state.pt"),
    ("torn-orchestrator-json", lambda c, m: (c / "orchestrator.json").write_text('{"step": 2, "cur'), "orchestrator.json"),
    ("orchestrator-json-no-step", lambda c, m: (c / "orchestrator.json").write_text('{"step": "2; rm -rf"}'),
     "orchestrator.json"),
    ("forged-buffer-rollouts", lambda c, m: (c / "buffer.safetensors").write_bytes(b"\x10" * 64), "buffer.safetensors"),
    ("buffer-json-counters", lambda c, m: (c / "buffer.json").write_text('{"engine_version": "x"}'), "buffer.json"),
])
@pytest.mark.slow
def test_a_tampered_checkpoint_runs_no_code_and_names_the_file(checkpointed_run, tmp_path, name, edit, file):
    marker = tmp_path / "payload-ran"
    run = tampered(checkpointed_run, tmp_path / name, lambda ckpt: edit(ckpt, marker))
    proc = resume(run)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not marker.exists(), "a payload in the run folder ran"
    assert len(lines) == 1 and file in lines[0] and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _planted_model_code(ckpt: Path, marker: Path) -> None:
    """The checkpoint's model config names model code beside it (``auto_map``) that creates ``marker``."""
    model = ckpt / "model"
    (model / "planted_model.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "planted_model.PlantedConfig",
                          "AutoModelForCausalLM": "planted_model.PlantedForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))


@pytest.mark.slow
def test_trust_remote_code_in_the_folder_runs_no_model_code_it_carries(checkpointed_run, tmp_path):
    marker = tmp_path / "model-code-ran"
    run = tampered(checkpointed_run, tmp_path / "remote-code", lambda ckpt: _planted_model_code(ckpt, marker))
    config = run / "config.toml"
    config.write_text(config.read_text().replace("trust_remote_code = false", "trust_remote_code = true"))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf-modules")}  # where transformers copies the code
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", "--resume", str(run),
                           "--run.steps", "3"], capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert not marker.exists(), "model code the run folder carries ran"
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "trainer.trust_remote_code = true" in lines[0] and "--trust-run-config" in lines[0]


@pytest.mark.slow
def test_a_run_folder_of_an_earlier_version_resumes_and_is_marked(checkpointed_run, tmp_path):
    from tokenflow.runtime.run.folder_guard import MARKER

    run = tmp_path / "old"
    shutil.copytree(checkpointed_run, run)
    for name in ("summary.json", MARKER):  # an earlier tokenflow wrote no marker
        (run / name).unlink()
    proc = resume(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / MARKER).read_text()) == {"format": 1}
    assert json.loads((run / "summary.json").read_text())["steps"] == 3

"""Checkpoints that do not stall training: the trainer answers as soon as its state is copied,
the files written meanwhile hold the state of that moment (not what training did next), and a
write that fails stops the run naming the step, with nothing half-written left."""

from __future__ import annotations

import queue
import resource
import signal
import subprocess
import sys
import threading

import pytest
import torch

from tests.runtime.runtime_testlib import SMALL
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.runtime.run.run_dir import RunDir
from tokenflow.runtime.workers import checkpoint_writer
from tokenflow.runtime.workers.checkpoint_writer import STATE_FILE, CheckpointWriter
from tokenflow.runtime.workers.messages import Saved, SaveWritten
from tokenflow.trainer import Trainer, TrainerConfig


def test_a_background_checkpoint_holds_the_state_it_was_taken_at(tmp_path, monkeypatch):
    """Twice: the second snapshot copies into the first one's buffers, once its write is over."""
    from safetensors.torch import load_file

    trainer = Trainer(tiny_model(seed=1, tie=True), TrainerConfig(device="cpu", lr=3e-3), AlgorithmConfig())
    rollouts = on_policy(trainer.model, make_rollouts(seed=4))
    trainer.train_step(rollouts)  # so that the optimizer has moments to save
    # The real write, held until training has gone on: the overlap a slow disk gives.
    go, real_write = threading.Event(), checkpoint_writer.write_snapshot
    monkeypatch.setattr(checkpoint_writer, "write_snapshot", lambda *a: (go.wait(30), real_write(*a)))
    out: queue.Queue = queue.Queue()
    writer = CheckpointWriter(trainer, out, "trainer", writes=True)
    for k in (1, 2):
        folder = tmp_path / f"ckpt{k}"
        at_save = {n: v.clone() for n, v in trainer.model.state_dict().items()}
        moments = {i: {n: v.clone() for n, v in s.items()} for i, s in trainer.optimizer.state_dict()["state"].items()}
        go.clear()
        writer.save(str(folder), background=True)
        assert isinstance(out.get(timeout=5).message, Saved)  # answered before anything was written
        assert out.empty() and not (folder / STATE_FILE).exists()
        trainer.train_step(rollouts)  # the next step changes the live weights and moments in place
        assert not torch.equal(trainer.model.state_dict()["model.norm.weight"], at_save["model.norm.weight"])
        go.set()
        written = out.get(timeout=30).message
        assert isinstance(written, SaveWritten) and written.error == "", written

        weights = load_file(folder / "model" / "model.safetensors")
        assert "lm_head.weight" not in weights  # tied to the embeddings, stored once as before
        for name, value in weights.items():
            assert torch.equal(value, at_save[name]), f"{name} is not the weight at checkpoint {k}"
        state = torch.load(folder / STATE_FILE, weights_only=True)
        assert state["version"] == k and trainer.version == k + 1
        for i, s in state["optimizer"]["state"].items():
            for n, v in s.items():
                assert torch.equal(v, moments[i][n]), f"optimizer state {i}.{n} is not the one at checkpoint {k}"
    first = load_file(tmp_path / "ckpt1" / "model" / "model.safetensors")
    assert not torch.equal(first["model.norm.weight"], weights["model.norm.weight"])


def _limit_file_size() -> None:
    """In the run's processes: files past 5 MB fail with EFBIG instead of killing the writer (the
    weights, 3.4 MB, fit; the trainer state, 6.9 MB with its Adam moments, does not)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (5 << 20, 5 << 20))


@pytest.mark.slow
def test_a_background_write_that_fails_stops_the_run_naming_the_step(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", *SMALL, "--output-dir", str(run),
                           "--run.checkpoint_every", "1", "--run.eval_limit", "4"],
                          capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    # torch.save reports the refused write as a RuntimeError of its zip writer, not an OSError.
    assert len(errors) == 1 and "writing checkpoint step 1 failed" in errors[0], proc.stderr[-3000:]
    assert "no earlier checkpoint exists; fix the cause, then resume" in errors[0]
    assert "the trainer worker failed" not in proc.stderr  # the trainer lives; the write failed
    assert RunDir(run).complete_checkpoints() == [] and not list((run / "checkpoints").glob(".tmp-*"))

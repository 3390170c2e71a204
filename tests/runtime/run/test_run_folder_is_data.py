"""A run folder is data (issue 35): what people download, share and copy between machines.
Resuming or evaluating one runs no code its config names unless the user says so for that run,
writes nothing through a link it carries, and a folder is a run folder only with tokenflow's
marker (an unrelated folder is never cleaned). Folders of earlier versions still resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.runtime_testlib import SMALL
from tokenflow.config.loading import load_config, to_toml
from tokenflow.config.root import TrainConfig
from tokenflow.errors import RunFolderError
from tokenflow.metrics.safe_files import open_text, write_atomic
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime.run.folder_guard import MARKER, claim_for_new_run, claim_for_resume
from tokenflow.runtime.run.run_dir import write_manifest


def tokenflow(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def planted(folder: Path, name: str, marker: Path, body: str = "") -> str:
    """A file in ``folder`` that creates ``marker`` when imported: proof that its code ran."""
    (folder / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{body}")
    return str(folder / name)


def run_folder(root: Path, *overrides: str) -> Path:
    """A run folder as `tokenflow train` leaves one that died before its first checkpoint (marker,
    config.toml, checkpoints/, .lock), its config with ``overrides``: a 1-step run on prompts in
    the folder itself."""
    root.mkdir(parents=True)
    from tokenflow.tasks.arithmetic import ArithmeticTask

    t = ArithmeticTask()
    rows = [{"prompt": p.text, **p.example} for p in (t.train_prompt(i) for i in range(32))]
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not {"--task.reward", "--task.env"} & set(overrides):
        overrides = ("--task.reward", "tokenflow.tasks.arithmetic:arithmetic_reward", *overrides)
    cfg = load_config(TrainConfig, None, [*SMALL, "--run.steps", "1", "--run.eval_limit", "2", "--task.name", "dataset",
                                          "--task.train_path", str(root / "data.jsonl"), *overrides])
    (root / "config.toml").write_text(to_toml(cfg))
    (root / "checkpoints").mkdir()
    (root / ".lock").write_text("")
    (root / MARKER).write_text('{"format": 1}')
    return root


REWARD = "def reward(prompt, completion, example):\n    return 0.0\n"


@pytest.mark.parametrize("key, extra", [
    ("task.reward", []),
    ("task.env", []),
    ("scorer.token", ["--algorithm.advantage", "reinforce_pp"]),
])
def test_resume_refuses_code_the_folder_names(tmp_path, key, extra):
    marker = tmp_path / "code-ran"
    run = tmp_path / "run"
    spec = f"{run / 'planted.py'}:reward"
    run_folder(run, *(["--task.env", spec] if key == "task.env" else [f"--{key}", spec, *extra]))
    planted(run, "planted.py", marker, REWARD)
    proc = tokenflow("train", "--resume", str(run))
    lines = error_lines(proc)
    assert not marker.exists(), "code the run folder named ran"
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and key in lines[0] and "--trust-run-config" in lines[0], proc.stderr[-3000:]
    # Said so for this run (a dry run: the refusal is lifted, nothing is imported yet).
    assert tokenflow("train", "--resume", str(run), "--trust-run-config", "--dry-run").returncode == 0
    assert tokenflow("train", "--resume", str(run), f"--{key}", spec, "--dry-run").returncode == 0


def checkpoint_of_the_shipped_model(run: Path) -> None:
    """A complete checkpoint (model and manifest) holding the shipped model: what eval reads."""
    ckpt = run / "checkpoints" / "step_000001"
    shutil.copytree(resolve_model_path("default"), ckpt / "model")
    write_manifest(ckpt)


def test_eval_refuses_a_reward_file_the_folder_names(tmp_path):
    marker = tmp_path / "code-ran"
    run = run_folder(tmp_path / "run", "--task.reward", f"{tmp_path / 'run' / 'planted.py'}:reward")
    planted(run, "planted.py", marker, REWARD)
    checkpoint_of_the_shipped_model(run)
    proc = tokenflow("eval", str(run), "--limit", "2")
    lines = error_lines(proc)
    assert not marker.exists(), "code the run folder named ran"
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "task.reward" in lines[0] and "--trust-run-config" in lines[0]


@pytest.mark.parametrize("link", [".lock", "workers.tmp"])
def test_resume_writes_nothing_through_a_link_the_folder_carries(tmp_path, link):
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("someone's file\n")
    run = run_folder(tmp_path / "run")
    (run / link).unlink(missing_ok=True)
    (run / link).symlink_to(victim)
    proc = tokenflow("train", "--resume", str(run))
    lines = error_lines(proc)
    assert victim.read_text() == "someone's file\n", "a file outside the run folder was written"
    assert proc.returncode == 2 and len(lines) == 1 and link in lines[0] and "symbolic link" in lines[0], \
        proc.stderr[-3000:]


def test_a_file_tokenflow_writes_is_never_written_through_a_link(tmp_path):
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("kept\n")
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(RunFolderError, match="metrics.jsonl is a symbolic link"):
        open_text(tmp_path / "metrics.jsonl", "a")
    (tmp_path / "summary.json").symlink_to(victim)
    write_atomic(tmp_path / "summary.json", "{}")  # replaces the link, not what it points to
    assert victim.read_text() == "kept\n"
    assert not (tmp_path / "summary.json").is_symlink() and (tmp_path / "summary.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.txt", "metrics.jsonl", "summary.json"]


def test_an_unrelated_folder_is_never_taken_for_a_run_folder(tmp_path):
    mine = tmp_path / "notes"
    for rel, text in [("config.toml", 'title = "my notes"\n'), ("trace/today.txt", "x"),
                      ("tensorboard/events.out", "y")]:
        (mine / rel).parent.mkdir(parents=True, exist_ok=True)
        (mine / rel).write_text(text)
    before = {str(p.relative_to(mine)): p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    proc = tokenflow("train", "--output-dir", str(mine), *SMALL, "--run.steps", "1")
    lines = error_lines(proc)
    assert {str(p.relative_to(mine)): p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before
    assert proc.returncode == 2 and len(lines) == 1 and MARKER in lines[0], proc.stderr[-3000:]
    proc = tokenflow("train", "--resume", str(mine))
    assert proc.returncode == 2 and MARKER in proc.stderr, proc.stderr[-3000:]


def test_a_run_folder_of_an_earlier_version_resumes_and_is_marked(tmp_path):
    run = run_folder(tmp_path / "old")
    (run / MARKER).unlink()
    claim_for_resume(run, mark=False)  # what the CLI checks before reading the config: accepted, unchanged
    assert not (run / MARKER).exists()
    claim_for_resume(run)
    assert json.loads((run / MARKER).read_text()) == {"format": 1}
    partial = tmp_path / "partial"
    shutil.copytree(run, partial)
    for name in (MARKER, ".lock"):
        (partial / name).unlink()
    with pytest.raises(RunFolderError, match=r"no \.tokenflow-run marker .* and no \.lock"):
        claim_for_resume(partial)
    with pytest.raises(RunFolderError, match="not empty and holds no"):
        claim_for_new_run(partial)
    claim_for_new_run(tmp_path / "new")  # a new or empty folder is fine
    (run / MARKER).write_text('{"format": 99}')
    with pytest.raises(RunFolderError, match="newer tokenflow"):
        claim_for_resume(run)

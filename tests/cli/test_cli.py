"""The command line: a cheap import, a dry run, errors that name the problem."""

from __future__ import annotations

import subprocess
import sys
import tomllib


def tokenflow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_import_is_light():
    code = ("import time, sys; t = time.perf_counter(); import tokenflow; dt = time.perf_counter() - t; "
            "heavy = [m for m in ('torch', 'transformers', 'ray', 'matplotlib', 'numpy') if m in sys.modules]; "
            "print(dt, heavy)")
    times = []
    for _ in range(3):  # the best of three: the first import may pay for a cold disk cache
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
        times.append(float(out[0]))
        assert out[1].strip() == "[]"
    assert min(times) < 0.2


def test_dry_run_prints_the_resolved_config():
    r = tokenflow("train", "--dry-run", "--algorithm.clip_high", "0.28", "--rollout.max_staleness=0")
    assert r.returncode == 0, r.stderr
    cfg = tomllib.loads(r.stdout)
    assert cfg["algorithm"]["clip_high"] == 0.28
    assert cfg["rollout"]["max_staleness"] == 0
    assert cfg["task"]["name"] == "arithmetic" and cfg["model"]["path"] == "default"
    assert cfg["trainer"]["rollouts_per_step"] == cfg["rollout"]["prompts_per_step"] * cfg["rollout"]["group_size"]


def test_unknown_key_is_refused_with_the_valid_ones():
    r = tokenflow("train", "--dry-run", "--rollout.max_stalenes", "1")
    assert r.returncode == 2
    assert "unknown key 'rollout.max_stalenes'" in r.stderr and "max_staleness" in r.stderr


def test_help_config_documents_every_key():
    r = tokenflow("train", "--help-config")
    assert r.returncode == 0
    assert "rollout.max_staleness = 1" in r.stdout
    assert "Admission bound K" in r.stdout


def test_existing_run_folder_is_not_overwritten(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    r = tokenflow("train", "--output-dir", str(tmp_path))
    assert r.returncode == 2 and "--resume" in r.stderr

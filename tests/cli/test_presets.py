"""Defaults a user can predict: presets, library defaults, and --help-config / --dry-run / the run agreeing."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from tokenflow.config.loading import ConfigError, load_config
from tokenflow.config.root import TrainConfig
from tokenflow.config.trainer import TrainerConfig


def tokenflow(*args: str, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:  # a section; an empty table is a key's value ({})
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def parse_help_config(text: str) -> dict:
    """``key = value`` lines of --help-config (value as TOML; ``none`` means unset)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith(" ") and " = " in line:
            key, rest = line.split(" = ", 1)
            value = rest.split("    # library default:")[0]
            out[key] = None if value == "none" else tomllib.loads(f"v = {value}")["v"]
    return out


def test_a_file_naming_no_preset_starts_from_the_library_defaults(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[run]\nsteps = 3\n")
    cfg = load_config(TrainConfig, path)
    assert cfg.trainer.lr == TrainerConfig().lr == 1e-6
    assert cfg.trainer.schedule == "constant"


def test_a_file_starts_from_a_preset_in_one_line(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('preset = "tiny-cpu"\n[run]\nsteps = 7\n[trainer]\nmin_lr_ratio = 0.5\n')
    cfg = load_config(TrainConfig, path)
    assert cfg.trainer.lr == 3e-4 and cfg.trainer.schedule == "cosine"  # from the preset
    assert cfg.trainer.pack_row_tokens == 128 and cfg.engine.device == "cpu"
    assert cfg.run.steps == 7 and cfg.trainer.min_lr_ratio == 0.5  # the file wins
    assert cfg.trainer.total_steps == 7  # derived after merging: the cosine spans this run


def test_an_unknown_preset_names_the_known_ones(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('preset = "tiny-gpu"\n')
    with pytest.raises(ConfigError, match="unknown preset 'tiny-gpu'; presets: tiny-cpu"):
        load_config(TrainConfig, path)


@pytest.mark.slow
def test_help_config_shows_resolved_values_not_field_defaults():
    r = tokenflow("train", "--help-config")
    assert r.returncode == 0, r.stderr
    values = parse_help_config(r.stdout)
    assert values["trainer.rollouts_per_step"] == 128  # 16 prompts × 8, not the field's 64
    assert values["trainer.lr"] == 3e-4
    assert "trainer.lr = 0.0003    # library default: 1e-06" in r.stdout
    assert "Admission bound K" in r.stdout


@pytest.mark.slow
def test_help_config_dry_run_and_the_run_agree(tmp_path):
    cfg_path = tmp_path / "mine.toml"
    cfg_path.write_text('preset = "tiny-cpu"\n[run]\nsteps = 2\neval_limit = 16\ncheckpoint_every = 0\n'
                        '[rollout]\nprompts_per_step = 4\n[metrics]\nsinks = ["jsonl"]\n')
    overrides = ["--sampling.temperature", "0.9", "--trainer.lr", "1e-4"]
    helped = parse_help_config(tokenflow("train", str(cfg_path), "--help-config", *overrides).stdout)
    dry = flatten(tomllib.loads(tokenflow("train", str(cfg_path), "--dry-run", *overrides).stdout))
    r = tokenflow("train", str(cfg_path), "--json", "--output-dir", str(tmp_path / "run"), *overrides)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == 2  # --json: stdout is exactly one JSON document
    # Not a terminal: plain periodic progress lines on stderr, with no terminal escapes.
    assert "train: step 2/2" in r.stderr and "tok/s" in r.stderr and "\x1b[" not in r.stderr
    ran = flatten(tomllib.loads((tmp_path / "run" / "config.toml").read_text()))
    assert dry == ran
    assert {k: v for k, v in helped.items() if v is not None} == dry
    assert dry["trainer.rollouts_per_step"] == 32 and dry["trainer.lr"] == 1e-4
    assert dry["sampling.temperature"] == 0.9 and dry["trainer.schedule"] == "cosine"

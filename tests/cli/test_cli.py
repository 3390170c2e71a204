"""The command line: a cheap import, a dry run, errors that name the problem."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest


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


@pytest.mark.slow
def test_dry_run_prints_the_resolved_config():
    r = tokenflow("train", "--dry-run", "--algorithm.clip_high", "0.28", "--rollout.max_staleness=0")
    assert r.returncode == 0, r.stderr
    cfg = tomllib.loads(r.stdout)
    assert cfg["algorithm"]["clip_high"] == 0.28
    assert cfg["rollout"]["max_staleness"] == 0
    assert cfg["task"]["name"] == "arithmetic" and cfg["model"]["path"] == "default"
    assert cfg["trainer"]["rollouts_per_step"] == cfg["rollout"]["prompts_per_step"] * cfg["rollout"]["group_size"]


@pytest.mark.slow
def test_unknown_key_is_refused_with_the_valid_ones():
    r = tokenflow("train", "--dry-run", "--rollout.max_stalenes", "1")
    assert r.returncode == 2
    assert "unknown key 'rollout.max_stalenes'" in r.stderr and "max_staleness" in r.stderr


def _schema_keys(model, prefix: str = "") -> dict:
    """dotted key → pydantic field, for every leaf of the config schema (a field whose type is a
    config section is a section, not a key)."""
    from pydantic import BaseModel

    keys = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.update(_schema_keys(ann, f"{prefix}{name}."))
        else:
            keys[f"{prefix}{name}"] = field
    return keys


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def _toml_value(text: str):
    return None if text == "none" else tomllib.loads(f"v = {text}")["v"]


@pytest.mark.slow
def test_help_config_documents_every_key():
    """Every key of the schema, once, with the value it resolves to (the default preset's, as
    `tokenflow train` resolves it), the library default where that differs, and its doc."""
    from pydantic import TypeAdapter

    from tokenflow.config.loading import load_config
    from tokenflow.config.presets import DEFAULT_PRESET
    from tokenflow.config.root import TrainConfig

    r = tokenflow("train", "--help-config")
    assert r.returncode == 0, r.stderr
    assert "rollout.max_staleness = 1" in r.stdout and "Admission bound K" in r.stdout
    printed, docs, key = {}, {}, None
    for line in r.stdout.splitlines():
        if line.startswith("    "):
            docs[key] = docs.get(key, "") + " " + line.strip()
            continue
        key, _, rest = line.partition(" = ")
        assert key not in printed, f"{key} printed twice"
        value, _, note = rest.partition("    # library default: ")
        printed[key] = (value, note or None)
    schema = _schema_keys(TrainConfig)
    assert len(schema) > 100
    assert set(printed) == set(schema), (sorted(set(schema) - set(printed))[:10], sorted(set(printed) - set(schema))[:10])
    resolved = load_config(TrainConfig, None, [], preset=DEFAULT_PRESET).model_dump(mode="json")
    for key, field in schema.items():
        value, note = printed[key]
        assert _toml_value(value) == _lookup(resolved, key), (key, value)
        default = TypeAdapter(field.annotation).dump_python(field.get_default(call_default_factory=True), mode="json")
        if _lookup(resolved, key) == default:
            assert note is None, (key, note)
        else:
            assert note is not None and _toml_value(note) == default, (key, note)
        doc = (field.description or "").split()
        if doc:
            assert " ".join(doc[:6]) in " ".join(docs.get(key, "").split()), key
    # The preset's changes are marked with the library default they replace.
    assert printed["run.steps"][1] is not None


@pytest.mark.slow
def test_existing_run_folder_is_not_overwritten(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")  # not a run folder: no marker
    r = tokenflow("train", "--output-dir", str(tmp_path))
    assert r.returncode == 2 and ".tokenflow-run" in r.stderr and "new or empty --output-dir" in r.stderr
    (tmp_path / ".tokenflow-run").write_text('{"format": 1}')  # a run folder, with a finished run's summary
    (tmp_path / "summary.json").write_text("{}")
    r = tokenflow("train", "--output-dir", str(tmp_path))
    assert r.returncode == 2 and "--resume" in r.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"

"""A third-party plugin, installed by pip, adds an estimator, a task and a scorer that a TOML
file uses, and a real `tokenflow train` runs with them.

The mechanism is the real one a user gets: the example package (its own pyproject.toml with a
``tokenflow.plugins`` entry point) is built and installed by pip into a temporary folder, which a
subprocess finds on its path; tokenflow discovers it through importlib.metadata in every process
of the run. Nothing is registered by the test itself, except in the last test, which exercises
the decorator in-process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.runtime_testlib import SMALL
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.config.trainer import TrainerConfig, check_compatible
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.registry import ADVANTAGES

pytestmark = pytest.mark.slow  # a real run (or several processes) per test

PACKAGE = Path(__file__).parent / "tokenflow_example_plugin"
EXAMPLE = PACKAGE / "example.toml"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """pip install the example plugin into a fresh folder (offline: it has no dependencies and
    builds with the setuptools the test extra declares)."""
    root = tmp_path_factory.mktemp("plugin")
    src = shutil.copytree(PACKAGE, root / "src")  # the build writes beside its sources: not in the repo
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True, capture_output=True, text=True)
    assert list(site.glob("tokenflow_example_plugin-*.dist-info/entry_points.txt"))
    return site


def run(args: list[str], site: Path | None, timeout: float = 600) -> subprocess.CompletedProcess:
    path = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


def names(site: Path | None) -> dict:
    code = ("import json; from tokenflow.registry import ADVANTAGES, TASKS, SCORERS; "
            "print(json.dumps({'advantage': ADVANTAGES.names(), 'task': TASKS.names(), 'scorer': SCORERS.names()}))")
    proc = run(["-c", code], site)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_entry_point_registers_the_plugins_components(plugin_site):
    without, with_ = names(None), names(plugin_site)
    assert "median_baseline" not in without["advantage"] and "small_sums" not in without["task"]
    assert "median_baseline" in with_["advantage"] and "small_sums" in with_["task"]
    assert "small_sums_exact" in with_["scorer"]
    assert set(without["advantage"]) < set(with_["advantage"])  # built-ins stay


def test_a_toml_file_trains_with_the_plugins_estimator_task_and_scorer(plugin_site, tmp_path):
    out = tmp_path / "run"
    proc = run(["-m", "tokenflow.cli.main", "train", str(EXAMPLE), "--output-dir", str(out), *SMALL,
                "--run.steps", "3", "--run.save_rollouts", "true"], plugin_site)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The estimator ran once per step, on the step's 16 sequences (in the trainer process, whose
    # log records the parent prints).
    assert len(re.findall(r"INFO tokenflow_example_plugin: median_baseline: advantages for 16 sequences",
                          proc.stderr)) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    resolved = (out / "config.toml").read_text()
    assert 'name = "small_sums"' in resolved and 'advantage = "median_baseline"' in resolved
    # The task's prompts (operands below 10**max_digits = 100), scored by the plugin's scorer in
    # the scorer processes: reward 1 exactly when the answer after the last '>' is the sum.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(next((out / "checkpoints").glob("step_*")) / "model")
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 3 * 16
    for r in rollouts:
        a, b = (int(x) for x in tok.decode(r["prompt_ids"], skip_special_tokens=True).strip().rstrip("=").split("+"))
        assert a < 100 and b < 100
        answer = tok.decode(r["completion_ids"], skip_special_tokens=True).rsplit(">", 1)
        assert r["reward"] == (1.0 if len(answer) == 2 and answer[1].strip() == str(a + b) else 0.0)
    assert {r["reward"] for r in rollouts} == {0.0, 1.0}  # both branches of the scorer ran
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:  # the step's mean is the mean of the rewards its rollouts got
        step = [r["reward"] for r in rollouts if r["step"] == row["step"]]
        assert row["reward/mean"] == pytest.approx(sum(step) / len(step))


def test_the_plugins_scorer_on_known_completions(plugin_site):
    code = ("import json; from tokenflow.registry import SCORERS; f = SCORERS.get('small_sums_exact'); "
            "ex = {'a': 15, 'b': 27, 'answer': 42}; "
            "print(json.dumps([f('15+27=', c, ex) for c in ('5+7=12,1+2+1=4>42', '5+7=12,1+2=3>32', "
            "'5+7=12,1+2+1=4', '>42 ')]))")
    proc = run(["-c", code], plugin_site)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [1.0, 0.0, 0.0, 1.0]


def test_unknown_names_and_bad_plugin_settings_are_refused_in_one_line(plugin_site):
    proc = run(["-m", "tokenflow.cli.main", "train", str(EXAMPLE), "--dry-run", "--algorithm.advantage",
                "median_baselin"], plugin_site)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "did you mean 'median_baseline'?" in proc.stderr and "rloo" in proc.stderr
    proc = run(["-m", "tokenflow.cli.main", "train", str(EXAMPLE), "--dry-run", "--task.options.max_digits", "9"],
               plugin_site)
    assert proc.returncode == 2 and "small_sums needs an integer from 1 to 6" in proc.stderr
    # Without the plugin installed the same file names what is missing.
    proc = run(["-m", "tokenflow.cli.main", "train", str(EXAMPLE), "--dry-run"], None)
    assert proc.returncode == 2 and "task.name = 'small_sums' is not a known task" in proc.stderr


def test_an_estimator_declares_what_it_needs():
    """In-process decorator registration: the config reads the declared properties."""
    @ADVANTAGES.register("test_valued", needs_values=True, token_rewards=True)
    def test_valued(inp, cfg):  # pragma: no cover - never called
        raise AssertionError

    try:
        alg = AlgorithmConfig(advantage="test_valued", kl_coef=0.1, kl_in_reward=True, value_clip=0.2)
        assert alg.uses_values and "test_valued" in alg.value_estimators()
        with pytest.raises(ValueError, match='"test_valued" needs a value head'):
            check_compatible(TrainerConfig(), alg)
        check_compatible(TrainerConfig(value_head=True), alg)
        with pytest.raises(ValueError, match="uses only the outcome"):
            AlgorithmConfig(advantage="rloo", kl_coef=0.1, kl_in_reward=True)
        with pytest.raises(TypeError, match="unknown property needs_reference"):
            ADVANTAGES.register("test_bad", needs_reference=True)(test_valued)
    finally:
        ADVANTAGES._entries.pop("test_valued", None)

"""scripts/requirements_of.py, which .ci/run's two-step environments install from: the project's
requirements plus the named extras', exactly as pyproject.toml lists them; an unknown extra is
refused with the list of extras."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "requirements_of.py"


def test_it_prints_the_project_requirements_and_the_named_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = subprocess.run([sys.executable, str(SCRIPT), "vllm-cpu", "real"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    extras = project["optional-dependencies"]
    assert out == [*project["dependencies"], *extras["vllm-cpu"], *extras["real"]]


def test_an_unknown_extra_is_refused_naming_the_extras():
    r = subprocess.run([sys.executable, str(SCRIPT), "vllm-gpu"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == ""
    assert "no extra named vllm-gpu" in r.stderr and "vllm-cpu" in r.stderr

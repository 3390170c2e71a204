"""The documentation site: it builds with --strict (broken links, anchors and API references fail),
and every code block marked runnable runs on the CPU and succeeds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
# A block is runnable when the line above its fence is this marker (invisible on the site).
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(bash|python)\n(.*?)^```$", re.M | re.S)


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in RUNNABLE.finditer(page.read_text())]


PAGES = sorted(p for p in DOCS.rglob("*.md") if runnable_blocks(p))


def env() -> dict:
    e = dict(os.environ)
    # `tokenflow` and `python` resolve to this interpreter's; the source under test comes first.
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), e.get("PYTHONPATH", "")])
    e["NO_MKDOCS_2_WARNING"] = "1"
    return e


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "rollout.max_staleness" in cli and "Admission bound K" in cli  # generated from the field docs
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "Run (or resume) training" in api  # from launch.train's docstring


def test_every_page_with_runnable_blocks_is_found():
    names = {str(p.relative_to(DOCS)) for p in PAGES}
    assert {"quickstart.md", "howto/own-task.md", "howto/own-reward.md", "howto/simulator.md"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_runnable_blocks_run(page, tmp_path):
    """A page's blocks run in order in one fresh folder holding a copy of examples/."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    for i, (lang, code) in enumerate(runnable_blocks(page)):
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=600)
        assert r.returncode == 0, f"{page.name} block {i + 1} ({lang}) failed:\n{code}\n{r.stdout[-2000:]}{r.stderr[-3000:]}"

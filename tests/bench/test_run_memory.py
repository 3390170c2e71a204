"""benchmarks/run_memory.py counts the memory of a command and of the processes it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

# A parent that holds 100 MB and starts a child holding 200 MB; both alive together for 1.5 s,
# then the command exits with status 3.
_COMMAND = """
import subprocess, sys, time
held = bytearray(100 * 2**20)
for i in range(0, len(held), 4096): held[i] = 1
child = subprocess.Popen([sys.executable, "-c",
    "import time; b = bytearray(200 * 2**20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\ntime.sleep(1.5)"])
child.wait()
sys.exit(3)
"""


def test_the_peak_sums_a_command_and_its_children(tmp_path):
    out, timeline = tmp_path / "memory.json", tmp_path / "timeline.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_memory.py"), "--every", "0.1",
                        "--json", str(out), "--timeline", str(timeline), "--", sys.executable, "-c", _COMMAND],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr  # the command's own exit status
    figures = json.loads(out.read_text())
    # 300 MB of touched pages plus two interpreters (each well under 50 MB); the child alone
    # (200 MB) or the parent alone (100 MB) would stay below 0.29 GB
    assert 0.29 <= figures["peak_pss_gb"] < 0.45, figures
    assert len(figures["process_peaks_gb"]) == 2, figures
    assert "peak memory of the whole run" in r.stderr
    # the timeline: a sample's sum is its processes' sum, and its largest is the peak
    samples = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert max(s["gb"] for s in samples) == figures["peak_pss_gb"], samples
    both = [s for s in samples if len(s["pss_gb"]) == 2]
    assert both and all(abs(sum(s["pss_gb"].values()) - s["gb"]) < 0.01 for s in both), samples

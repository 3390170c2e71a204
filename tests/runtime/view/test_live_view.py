"""The live view under a real pseudo-terminal at 80 columns, rendered by a terminal emulator (pyte).

`tokenflow -v train --run.steps 6` runs with its stdin/stdout/stderr on a pty; every byte it
writes is replayed into a pyte screen, frame by frame (rich starts each refresh of the live view
with ``\\r ESC[2K``), so the test sees each state of the view a person saw, and the final screen.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time

import pyte
import pytest

COLS = 80
FRAME = b"\r\x1b[2K"
BAR = re.compile(r"^train\s.*?(\d+)/6\b")
ACC = re.compile(r"acc (\d\.\d{3}) @ step (\d+)")
RATE = re.compile(r"(\d+(?:\.\d)?)(k?) tok/s")


def run_in_pty(args: list[str], cwd, timeout: float = 400) -> tuple[int, bytes]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLS, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "tokenflow.cli.main", *args], stdin=slave, stdout=slave,
                            stderr=slave, cwd=cwd, env=env, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty has closed it
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), bytes(out)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def frames(raw: bytes):
    """Replay ``raw`` into an 80-column screen; yield the screen's lines after each whole frame."""
    screen = pyte.Screen(COLS, 400)
    stream = pyte.ByteStream(screen)
    pieces = raw.split(FRAME)
    for i, piece in enumerate(pieces):
        stream.feed((FRAME if i else b"") + piece)
        yield [line.rstrip() for line in screen.display]


@pytest.mark.slow
def test_live_view_on_an_80_column_terminal(tmp_path):
    run = tmp_path / "run"
    code, raw = run_in_pty(["-v", "train", "--run.steps", "6", "--run.eval_every", "3", "--run.eval_limit", "64",
                            "--metrics.sinks", '["jsonl"]', "--output-dir", str(run)], cwd=tmp_path)
    assert code == 0, raw.decode(errors="replace")[-3000:]
    evals = {r["step"]: r["eval/accuracy"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "eval/accuracy" in r}
    assert sorted(evals) == [0, 3, 6]
    assert b"Writing model shards" not in raw and b"Loading weights" not in raw  # workers' tqdm bars

    seen_steps, rates, accs, baseline_logged = set(), [], [], False
    for lines in frames(raw):
        baseline_logged = baseline_logged or any("baseline held-out accuracy" in line for line in lines)
        bars = [i for i, line in enumerate(lines) if BAR.match(line)]
        if not bars:
            continue
        i = bars[-1]
        bar, figures = lines[i], lines[i + 1]
        assert len(bar) <= COLS and "…" not in bar, bar  # the timer is not cut
        step = int(BAR.match(bar).group(1))
        acc = ACC.search(bar)
        if acc:  # only an accuracy that was evaluated, at a step already reached, with its value
            assert baseline_logged and int(acc.group(2)) <= step
            assert float(acc.group(1)) == pytest.approx(evals[int(acc.group(2))], abs=5e-4)
            accs.append(int(acc.group(2)))
        else:
            assert not (baseline_logged and step >= 1), f"the accuracy vanished at step {step}: {bar}"
        if step >= 1 and not figures.startswith(("evaluating", "writing")):
            rate = RATE.search(figures)
            assert rate, f"no tokens/s at step {step}: {figures!r}"
            rates.append(float(rate.group(1)) * (1000 if rate.group(2) else 1))
            seen_steps.add(step)
    # The view was seen between evaluations (which step a refresh catches depends on how fast
    # steps go: with the zero-advantage skip a step can end between two refreshes).
    assert seen_steps & {1, 2} and seen_steps & {4, 5}, seen_steps
    assert rates and min(rates) > 0, rates
    assert accs[0] == 0 and accs[-1] == 6 and 3 in accs

    final = lines
    # Every per-update engine line (debug, from the engine process) sits intact on a line of its own,
    # in order; the bar left no torn copies behind: it is on the screen exactly once.
    updates = [int(m.group(1)) for line in final
               if (m := re.search(r"DEBUG\s+engine: weight update to version (\d+) \(inflight\): applied$", line))]
    assert updates == [1, 2, 3, 4, 5, 6], "\n".join(final)
    # the whole screen on failure: a torn copy's place says which writer bypassed the view
    assert sum(bool(BAR.match(line)) for line in final) == 1, "\n".join(final)
    assert sum("━" in line for line in final) == 1, "\n".join(final)
    assert any(re.search(r"INFO\s+baseline held-out accuracy \d\.\d{3}$", line) for line in final)
    # The summary: accuracy before → after and the commands to look further.
    text = "\n".join(final)
    assert f"{evals[0]:.3f} → {evals[6]:.3f}" in text
    assert "look further" in text and "tokenflow report" in text

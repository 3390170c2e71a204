"""`tokenflow samples` on a samples file written by hand: filters, worst and best first, a torn
last line skipped, and the model's text printed as text (rich markup in it is not interpreted)."""

from __future__ import annotations

import json

from tokenflow.cli.main import main
from tokenflow.cli.samples import read_samples, select


def _row(step, reward, kind="train", failed=False, completion="42", **more):
    return {"step": step, "kind": kind, "group_id": step, "prompt_id": step * 10, "sample_index": 0,
            "prompt": f"{step}+1=", "completion": completion, "reward": reward, "components": {},
            "failed": failed, "error": "ValueError: no" if failed else None, "finish_reason": "stop",
            "tokens": 3, "versions": [step - 1], "token_age_mean": 0.0, "token_age_max": 0, **more}


ROWS = [_row(1, 0.5), _row(2, 1.0), _row(2, None, failed=True), _row(3, 0.0), _row(3, 1.0, kind="eval")]


def test_select_filters_and_orders():
    assert select(ROWS, step=2) == ROWS[1:3]
    assert select(ROWS, kind="eval") == ROWS[4:]
    assert select(ROWS, worst=True, limit=2) == [ROWS[2], ROWS[3]]  # failed first, then the lowest
    assert select([ROWS[3], ROWS[2]], worst=True, limit=1) == [ROWS[2]]  # failed is worse than 0
    assert select(ROWS, best=True, limit=2) == [ROWS[1], ROWS[4]]
    assert select(ROWS, limit=2) == ROWS[3:]  # the most recent


def test_the_command_prints_the_text_as_written(tmp_path, capsys):
    text = "".join(json.dumps(r) + "\n" for r in [*ROWS, _row(4, 1.0, completion="[bold]x[/bold] **24**")])
    (tmp_path / "samples.jsonl").write_text(text + '{"step": 5, "kin')  # a write cut short by a kill
    assert len(read_samples(tmp_path / "samples.jsonl")) == 6
    assert main(["samples", str(tmp_path), "--step", "4"]) == 0
    out = capsys.readouterr().out
    assert "[bold]x[/bold] **24**" in out and "4+1=" in out
    assert "step 4 · train · prompt 40 · sample 0 · reward 1 · version 3" in out
    assert main(["samples", str(tmp_path), "--worst", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "step 2 · train · prompt 20 · sample 0 · failed" in out and "ValueError: no" in out
    assert main(["samples", str(tmp_path / "nowhere")]) == 2

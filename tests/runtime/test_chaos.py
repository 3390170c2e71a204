"""`tokenflow bench chaos`, short: a few SIGKILLs of different kinds, each followed by --resume;
nothing lost, repeated or duplicated, no /dev/shm left, weights equal to a run never killed."""

from __future__ import annotations

import json

from tokenflow.cli.main import main


def test_short_chaos_run_holds_every_check(tmp_path, capsys):
    code = main(["bench", "chaos", "--kills", "3", "--steps", "10", "--seed", "3", "--kinds", "tree,trainer,scorer",
                 "--output-dir", str(tmp_path / "chaos"), "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["kills"] == 3 and out["kills_by_kind"] == {"tree": 1, "engine": 0, "trainer": 1, "scorer": 1}, out
    assert out["completed"] and out["steps"] == 10
    assert out["prompts_lost"] == out["prompts_repeated"] == out["metric_rows_duplicated"] == 0, out
    assert out["ledger_steps_missing"] == out["metric_steps_missing"] == 0, out
    assert out["hangs"] == out["unnamed_deaths"] == out["no_resume_advice"] == out["stragglers"] == 0, out
    assert out["checkpoints_bad"] == 0 and out["shm_left"] == 0, out
    assert out["weights_max_abs_diff"] <= 1e-6, out
    assert out["ok"] and code == 0

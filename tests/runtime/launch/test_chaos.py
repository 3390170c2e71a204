"""`tokenflow bench chaos`, short: a few SIGKILLs of different kinds, each followed by --resume;
nothing lost, repeated or duplicated, no /dev/shm left, weights equal to a run never killed."""

from __future__ import annotations

import pytest
import json

from tokenflow.cli.main import main


@pytest.mark.slow
def test_short_chaos_run_holds_every_check(tmp_path, capsys):
    code = main(["bench", "chaos", "--kills", "3", "--steps", "10", "--seed", "3", "--kinds", "tree,trainer,scorer",
                 "--output-dir", str(tmp_path / "chaos"), "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["kills"] == 3 and out["kills_by_kind"] == {"tree": 1, "engine": 0, "trainer": 1, "scorer": 1}, out
    # A kill that comes after the run finished does not count: the bench extends the run and
    # kills again (a fast or idle machine), so the final step is 10 only when no kill came late.
    assert out["completed"] and out["steps"] >= 10 and (out["steps"] == 10) == (out["extensions"] == 0), out
    assert out["kill_attempts"] == out["kills"] + out["extensions"], out
    assert out["prompts_lost"] == out["prompts_repeated"] == out["metric_rows_duplicated"] == 0, out
    assert out["ledger_steps_missing"] == out["metric_steps_missing"] == 0, out
    assert out["hangs"] == out["unnamed_deaths"] == out["no_resume_advice"] == out["stragglers"] == 0, out
    assert out["checkpoints_bad"] == 0 and out["shm_left"] == 0, out
    assert out["weights_max_abs_diff"] <= 1e-6, out
    assert out["ok"] and code == 0


def test_kills_that_come_too_late_extend_the_run_until_every_kill_has_landed(tmp_path, monkeypatch):
    """The schedule loop on its own: a run that finishes before its kill (a fast machine) is
    extended and killed again; the bench stops only when every requested kill has landed."""
    import random
    from types import SimpleNamespace

    from tokenflow.bench import chaos

    calls = []

    def one_kill(kind, rng, cmd, run_dir, log_path, steps, worker_timeout):
        calls.append((kind, steps, cmd))
        run_dir.mkdir(exist_ok=True)
        if len(calls) in (1, 3, 4):  # too late: the run finished at `steps`
            return {"kind": kind, "killed": False, "ended_by_itself": 0}
        return {"kind": kind, "killed": True}

    monkeypatch.setattr(chaos, "_one_kill", one_kill)
    args = SimpleNamespace(worker_timeout=5.0)
    records, steps, failed = chaos._kill_until_landed(["tree", "trainer", "scorer"], random.Random(0), tmp_path,
                                                      tmp_path / "run", tmp_path / "log", 8, args)
    assert not failed and sum(r["killed"] for r in records) == 3 and len(records) == 6
    assert [k for k, _, _ in calls] == ["tree", "tree", "trainer", "trainer", "trainer", "scorer"]
    assert [s for _, s, _ in calls] == [8, 14, 14, 18, 22, 22]  # + max(4, 2 × kills left) per extension
    assert all(cmd[cmd.index("--run.steps") + 1] == str(s) for _, s, cmd in calls)
    assert steps == 22 and calls[0][2][0] != "--resume" and calls[1][2][0] == "--resume"

"""summary.json after a resume covers the whole run; a reward that fails every sample stops the
run instead of letting it exit 0 having trained nothing."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.runtime.runtime_testlib import small_config, step_rows
from tokenflow.runtime.launch import train
from tokenflow.runtime.orchestrator.orchestrator import RunFailed

pytestmark = pytest.mark.slow  # a real run (or several processes) per test


def test_summary_after_a_resume_counts_every_invocation(tmp_path):
    common = ("--rollout.max_staleness", "0", "--run.checkpoint_every", "0")
    first = train(small_config(*common, "--run.steps", "2"), tmp_path / "run")
    resumed = train(small_config(*common, "--run.steps", "4"), tmp_path / "run", resume=True)
    assert resumed["steps"] == 4
    rows = step_rows(tmp_path / "run")
    later_tokens = sum(r["rollout/count"] * r["rollout/completion_len_mean"] for r in rows if r["step"] > 2)
    # The second call alone generated steps 3-4 plus one evaluation; the whole run also holds
    # everything the first call generated.
    assert resumed["tokens_generated"] >= first["tokens_generated"] + later_tokens
    # The first call counts up to the checkpoint resumed from (its final evaluation came after
    # it), so the whole run's wall time exceeds that, not necessarily the first call's total.
    first_at_checkpoint = json.loads((tmp_path / "run/checkpoints/step_000002/orchestrator.json").read_text())
    second_window = resumed["train_wall_s"] - first_at_checkpoint["wall_s"]  # this call's training window
    assert second_window > 0 and resumed["wall_s"] >= first_at_checkpoint["elapsed_s"] + second_window
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["tokens_generated"] == resumed["tokens_generated"]


def test_a_reward_that_raises_on_every_call_stops_the_run(tmp_path):
    (tmp_path / "broken_reward.py").write_text(textwrap.dedent("""
        def reward(prompt, completion, example):
            raise RuntimeError("the verifier is down")
    """))
    rows = [{"prompt": f"{i}+{i}="} for i in range(40)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(tmp_path / "data.jsonl"),
                       "--task.reward", f"{tmp_path / 'broken_reward.py'}:reward", "--run.steps", "2",
                       "--run.eval_limit", "2")
    with pytest.raises(RunFailed, match="every sample of step 1 failed scoring .*the verifier is down"):
        train(cfg, tmp_path / "run")
    assert step_rows(tmp_path / "run") == []


@pytest.mark.timeout(900)
def test_a_synchronous_run_resumed_from_a_periodic_checkpoint_ends_with_the_same_weights(tmp_path):
    """A periodic checkpoint is taken before the engines load its weights; resuming from it must
    not wait for a load that never comes (it hung), and must end where the whole run ended."""
    import shutil

    from tokenflow.bench.chaos_checks import weights_diff

    cfg = small_config("--rollout.max_staleness", "0", "--run.checkpoint_every", "2", "--run.steps", "4")
    run = tmp_path / "run"
    train(cfg, run)
    shutil.copytree(run / "checkpoints" / "step_000004", tmp_path / "whole")
    shutil.rmtree(run / "checkpoints" / "step_000004")  # as if killed between steps 2 and 4
    (run / "summary.json").unlink()
    resumed = train(cfg, run, resume=True)
    assert resumed["steps"] == 4
    # Not bit-exact: the engine's behaviour log-probs round differently with a different batch
    # composition (timing), which moves a weight by about one float32 ulp (1.2e-7 at |w| ≈ 1;
    # seen: 6e-8 and 1.2e-7). The bound, 1e-6, is eight such ulps.
    assert weights_diff(tmp_path / "whole", run / "checkpoints" / "step_000004") <= 1e-6

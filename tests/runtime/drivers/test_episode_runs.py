"""Environment tasks through the real runtime (engine, trainer and scorer processes): episodes
train, their metrics are reported, a flaky environment fails samples and not the run, and a
run killed with episodes in flight resumes without losing or repeating a prompt."""

from __future__ import annotations

import json
import os
import shutil
import signal
import textwrap
from pathlib import Path

import pytest

from tests.runtime.runtime_testlib import SMALL, first_checkpoint, ledger, small_config, start_cli, step_rows, wait_until
from tokenflow.runtime.launch import train
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime.run.run_dir import RunDir

pytestmark = pytest.mark.slow  # a real run (or several processes) per test

CALCULATOR = "tokenflow.envs.calculator:CalculatorEnv"


def env_overrides(env: str = CALCULATOR) -> list[str]:
    return ["--model.path", os.environ.get("TF_TOOL_MODEL") or resolve_model_path("default-tool"),
            "--task.name", "env", "--task.env", env, "--sampling.max_tokens", "32",
            "--episode.max_total_tokens", "160"]


def test_an_environment_task_trains_and_reports_its_episodes(tmp_path):
    summary = train(small_config(*env_overrides(), "--run.steps", "3", "--run.checkpoint_every", "0"),
                    tmp_path / "run")
    assert summary["steps"] == 3
    rows = step_rows(tmp_path / "run")
    assert len(rows) == 3
    for row in rows:
        assert row["episode/count"] == 16 and row["episode/failed"] == 0
        assert row["episode/multi_turn_frac"] > 0.5 and row["episode/turns_mean"] >= 1.5
        assert 0 < row["episode/env_tokens_frac"] < 1
        # Ages and rejections count generated tokens only: every rollout here is at most
        # max_staleness behind, environment tokens included in nothing.
        assert row["buffer/token_age_max"] <= 2 and row["offpolicy/token_age_max"] <= 2
    assert rows[0]["offpolicy/mismatch_abs_logprob"] < 1e-5  # step 1 is on-policy


def test_an_environment_that_raises_fails_samples_not_the_run(tmp_path):
    (tmp_path / "flaky_env.py").write_text(textwrap.dedent("""
        from tokenflow.envs.calculator import CalculatorEnv

        class Flaky(CalculatorEnv):
            async def step(self, assistant_message):
                if self.a % 3 == 0:
                    raise ConnectionError("the calculator service dropped the call")
                return await super().step(assistant_message)

            def reset(self, example):
                self.a = example["a"]
                return super().reset(example)
    """))
    summary = train(small_config(*env_overrides(f"{tmp_path / 'flaky_env.py'}:Flaky"), "--run.steps", "2",
                                 "--run.checkpoint_every", "0"), tmp_path / "run")
    assert summary["steps"] == 2
    rows = step_rows(tmp_path / "run")
    failed = sum(r["episode/failed"] for r in rows)
    assert failed > 0 and all(r["episode/count"] == 16 for r in rows)
    assert all(r["reward/failed_frac"] == r["episode/failed"] / 16 for r in rows)


def test_task_options_reach_the_environment_in_a_real_run(tmp_path):
    """One class, configured by [task.options]: the constructor's option reaches every episode
    in the engine worker (its rubric reads it back in the scorer), the example methods' option
    shapes the questions."""
    (tmp_path / "tagged_env.py").write_text(textwrap.dedent("""
        from tokenflow.envs import Rubric
        from tokenflow.envs.calculator import CalculatorEnv, correct, example_of

        def tagged(state):
            return float(state.get("tag") == "gsm")

        class Tagged(CalculatorEnv):
            rubric = Rubric([correct, tagged], weights=[1.0, 0.0])

            def __init__(self, tag: str):  # required: every process that builds or loads it gets it
                super().__init__()
                self.tag = tag

            def reset(self, example):
                self.state["tag"] = self.tag
                return super().reset(example)

            @classmethod
            def train_example(cls, index, seed, products_only: bool = False):
                ex = super().train_example(index, seed)
                return example_of(ex["a"], ex["b"], None) if products_only else ex
    """))
    cfg = small_config(*env_overrides(f"{tmp_path / 'tagged_env.py'}:Tagged"), "--run.steps", "2",
                       "--run.checkpoint_every", "0", "--run.eval_every", "0",
                       "--task.options.tag", "gsm", "--task.options.products_only", "true")
    assert train(cfg, tmp_path / "run")["steps"] == 2
    rows = step_rows(tmp_path / "run")
    assert [r["reward/tagged_mean"] for r in rows] == [1.0, 1.0]
    assert all(r["episode/failed"] == 0 for r in rows)


AGENT = str(Path(__file__).parents[3] / "examples/agents/calculator_agent.py") + ":solve"


STEPS = 8  # the kill lands at the first checkpoints (steps 1-2 measured): 6+ steps resumed


def _in_flight(ckpt: Path) -> set[int]:
    """The groups a checkpoint saw in flight and not yet ready."""
    buffer = json.loads((ckpt / "buffer.json").read_text())
    return {g for g, _ in buffer["in_flight"]} - {g for g, _ in buffer["ready"]}


def _with_episodes_in_flight(run: Path) -> Path | None:
    """The first whole checkpoint (before the last step) that saw episodes in flight."""
    return first_checkpoint(run, STEPS, _in_flight)


@pytest.mark.parametrize("agent", [None, AGENT], ids=["episodes", "agent-sessions"])
def test_sigkill_with_episodes_in_flight_then_resume_neither_loses_nor_repeats_a_prompt(tmp_path, agent):
    """Episodes, or agents' sessions, in flight when the run is killed are played again."""
    run = tmp_path / "run"
    args = [*SMALL, *env_overrides(), "--output-dir", str(run), "--run.steps", str(STEPS),
            "--run.checkpoint_every", "1", "--run.keep_checkpoints", "20", "--rollout.max_staleness", "2",
            # One group's episodes at a time: generation is the bottleneck, so checkpoints find
            # episodes mid-play (with 256 slots a fast machine finished every step's episodes
            # before the trainer checkpointed, and the run was killed with none in flight).
            "--engine.max_num_seqs", "4",
            *(["--task.agent", agent] if agent else [])]
    proc = start_cli(args, tmp_path / "first.log")
    try:
        wait_until(lambda: _with_episodes_in_flight(run) is not None, 240, "a checkpoint with episodes in flight",
                   proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ckpt = _with_episodes_in_flight(run)
    for later in RunDir(run).complete_checkpoints():  # as if killed right after this checkpoint
        if later > ckpt:
            shutil.rmtree(later)
    in_flight = _in_flight(ckpt)
    trust = ["--trust-run-config"] if agent else []  # the agent is a file the run folder's config names
    proc = start_cli(["--resume", str(run), "--metrics.progress", "false", *trust], tmp_path / "second.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS
    # An episode's state (its environment, an agent's thread) cannot be kept: counted, played again.
    counts = summary["inflight_on_resume"]
    assert counts["unkeepable_rollouts"] == 4 * len(in_flight) > 0 and counts["kept_rollouts"] == 0, counts
    assert [r["step"] for r in step_rows(run)] == list(range(1, STEPS + 1))
    consumed = [p for line in ledger(run) for p in line["prompt_ids"]]
    assert len(consumed) == len(set(consumed)) == STEPS * 4
    everything = sorted(consumed + summary["in_flight_prompt_ids"])
    assert everything == list(range(len(everything)))

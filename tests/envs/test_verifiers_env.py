"""``task.name = "verifiers"`` with the real verifiers package (0.4.x), the built-in engine and
the shipped tool model: verifiers plays each episode against a training session and the row
tokenflow trains on is token for token what verifiers recorded (its prompt rendering, the ids and
log-probs the engine sampled, one row across turns); the rubric's reward comes from the
taskset's own ``@vf.reward``; an episode that fails or passes its deadline marks its samples
failed while the others finish; a run trains on it; the config refuses what it cannot use, and
the example configs load."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verifiers.v1")

from tests.envs import verifiers_testlib  # noqa: E402
from tokenflow.config.root import TrainConfig  # noqa: E402
from tokenflow.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from tokenflow.envs.verifiers_env import AGENT_SPEC, ENV_SPEC, VerifiersEnv, held_out, load  # noqa: E402
from tokenflow.model_store import resolve_model_path  # noqa: E402
from tokenflow.runtime.drivers.agents import run_agents  # noqa: E402
from tokenflow.runtime.drivers.episodes import EpisodeSpec  # noqa: E402

QA = "examples/verifiers/tf_vf_qa"
TWO_TURN = "examples/verifiers/tf_vf_twoturn"
RAISING = "tests/envs/verifiers_testlib.py"
RECORDING = "tests.envs.verifiers_testlib:recording_play"


@pytest.fixture(scope="module")
def engine():
    e = Engine(resolve_model_path("default-tool"), EngineConfig(device="cpu", dtype="float32", threads=1))
    yield e
    e.close()


def _specs(env: str, n: int, agent: str = AGENT_SPEC, renderer: str | None = "default-tool", **kw):
    return [EpisodeSpec(ENV_SPEC, VerifiersEnv.train_example(i, 0, env=env, renderer_model=renderer),
                        agent=agent, agent_timeout_s=kw.pop("timeout", 60.0), **kw) for i in range(n)]


def test_two_turn_rows_are_what_verifiers_recorded(engine):
    verifiers_testlib.TRACES.clear()
    groups = run_agents(engine, _specs(TWO_TURN, 2, agent=RECORDING), SamplingParams(max_tokens=12, n=2, seed=3))
    records = [t for ts in verifiers_testlib.TRACES.values() for t in ts]
    assert len(records) == 4
    for rows in groups:
        assert len(rows) == 2, "one row per sample: the second turn continued the first"
        for row in rows:
            summary = row.info["episode"]
            assert not row.failed and summary["turns"] == 2 and summary["rows"] == 1
            assert summary["episode"].state["result"]["turns"] == 2
            opening = [{"role": "user", "content": summary["episode"].example["prompt"]}]
            assert row.prompt_ids.tolist() == engine.tokenizer.apply_chat_template(
                opening, tokenize=True, add_generation_prompt=True, return_dict=False)
            ids = [*row.prompt_ids.tolist(), *row.completion_ids.tolist()]
            record = next(r for r in records if r["token_ids"] == ids)  # verifiers' ids, exactly
            sampled = np.array(record["sampled"][len(row.prompt_ids):])
            assert (sampled == (row.loss_mask > 0)).all(), "trained tokens are the sampled ones"
            assert np.allclose(np.array(record["logprobs"][len(row.prompt_ids):])[sampled],
                               row.logprobs[row.loss_mask > 0], atol=1e-6)
            assert sorted(set(row.turns[row.loss_mask > 0].tolist())) == [0, 1]
            assert (row.versions[row.loss_mask > 0] == 0).all()


def test_single_turn_reward_is_the_taskset_rubric(engine):
    """The QA taskset pays 1 when the reply says the row's answer: the reward verifiers computed,
    the tokenflow rubric's and a check of the decoded reply agree."""
    tasks = load(QA).tasks
    groups = run_agents(engine, _specs(QA, 3), SamplingParams(max_tokens=8, n=2, seed=0))
    for rows in groups:
        for row in rows:
            episode = row.info["episode"]["episode"]
            result = episode.state["result"]
            assert not row.failed and row.info["episode"]["turns"] == 1
            (scored,) = VerifiersEnv.rubric.score([episode])
            assert scored["vf_reward"] == result["reward"] == result["rewards"]["correct"]
            answer = tasks[episode.example["vf_index"]].data.answers[0]
            ids = row.completion_ids[row.loss_mask > 0].tolist()
            text = engine.tokenizer.decode(ids, skip_special_tokens=True)
            assert result["reward"] == float(answer.lower() in text.lower())


def test_failing_episode_fails_its_samples_and_the_others_finish(engine):
    specs = _specs(RAISING, 1, renderer=None) + _specs(QA, 1)
    groups = run_agents(engine, specs, SamplingParams(max_tokens=8, n=2, seed=0))
    broken, fine = groups
    assert all(r.failed for r in broken)
    assert all("this reward function is broken" in r.info["env_error"] for r in broken)
    assert not any(r.failed for r in fine)


def test_episode_past_its_deadline_fails_its_samples(engine):
    example = {**VerifiersEnv.train_example(0, 0, env=RAISING), "vf_index": 1}  # its harness hangs
    spec = EpisodeSpec(ENV_SPEC, example, agent=AGENT_SPEC, agent_timeout_s=2.0)
    (rows,) = run_agents(engine, [spec] + _specs(QA, 1), SamplingParams(max_tokens=8, n=2, seed=0))[:1]
    assert all(r.failed and "did not return within 2s" in r.info["env_error"] for r in rows)


@pytest.mark.slow
def test_a_run_trains_on_a_verifiers_environment(tmp_path):
    from tests.runtime.runtime_testlib import small_config, step_rows
    from tokenflow.runtime.launch import train

    summary = train(small_config(
        "--model.path", resolve_model_path("default-tool"), "--task.name", "verifiers", "--task.options.env", TWO_TURN,
        "--task.options.renderer_model", "default-tool", "--task.num_eval", "2",
        "--sampling.max_tokens", "8", "--run.steps", "2", "--rollout.prompts_per_step", "2",
        "--rollout.group_size", "2", "--run.checkpoint_every", "0"), tmp_path / "run")
    assert summary["steps"] == 2
    for row in step_rows(tmp_path / "run"):
        assert row["episode/count"] == 4 and row["episode/failed"] == 0 and row["episode/new_rows"] == 0
        assert row["episode/multi_turn_frac"] == 1.0 and 0 < row["episode/env_tokens_frac"] < 1


def test_config_sets_the_adapter_and_refuses_what_it_cannot_use():
    cfg = TrainConfig.model_validate({"task": {"name": "verifiers", "options": {"env": QA}}})
    assert (cfg.task.env, cfg.task.agent) == (ENV_SPEC, AGENT_SPEC)
    for task, says in [({"name": "verifiers"}, "task.options.env"),
                       ({"name": "verifiers", "options": {"env": QA, "nope": 1}}, "no option 'nope'"),
                       ({"name": "verifiers", "options": {"env": QA}, "reward": "arithmetic"}, "task.reward"),
                       ({"name": "verifiers", "options": {"env": QA}, "agent": "x.py:f"}, "sets task.agent")]:
        with pytest.raises(ValueError, match=says):
            TrainConfig.model_validate({"task": task})


def test_held_out_tasks_are_never_trained_on():
    held = {e["vf_index"] for e in VerifiersEnv.eval_examples(0, 100, env=QA)}
    trained = {VerifiersEnv.train_example(i, 0, env=QA)["vf_index"] for i in range(200)}
    assert held == {36, 37, 38, 39} and held_out(40, None) == 4
    assert not held & trained and len(trained) == 36


@pytest.mark.parametrize("name", ["qa_smollm2", "twoturn_smollm2"])
def test_example_configs_load_and_name_their_tasks(name):
    from tokenflow.config.loading import load_config

    cfg = load_config(TrainConfig, f"examples/verifiers/{name}.toml", [])
    assert cfg.task.name == "verifiers" and cfg.task.options["renderer_model"] == cfg.model.path
    example = VerifiersEnv.train_example(0, cfg.task.seed, **cfg.task.options)
    assert example["prompt"].endswith("Answer in one word.")


def test_a_run_folder_naming_a_verifiers_environment_needs_trust():
    from tokenflow.errors import RunFolderError
    from tokenflow.runtime.run.folder_code import refuse_folder_code

    cfg = TrainConfig.model_validate({"task": {"name": "verifiers", "options": {"env": QA}}})
    with pytest.raises(RunFolderError, match="task.options.env"):
        refuse_folder_code(cfg, [], "runs/x/config.toml", trusted=False)
    refuse_folder_code(cfg, [], "runs/x/config.toml", trusted=True)
    refuse_folder_code(cfg, ["--task.options.env", QA], "runs/x/config.toml", trusted=False)

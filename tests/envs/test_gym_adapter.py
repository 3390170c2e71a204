"""`tokenflow.envs.gym_adapter.GymEnv`: Gym-style text environments (gymnasium's 5-tuple, the
older 4-tuple, SkyRL-gym's mapping, TextArena's games) played as tokenflow environments with no
glue code; a step that raises names itself; examples are seeds, so resume is exact; and a real
run trains through the adapter."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from pathlib import Path

import pytest

from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig
from tokenflow.envs import EnvironmentLoadError, play_reference_episodes
from tokenflow.envs.gym_adapter import GymEnv, GymEnvError
from tokenflow.envs.task import EnvTask
from tokenflow.tasks import build_task

GYM = "tokenflow.envs.gym_adapter:GymEnv"
ROOT = Path(__file__).parents[2]

GYM_ENVS = textwrap.dedent('''
    """Small Gym-style text environments, as a user writes them (no tokenflow import)."""
    import random


    class FiveTuple:
        """Say my number from 1 to `high`: gymnasium's shape, "no" until right, `tries` tries."""

        def __init__(self, high=3, tries=3):
            self.high, self.tries = high, tries

        def reset(self, seed=None, options=None):
            self.seed = seed
            self.target = random.Random(seed).randint(1, self.high)
            self.left = self.tries
            return f"Say a number from 1 to {self.high}.", {"target": self.target}

        def step(self, action):
            if "boom" in action:
                raise ValueError("the game server went away")
            self.left -= 1
            if action.strip() == str(self.target):
                return "", 1.0, True, False, {"tries": 1, "note": "won"}
            return "no", 0.0, False, self.left == 0, {"tries": 1, "detail": {"nested": 1}}


    class FourTuple(FiveTuple):
        """The older shape: reset() gives the observation alone, step (obs, reward, done, info)."""

        def reset(self, seed=None):
            return super().reset(seed)[0]

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated or truncated, info


    class Odd(FiveTuple):
        def step(self, action):
            return ("no", 0.0)


    class Flaky(FiveTuple):
        """Its server drops the steps of one game in four."""

        def step(self, action):
            if self.seed % 4 == 0:
                raise ConnectionError("the game server dropped the call")
            return super().step(action)
''')


@pytest.fixture(scope="module")
def envs_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gym") / "gym_envs.py"
    path.write_text(GYM_ENVS)
    return path


def step(env: GymEnv, text: str):
    return asyncio.run(env.step({"role": "assistant", "content": text}))


def play(env: GymEnv, example: dict, policy, max_turns: int = 10):
    """Drive reset/step as the runtime does; returns (transcript, step rewards, last result)."""
    messages, tools = env.reset(example)
    assert tools == []
    rewards = []
    for _ in range(max_turns):
        action = policy(messages)
        result = step(env, action)
        messages = [*messages, {"role": "assistant", "content": action}, *result.observations]
        rewards += [result.reward] if result.reward is not None else []
        if result.done:
            env.close()
            return messages, rewards, result
    raise AssertionError("the game did not end")


def counting(messages):
    """Say 1, then 2, then 3..."""
    return str(sum(m["role"] == "assistant" for m in messages) + 1)


@pytest.mark.parametrize("shape", ["FiveTuple", "FourTuple"])
def test_a_gym_style_env_plays_through_the_adapter(envs_file, shape):
    env = GymEnv(make=f"{envs_file}:{shape}", kwargs={"high": 3, "tries": 3})
    example = GymEnv.train_example(7, 0)
    messages, rewards, last = play(env, example, counting)
    target = env.env.target
    assert env.kind == "gymnasium" and env.state["seed"] == example["seed"]
    assert messages[0] == {"role": "user", "content": "Say a number from 1 to 3."}
    # Observations became user messages, one per wrong guess; the reward is the env's.
    assert [m["content"] for m in messages if m["role"] == "user"][1:] == ["no"] * (target - 1)
    assert rewards == [0.0] * (target - 1) + [1.0] and last.done
    assert last.info == {"tries": 1, "note": "won"}  # numbers and strings; nested values left out


def test_truncation_ends_the_episode_and_is_counted(envs_file):
    env = GymEnv(make=f"{envs_file}:FiveTuple", kwargs={"high": 3, "tries": 1})
    env.reset({"seed": 1})
    wrong = "3" if env.env.target != 3 else "1"
    result = step(env, wrong)
    assert result.done and result.reward == 0.0 and result.info["gym_truncated"] == 1


def test_a_step_that_raises_names_the_env_the_call_and_the_action(envs_file):
    env = GymEnv(make=f"{envs_file}:FiveTuple", id=None)
    env.reset({"seed": 3})
    with pytest.raises(GymEnvError, match=r"gym_envs.py:FiveTuple: step raised ValueError: the game server "
                                          r"went away on action 'boom now'"):
        step(env, "boom now")
    odd = GymEnv(make=f"{envs_file}:Odd")
    odd.reset({"seed": 3})
    with pytest.raises(GymEnvError, match=r"step returned a tuple of 2; expected \(obs, reward, terminated"):
        step(odd, "1")


def test_a_factory_that_does_not_resolve_is_refused_at_start(envs_file):
    with pytest.raises(EnvironmentLoadError, match="no callable 'Nope'.*task.options.make"):
        EnvTask(GYM, options={"make": f"{envs_file}:Nope"}).train_prompt(0)
    with pytest.raises(EnvironmentLoadError, match="takes no option 'idd'"):
        EnvTask(GYM, options={"make": f"{envs_file}:FiveTuple", "idd": "x"})


def test_examples_are_seeds_so_the_same_index_plays_the_same_game(envs_file):
    task = EnvTask(GYM, options={"make": f"{envs_file}:FiveTuple", "kwargs": {"high": 1000}}, seed=5,
                   num_eval=50)
    assert task.train_prompt(3) == task.train_prompt(3) and task.train_prompt(3).id == 3
    assert task.train_prompt(3) != EnvTask(GYM, options=task.options, seed=6).train_prompt(3)

    def target(example):
        env = task.make_env()
        env.reset(example)
        return env.env.target

    examples = [task.train_prompt(i).example for i in range(30)]
    assert [target(e) for e in examples] == [target(e) for e in examples]  # fresh instances, same games
    assert len({target(e) for e in examples}) > 20
    train_seeds = {task.train_prompt(i).example["seed"] for i in range(2000)}
    assert not train_seeds & {p.example["seed"] for p in task.eval_prompts()}


def test_the_reference_driver_plays_the_adapter_token_in_token_out(envs_file):
    """The adapter under `play_reference_episodes` (what the runtime's driver is checked
    against): a scripted policy's turns and the env's "no" become ids through the chat template."""
    from transformers import AutoTokenizer

    from tokenflow.model_store import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("default-tool"))
    end = tok.convert_tokens_to_ids("<eot>")

    def generate(prompts, stop):
        assert end in stop
        return [tok.encode(str(tok.decode(p).count("no") + 1), add_special_tokens=False) + [end] for p in prompts]

    examples = [GymEnv.train_example(i, 0) for i in range(4)]
    trajs = asyncio.run(play_reference_episodes(GymEnv, examples, tok, generate,
                                                options={"make": f"{envs_file}:FiveTuple"}))
    for t in trajs:
        assert t.episode.step_rewards[-1] == 1.0 and not t.episode.truncated
        assert t.episode.turns == int(t.episode.messages[-1]["content"])  # counted up to the target
        assert (0 in t.loss_mask) == (t.episode.turns > 1)  # the env's ids between the model's turns
    assert max(t.episode.turns for t in trajs) > 1


def binary_search(messages, low=1, high=5):
    """TextArena's GuessTheNumber, played well: halve the range on each hint."""
    for said, answer in zip(messages, messages[1:]):
        if said["role"] == "assistant":
            guess = int(re.search(r"\[(\d+)\]", said["content"]).group(1))
            if "higher" in answer["content"]:
                low = guess + 1
            elif "lower" in answer["content"]:
                high = guess - 1
    return f"I guess [{(low + high) // 2}]."


TEXTARENA = {"make": "textarena:make", "id": "GuessTheNumber-v0",
             "kwargs": {"min_number": 1, "max_number": 5, "max_turns": 3}}


def test_textarena_guess_the_number_through_the_adapter():
    pytest.importorskip("textarena")
    task = EnvTask(GYM, options=TEXTARENA, num_eval=8)
    targets = []
    for i in range(12):
        env = task.make_env()
        messages, rewards, last = play(env, task.train_prompt(i).example, binary_search)
        targets.append(env.env.game_number)
        assert env.kind == "textarena" and "Guess The Number" in messages[0]["content"]
        # Each hint is one new user message (TextArena's observation wrapper, which re-renders
        # the whole history, is read past; the model's own action is not echoed back).
        hints = [m["content"] for m in messages[1:] if m["role"] == "user"]
        assert all(re.fullmatch(r"The target number is (higher|lower)\.", h) for h in hints)
        assert rewards == [1.0] and last.info["turn_count"] == len(hints) + 1 <= 3
        assert "Congratulations" in last.info["reason"]
    assert len(set(targets)) > 1
    # The same seed, the same game: what resume relies on.
    again = task.make_env()
    again.reset(task.train_prompt(0).example)
    assert again.env.game_number == targets[0]
    # A game lost: the reward is TextArena's (the last guess's closeness), at the game's end.
    env = task.make_env()
    env.reset(task.train_prompt(0).example)
    wrong = [g for g in "12345" if int(g) != targets[0]]  # TextArena's max_turns = 3 lets four guesses in
    results = [step(env, g) for g in wrong]
    assert [r.done for r in results] == [False, False, False, True] and results[-1].reward is not None
    assert 0 <= results[-1].reward < 1 and all(r.reward is None for r in results[:3])


def test_skyrl_gym_multi_turn_env_through_the_adapter():
    pytest.importorskip("skyrl_gym")
    env = GymEnv(make="skyrl_gym:make", id="gsm8k_multi_turn", kwargs={"env_config": {}}, example_arg="extras")
    example = {"prompt": [{"role": "user", "content": "2+3? End with '#### ANSWER'."}],
               "reward_spec": {"ground_truth": "5"}, "extra_info": {}, "max_turns": 3}
    answers = iter(["Let me think.", "#### 4", "#### 5"])
    messages, rewards, last = play(env, example, lambda _: next(answers))
    assert env.kind == "skyrl" and messages[0] == example["prompt"][0]
    assert len([m for m in messages if m["role"] == "user"]) == 3 and rewards[0] == 0.0
    assert 0 < rewards[1] < 1 and rewards[2] == 1.0 and last.done


def test_the_shipped_example_config_builds_its_task():
    pytest.importorskip("textarena")
    cfg = load_config(TrainConfig, str(ROOT / "examples/gym_env/config.toml"), [])
    task = build_task(cfg.task)
    assert task.env_cls is GymEnv and cfg.episode.max_turns == 4
    messages, _ = task.make_env().reset(task.train_prompt(0).example)
    assert "the number between 1 and 5 within 3 turns" in messages[0]["content"]


@pytest.mark.slow
def test_a_real_run_trains_through_the_adapter_and_a_raising_step_fails_only_its_sample(envs_file, tmp_path):
    from tests.runtime.runtime_testlib import small_config, step_rows
    from tokenflow.model_store import resolve_model_path
    from tokenflow.runtime.launch import train

    cfg = small_config("--model.path", resolve_model_path("default-tool"), "--task.name", "env", "--task.env", GYM,
                       "--task.options.make", f"{envs_file}:Flaky", "--sampling.max_tokens", "16",
                       "--episode.max_turns", "3", "--episode.max_total_tokens", "96", "--run.steps", "2",
                       "--run.checkpoint_every", "0", "--run.eval_limit", "4")
    assert train(cfg, tmp_path / "run")["steps"] == 2
    rows = step_rows(tmp_path / "run")
    assert len(rows) == 2 and all(r["episode/count"] == 16 for r in rows)
    failed = sum(r["episode/failed"] for r in rows)
    assert 0 < failed < 32  # the games whose server drops calls, and only those
    assert all(r["reward/failed_frac"] == r["episode/failed"] / 16 for r in rows)
    assert max(r["episode/turns_mean"] for r in rows) > 1  # "no" answered, the model went on
    samples = [json.loads(line) for line in (tmp_path / "run/samples.jsonl").read_text().splitlines()]
    errors = [s["error"] for s in samples if s["error"]]
    assert errors and all("GymEnvError" in e and "dropped the call" in e for e in errors)


def test_textarena_games_reset_on_threads_are_the_games_of_their_seeds(monkeypatch):
    """Resets run on worker threads and TextArena seeds the global ``random``: the adapter's
    lock keeps each game the one its seed makes, even when threads switch between the seeding
    and the draw (made certain here by a pause after each seeding)."""
    import random
    import time
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("textarena")
    task = EnvTask(GYM, options={**TEXTARENA, "kwargs": {"min_number": 1, "max_number": 10**6}})
    examples = [task.train_prompt(i).example for i in range(32)]

    def game(example):
        env = task.make_env()
        env.reset(example)
        return env.env.game_number

    alone = [game(e) for e in examples]
    seed = random.seed

    def seed_then_pause(*args, **kwargs):
        seed(*args, **kwargs)
        time.sleep(0.002)

    monkeypatch.setattr(random, "seed", seed_then_pause)
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(game, examples)) == alone


def test_a_run_folder_whose_options_name_a_factory_needs_trust():
    """``make`` is imported: a run folder's config that names one runs it only when trusted."""
    from tokenflow.errors import RunFolderError
    from tokenflow.runtime.run.folder_code import code_keys, refuse_folder_code

    options = {"make": "evil.py:make", "kwargs": {"factory": "pkg.mod:build", "url": "http://127.0.0.1:8000",
                                                   "at": "12:30", "own": "tokenflow.envs.calculator:x"}}
    cfg = TrainConfig.model_validate({"task": {"name": "env", "env": "tokenflow.envs.gym_adapter:GymEnv",
                                               "options": options}})
    assert [k.split(" ")[0] for k in code_keys(cfg, set())] == ["task.options.make", "task.options.kwargs.factory"]
    with pytest.raises(RunFolderError, match="task.options.make = 'evil.py:make'"):
        refuse_folder_code(cfg, [], "runs/x/config.toml", trusted=False)
    refuse_folder_code(cfg, [], "runs/x/config.toml", trusted=True)
    refuse_folder_code(cfg, ["--task.options", '{make = "evil.py:make", kwargs = {factory = "pkg.mod:build"}}'],
                       "runs/x/config.toml", trusted=False)

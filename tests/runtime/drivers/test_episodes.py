"""Multi-turn episodes on the built-in engine, with the shipped tool model and the calculator
environment: what the trainer trains on is exactly what the engine sampled plus the bridged
environment ids, and environments that hang, raise, block their loop or get malformed tool
calls fail their own samples without holding up a group."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import numpy as np
import pytest

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.envs import ChatBridge
from tokenflow.envs.calculator import CalculatorEnv, add
from tokenflow.runtime.drivers.episodes import EpisodeSpec, run_episodes
from tokenflow.model_store import resolve_model_path
from tokenflow.trainer import Trainer, TrainerConfig
from tokenflow.trainer.batch import to_train_sequence

HERE = "tests.runtime.drivers.test_episodes"


@pytest.fixture(scope="module")
def tool_model() -> str:
    import os
    return os.environ.get("TF_TOOL_MODEL") or resolve_model_path("default-tool")


def _engine(path: str, **kw) -> Engine:
    return Engine(path, EngineConfig(device="cpu", dtype="float32", threads=1, **kw))


def _specs(env: str, n: int, start: int = 0, **kw) -> list[EpisodeSpec]:
    return [EpisodeSpec(env, CalculatorEnv.train_example(start + i, 0), **kw) for i in range(n)]


class _Recorder:
    """Wraps an engine's ``step`` to keep every rollout it returns, in order (a turn's output)."""

    def __init__(self, engine) -> None:
        self.outputs: dict[str, list] = {}
        step = engine.step

        def recording_step():
            out = step()
            for r in out:
                self.outputs.setdefault(r.request_id, []).append(
                    (r.completion_ids.copy(), r.loss_mask.copy(), r.logprobs.copy()))
            return out

        engine.step = recording_step


def _segments(mask: np.ndarray) -> list[tuple[int, int, int]]:
    """(start, end, mask value) runs of a loss mask."""
    cuts = [0] + [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]] + [len(mask)]
    return [(a, b, int(mask[a])) for a, b in zip(cuts, cuts[1:])]


def test_trained_ids_are_the_sampled_ids_plus_bridged_environment_ids(tool_model):
    engine = _engine(tool_model)
    rec = _Recorder(engine)
    params = SamplingParams(temperature=1.0, max_tokens=32, n=4, seed=3)
    groups = run_episodes(engine, _specs("tokenflow.envs.calculator:CalculatorEnv", 6,
                                         max_total_tokens=200), params)
    rows = [r for g in groups for r in g]
    assert all(not r.failed for r in rows)
    multi = [r for r in rows if r.info["episode"]["turns"] >= 2]
    assert len(multi) >= len(rows) // 2, "the tool model should call a tool in most episodes"
    for r in rows:
        record = r.info["episode"]["episode"]
        bridge = ChatBridge(engine.tokenizer, tools=CalculatorEnv.tools)
        # The prompt is the template's rendering of the opening message.
        assert r.prompt_ids.tolist() == bridge.prompt_ids(record.messages[:1])
        # Every environment run is the template difference for the observations that followed
        # the assistant turn before it; every model run is what the engine returned for it.
        turns = iter([i for i, m in enumerate(record.messages) if m["role"] == "assistant"])
        outputs = rec.outputs[f"{r.request_id}#{r.sample_index}"]
        for k, (a, b, generated) in enumerate(_segments(r.loss_mask)):
            if generated:
                engine_ids = next(out for out in outputs if len(out[0]) == b)[0]
                assert r.completion_ids[a:b].tolist() == engine_ids[a:b].tolist()
                assert (r.turns[a:b] == k // 2).all()
            else:
                i = next(turns)
                nxt = next((j for j in range(i + 1, len(record.messages)) if record.messages[j]["role"] == "assistant"),
                           len(record.messages))
                observations = record.messages[i + 1:nxt]
                want = bridge.environment_ids(observations, assistant=record.messages[i])
                assert r.completion_ids[a:b].tolist() == want
                assert (r.logprobs[a:b] == 0).all()
        # The trainer's sequence is the same ids, bit for bit, and trains on generated ids only.
        seq = to_train_sequence(0, r, 0, keep_sampling_mask=False, max_token_age=None)
        full = np.concatenate([r.prompt_ids, r.completion_ids])
        assert np.array_equal(seq.input_ids, full[:-1])
        assert np.array_equal(seq.targets, r.completion_ids)
        assert np.array_equal(seq.loss_mask, r.loss_mask > 0)
    # On-policy, the trainer's log-probs of the generated tokens are the engine's.
    for gid, g in enumerate(groups):
        for k, r in enumerate(g):
            r.group_id, r.reward = gid, float(k % 2)
    trainer = Trainer(tool_model, TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig())
    m = trainer.train_step(rows)
    assert m["offpolicy/mismatch_tokens"] == sum(int(r.loss_mask.sum()) for r in rows)
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5
    print(f"mismatch over {m['offpolicy/mismatch_tokens']:.0f} generated tokens of {len(rows)} episodes: "
          f"{m['offpolicy/mismatch_abs_logprob']:.2e}")


def test_continuations_reuse_the_parked_prefix(tool_model):
    engine = _engine(tool_model)
    params = SamplingParams(temperature=0.0, max_tokens=32, n=1)
    groups = run_episodes(engine, _specs("tokenflow.envs.calculator:CalculatorEnv", 8), params)
    turns = sum(g[0].info["episode"]["turns"] for g in groups)
    assert turns > len(groups)
    # Every continuation (a model turn after the first) found its prefix's KV parked.
    continued = sum(len(np.unique(g[0].turns)) - 1 for g in groups if g[0].turns is not None)
    st = engine.stats
    assert continued > 0 and st.parked_hits == continued and st.parked_misses == 0
    assert st.reused_prefix_tokens > 0


class Hangs(CalculatorEnv):
    async def step(self, assistant_message):
        await asyncio.sleep(3600)


class Raises(CalculatorEnv):
    async def step(self, assistant_message):
        raise RuntimeError("the calculator service is down")


class BlocksItsLoop(CalculatorEnv):
    """Calls a blocking function inside ``async def``: the whole environment loop stalls, so
    the loop's own timeout cannot fire; the driver's deadline must. The test lets go of it
    (``released``) once the driver has given up, rather than leave it to wake in a later test."""

    released = threading.Event()

    async def step(self, assistant_message):
        self.released.wait(20.0)
        return await super().step(assistant_message)


class OnlyAdds(CalculatorEnv):
    """Offers ``add`` only: every ``mul(...)`` the model writes is a call to an unknown tool."""

    tools = [add]


@pytest.mark.parametrize("env,why", [
    ("Hangs", "exceeded"), ("Raises", "calculator service is down"), ("BlocksItsLoop", "blocked")])
def test_a_broken_environment_fails_its_samples_and_no_group_sticks(tool_model, env, why, caplog):
    engine = _engine(tool_model)
    params = SamplingParams(temperature=1.0, max_tokens=32, n=2, seed=1)
    BlocksItsLoop.released.clear()
    t0 = time.monotonic()
    groups = run_episodes(engine, _specs(f"{HERE}:{env}", 3, step_timeout_s=0.3), params)
    assert time.monotonic() - t0 < 10  # the blocked loop waits 20 s: the deadline ended it
    # Once the environment lets go, its loop's thread ends and leaves no task pending.
    BlocksItsLoop.released.set()
    for thread in threading.enumerate():
        if thread.name == "env-loop":
            thread.join(timeout=5.0)
            assert not thread.is_alive()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert "destroyed but it is pending" not in caplog.text
    rows = [r for g in groups for r in g]
    assert len(groups) == 3 and all(len(g) == 2 for g in groups)
    stepped = [r for r in rows if r.info["episode"]["finish"] != "stop" or r.failed]
    failed = [r for r in rows if r.failed]
    assert failed, "every episode that reached a step must fail"
    for r in failed:
        assert r.info["episode"]["finish"] == "error" and why in r.info["env_error"]
    assert len(stepped) == len(rows)


def test_malformed_tool_calls_are_answered_and_counted(tool_model):
    engine = _engine(tool_model)
    params = SamplingParams(temperature=0.0, max_tokens=32, n=1)
    groups = run_episodes(engine, _specs(f"{HERE}:OnlyAdds", 6), params)
    rows = [g[0] for g in groups]
    assert not any(r.failed for r in rows)
    bad = sum(r.info["episode"]["info"].get("malformed_tool_calls", 0) for r in rows)
    assert bad > 0


def test_a_template_that_rewrites_earlier_turns_gets_one_row_per_turn(tool_model, tmp_path):
    """The tool model's template, changed to render earlier assistant turns without their
    content: the bridge's prefix check fails, and every model turn becomes its own row whose
    prompt is the template's rendering of the conversation so far."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tool_model, folder)
    template = (folder / "chat_template.jinja").read_text()
    start = "{%- for m in messages -%}"
    assert template.count(start) == 1
    template = template.replace(start, start + "{%- if m.role == 'assistant' and not loop.last -%}<assistant><eot>"
                                "{%- else -%}").replace("{{- '<eot>' -}}{%- endfor -%}",
                                                        "{{- '<eot>' -}}{%- endif -%}{%- endfor -%}")
    (folder / "chat_template.jinja").write_text(template)
    engine = _engine(str(folder))
    bridge = ChatBridge(engine.tokenizer, tools=CalculatorEnv.tools)
    assert not bridge.prefix_check().ok
    params = SamplingParams(temperature=0.0, max_tokens=32, n=1)
    groups = run_episodes(engine, _specs("tokenflow.envs.calculator:CalculatorEnv", 6), params)
    multi = [g for g in groups if g[0].info["episode"]["turns"] >= 2]
    assert multi
    for rows in groups:
        e = rows[0].info["episode"]
        messages = e["episode"].messages
        assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert len(rows) == e["turns"] == e["rows"] == len(assistant_at)
        for row, i in zip(rows, assistant_at):
            assert row.prompt_ids.tolist() == bridge.prompt_ids(messages[:i])
            assert (row.loss_mask == 1).all() and row.turns is None and not row.failed
            assert row.completion_ids[-1] in bridge.turn_end_ids or row is rows[-1]

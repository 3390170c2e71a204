"""Agent tasks through training sessions, with the official ``openai`` client, the built-in
engine and the shipped tool model: rows built from session calls are exactly the ids and
behaviour log-probs the engine returned to the agent, calls that rewrite the history start new
rows, agents that raise or hang fail their own samples, and a run trains through sessions."""

from __future__ import annotations

import textwrap
import threading
import time

import numpy as np
import pytest

from tests.runtime.runtime_testlib import small_config, step_rows
from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.envs.calculator import CalculatorEnv
from tokenflow.runtime.drivers.agents import run_agents
from tokenflow.runtime.drivers.episodes import EpisodeSpec
from tokenflow.runtime.launch import train
from tokenflow.model_store import resolve_model_path

openai = pytest.importorskip("openai")

CALCULATOR = "tokenflow.envs.calculator:CalculatorEnv"
HERE = "tests.runtime.drivers.test_agents"
AGENT = "examples/agents/calculator_agent.py:solve"

CALLS: dict[str, list[dict]] = {}
"""What each session's calls returned to the agent, by base URL (filled by `recording_agent`)."""
_lock = threading.Lock()


@pytest.fixture(scope="module")
def tool_model() -> str:
    import os
    return os.environ.get("TF_TOOL_MODEL") or resolve_model_path("default-tool")


def _engine(path: str) -> Engine:
    return Engine(path, EngineConfig(device="cpu", dtype="float32", threads=1))


def _specs(agent: str, n: int, **kw) -> list[EpisodeSpec]:
    return [EpisodeSpec(CALCULATOR, CalculatorEnv.train_example(i, 0), agent=agent, **kw) for i in range(n)]


def _segments(mask: np.ndarray) -> list[tuple[int, int, int]]:
    cuts = [0] + [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]] + [len(mask)]
    return [(a, b, int(mask[a])) for a, b in zip(cuts, cuts[1:])]


# ---- agents (module-level: the driver loads them by name) -----------------------------------

def recording_agent(base_url: str, example: dict) -> str:
    """The example's calculator agent, asking for token ids and log-probs and keeping them."""
    import sys
    sys.path.insert(0, "examples/agents")
    from calculator_agent import TOOLS, tool_results

    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": example["prompt"]}]
    for _ in range(4):
        out = client.chat.completions.create(model="anything", messages=messages, tools=TOOLS, max_tokens=32,
                                             temperature=0.0, logprobs=True,
                                             extra_body={"tool_format": "plain", "return_token_ids": True})
        extra = out.model_extra or {}
        choice = out.choices[0]
        with _lock:
            CALLS.setdefault(base_url, []).append({
                "prompt_ids": extra["prompt_token_ids"], "ids": choice.model_extra["token_ids"],
                "logprobs": [t.logprob for t in choice.logprobs.content]})
        reply = choice.message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        messages += tool_results(reply)
    return ""


def forgetful_agent(base_url: str, example: dict) -> str:
    """Asks, then asks again with the question reworded: the second call does not extend the first."""
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    first = client.chat.completions.create(model="p", messages=[{"role": "user", "content": example["prompt"]}],
                                           max_tokens=8, extra_body={"return_token_ids": True})
    second = client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": example["prompt"] + " "}], max_tokens=8,
        extra_body={"return_token_ids": True})
    with _lock:
        CALLS[base_url] = [{"prompt_ids": c.model_extra["prompt_token_ids"], "ids": c.choices[0].model_extra["token_ids"]}
                           for c in (first, second)]
    return second.choices[0].message.content or ""


async def async_agent(base_url: str, example: dict) -> str:
    """Written with ``AsyncOpenAI``: the driver runs it on an event loop, not a thread."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    out = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": example["prompt"]}],
                                               max_tokens=8, extra_body={"return_token_ids": True})
    with _lock:
        CALLS[base_url] = [{"prompt_ids": out.model_extra["prompt_token_ids"], "ids": out.choices[0].model_extra["token_ids"],
                            "thread": threading.current_thread().name}]
    return out.choices[0].message.content or ""


def streaming_agent(base_url: str, example: dict) -> str:
    """The calculator loop with every reply streamed and reassembled from its chunks."""
    sys_path_agent()
    from calculator_agent import TOOLS, run_tool

    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": example["prompt"]}]
    for _ in range(4):
        content, calls = "", {}
        for chunk in client.chat.completions.create(model="p", messages=messages, tools=TOOLS, max_tokens=32,
                                                    stream=True, extra_body={"tool_format": "plain"}):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for d in choice.delta.tool_calls or []:
                    calls.setdefault(d.index, {"id": d.id, "type": "function", "function": {"name": "", "arguments": ""}})
                    calls[d.index]["function"]["name"] += d.function.name or ""
                    calls[d.index]["function"]["arguments"] += d.function.arguments or ""
        reply = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [calls[k] for k in sorted(calls)]
        messages.append(reply)
        if not calls:
            return content
        for call in reply["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                             "content": run_tool(call["function"]["name"], call["function"]["arguments"])})
    return ""


def raising_agent(base_url: str, example: dict) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="p", messages=[{"role": "user", "content": example["prompt"]}], max_tokens=4)
    raise ConnectionError("the agent's own backend is down")


def hanging_agent(base_url: str, example: dict) -> str:
    with _lock:
        CALLS[base_url] = []
    time.sleep(4.0)
    return ""


def greedy_asking_agent(base_url: str, example: dict) -> str:
    """Asks for temperature 0 and n = 2: the session samples at the run's temperature, and refuses n."""
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    seen = []
    try:
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "1*1"}], n=2)
    except openai.BadRequestError as e:
        seen.append((e.status_code, e.body.get("param")))
    stranger = openai.OpenAI(base_url=base_url.replace("/sessions/", "/sessions/x"), api_key="x", max_retries=0)
    try:
        stranger.chat.completions.create(model="p", messages=[{"role": "user", "content": "1*1"}])
    except openai.NotFoundError as e:
        seen.append((e.status_code, e.body.get("code")))
    with _lock:
        CALLS[base_url] = seen
    out = client.chat.completions.create(model="p", messages=[{"role": "user", "content": example["prompt"]}],
                                         temperature=0.0, max_tokens=200)
    return out.choices[0].message.content or ""


# ---- tests ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_session_rows_are_exactly_what_the_engine_returned_to_the_agent(tool_model):
    CALLS.clear()
    engine = _engine(tool_model)
    params = SamplingParams(temperature=1.0, max_tokens=32, n=4, seed=5)
    groups = run_agents(engine, _specs(f"{HERE}:recording_agent", 6), params)
    rows = [r for g in groups for r in g]
    assert all(not r.failed for r in rows)
    assert len(rows) == 24, "every session's calls extend one another: one row per sample"
    assert sum(r.info["episode"]["turns"] >= 2 for r in rows) >= 12, "the tool model should call a tool"
    by_sample = {}
    for url, calls in CALLS.items():
        rid, index = url.rsplit("/sessions/", 1)[1].split(".")[:2]
        by_sample[(rid, int(index))] = calls
    tokens = 0
    for r in rows:
        calls = by_sample[(r.request_id, r.sample_index)]
        assert r.prompt_ids.tolist() == calls[0]["prompt_ids"]
        generated = [(a, b) for a, b, m in _segments(r.loss_mask) if m]
        between = [(a, b) for a, b, m in _segments(r.loss_mask) if not m]
        assert len(generated) == len(calls) and len(between) == len(calls) - 1
        full = r.prompt_ids.tolist() + r.completion_ids.tolist()
        offset = len(r.prompt_ids)
        for k, ((a, b), call) in enumerate(zip(generated, calls)):
            # The ids and behaviour log-probs the agent got back are the row's, bit for bit.
            assert r.completion_ids[a:b].tolist() == call["ids"]
            assert np.array_equal(r.logprobs[a:b], np.asarray(call["logprobs"], dtype=np.float32))
            assert (r.turns[a:b] == k).all() and (r.versions[a:b] == 0).all()
            # Each call's prompt is the row up to that call: prompt, sampled ids, the new messages.
            assert call["prompt_ids"] == full[:offset + a]
            tokens += b - a
        for a, b in between:
            assert (r.logprobs[a:b] == 0).all()
        assert r.info["episode"]["info"]["calls_from_sampled_ids"] == len(calls) - 1
    # The run's temperature (1.0), not the agent's (0.0): the samples of a prompt differ.
    assert all(r.temperature == 1.0 for r in rows)
    assert any(len({tuple(r.completion_ids.tolist()) for r in g}) > 1 for g in groups)
    # On-policy, the trainer's log-probs of the sampled tokens are the engine's.
    from tokenflow.algorithms import AlgorithmConfig
    from tokenflow.trainer import Trainer, TrainerConfig

    for gid, g in enumerate(groups):
        for k, r in enumerate(g):
            r.group_id, r.reward = gid, float(k % 2)
    trainer = Trainer(tool_model, TrainerConfig(device="cpu", lr=0.0, skip_zero_advantage=False), AlgorithmConfig())
    m = trainer.train_step(rows)
    assert m["offpolicy/mismatch_tokens"] == tokens
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5
    print(f"mismatch over {tokens} sampled tokens of {len(rows)} session rows: {m['offpolicy/mismatch_abs_logprob']:.2e}")


def test_a_call_that_does_not_extend_the_session_starts_a_new_row(tool_model):
    CALLS.clear()
    engine = _engine(tool_model)
    groups = run_agents(engine, _specs(f"{HERE}:forgetful_agent", 2), SamplingParams(max_tokens=8, n=2, seed=1))
    for g in groups:
        assert len(g) == 4  # two samples, two rows each
        for first, second in zip(g[0::2], g[1::2]):
            assert (first.sample_index, first.info["row"], second.info["row"]) == (second.sample_index, 0, 1)
            assert first.loss_mask.all() and second.loss_mask.all()  # nothing bridged, nothing masked
            calls = next(c for url, c in CALLS.items() if f"/sessions/{first.request_id}.{first.sample_index}." in url)
            assert first.prompt_ids.tolist() == calls[0]["prompt_ids"] and first.completion_ids.tolist() == calls[0]["ids"]
            assert second.prompt_ids.tolist() == calls[1]["prompt_ids"] and second.completion_ids.tolist() == calls[1]["ids"]
            assert first.info["episode"] is second.info["episode"]  # one reward for the sample
            assert first.info["episode"]["rows"] == 2


def test_streamed_calls_extend_one_another_too(tool_model):
    groups = run_agents(_engine(tool_model), _specs(f"{HERE}:streaming_agent", 4), SamplingParams(max_tokens=32, n=2, seed=4))
    rows = [r for g in groups for r in g]
    assert len(rows) == 8 and not any(r.failed for r in rows)
    multi = [r for r in rows if r.info["episode"]["turns"] >= 2]
    assert multi, "the tool model should call a tool"
    for r in multi:  # one row per sample: each streamed reply, re-sent, continued the row from its ids
        summary = r.info["episode"]
        assert summary["rows"] == 1 and (r.loss_mask == 0).any()
        assert summary["info"]["calls_from_sampled_ids"] == summary["turns"] - 1


def test_an_async_agent_runs_on_the_event_loop(tool_model):
    CALLS.clear()
    groups = run_agents(_engine(tool_model), _specs(f"{HERE}:async_agent", 2), SamplingParams(max_tokens=8, n=2))
    rows = [r for g in groups for r in g]
    assert len(rows) == 4 and not any(r.failed for r in rows)
    for r in rows:
        call = next(c[0] for url, c in CALLS.items() if f"/sessions/{r.request_id}.{r.sample_index}." in url)
        assert r.prompt_ids.tolist() == call["prompt_ids"] and r.completion_ids.tolist() == call["ids"]
        assert call["thread"] == "env-loop"


@pytest.mark.parametrize("agent,why", [("raising_agent", "ConnectionError"), ("hanging_agent", "did not return")])
@pytest.mark.slow
def test_an_agent_that_raises_or_hangs_fails_its_samples_and_the_group_returns(tool_model, agent, why):
    CALLS.clear()
    engine = _engine(tool_model)
    t0 = time.monotonic()
    groups = run_agents(engine, _specs(f"{HERE}:{agent}", 2, agent_timeout_s=1.0), SamplingParams(max_tokens=4, n=2))
    assert time.monotonic() - t0 < 30
    for g in groups:
        assert all(r.failed and why in r.info["env_error"] for r in g)


def test_the_session_samples_as_the_run_does_and_refuses_n(tool_model):
    CALLS.clear()
    engine = _engine(tool_model)
    groups = run_agents(engine, _specs(f"{HERE}:greedy_asking_agent", 1),
                        SamplingParams(temperature=0.7, max_tokens=6, n=3, seed=2))
    rows = groups[0]
    assert all(not r.failed for r in rows)
    assert all(r.temperature == 0.7 and r.num_tokens <= 6 for r in rows)
    # n > 1 is a 400 naming n; a session that is not open is a 404, both in OpenAI's shape.
    assert all(seen == [(400, "n"), (404, "session_not_found")] for seen in CALLS.values())


@pytest.mark.slow
def test_an_agent_task_trains_through_sessions(tmp_path):
    summary = train(small_config(
        "--model.path", resolve_model_path("default-tool"), "--task.name", "env", "--task.env", CALCULATOR,
        "--task.agent", AGENT, "--sampling.max_tokens", "32", "--run.steps", "2", "--run.checkpoint_every", "0"),
        tmp_path / "run")
    assert summary["steps"] == 2
    rows = step_rows(tmp_path / "run")
    for row in rows:
        assert row["episode/count"] == 16 and row["episode/failed"] == 0
        assert row["episode/multi_turn_frac"] > 0.5 and 0 < row["episode/env_tokens_frac"] < 1
        assert row["buffer/token_age_max"] <= 2
    assert rows[0]["offpolicy/mismatch_abs_logprob"] < 1e-5  # step 1 is on-policy
    assert summary["baseline_accuracy"] is not None and summary["final_accuracy"] is not None


@pytest.mark.slow
def test_an_agent_that_does_not_load_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "agent.py").write_text(textwrap.dedent("""
        def solve(base_url):
            return ""
    """))
    from tokenflow.errors import InputError

    with pytest.raises(InputError, match=r"must take two arguments, \(base_url, example\)"):
        train(small_config("--model.path", resolve_model_path("default-tool"), "--task.name", "env",
                           "--task.env", CALCULATOR, "--task.agent", f"{tmp_path / 'agent.py'}:solve"),
              tmp_path / "run")
    with pytest.raises(Exception, match="task.agent is set without task.env"):
        small_config("--task.agent", f"{tmp_path / 'agent.py'}:solve")


def test_a_replayed_history_continues_from_the_sampled_ids_not_a_new_rendering(tool_model):
    """The model wrote ``mul(11, 52)`` (a space the template does not render): a call that
    replays that reply continues from the ids it sampled, so the row trains on what was sampled;
    rendering the history afresh would have dropped the space."""
    from tokenflow.rollout import Rollout
    from tokenflow.serve.driver import EngineDriver
    from tokenflow.serve.sessions import SessionCall, SessionService

    sys_path_agent()
    from calculator_agent import TOOLS

    engine = _engine(tool_model)
    service = SessionService(EngineDriver(engine))
    tok = engine.tokenizer
    user = {"role": "user", "content": "11*52+4"}
    prompt = service.chat_format.bridge.prompt_ids([user], schemas=TOOLS)
    sampled = tok.encode("mul(11, 52)", add_special_tokens=False) + [tok.convert_tokens_to_ids("<eot>")]
    session = service.open("s", SamplingParams(), seed=0)
    reply = {"role": "assistant", "content": "", "tool_calls": [{"name": "mul", "arguments": {"a": 11, "b": 52}}]}
    session.calls.append(SessionCall(0, prompt, Rollout(prompt_ids=prompt, completion_ids=sampled, logprobs=[0.0] * len(sampled),
                                                        versions=[0] * len(sampled)), [user], TOOLS, reply))
    echoed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "mul", "arguments": {"a": 11, "b": 52}}}]}
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "mul", "content": "572"}
    got = service._extended_prompt(session, [user, echoed, tool], TOOLS)
    bridge = service._bridge(TOOLS)[0]
    assert got == [*prompt, *sampled, *bridge.environment_ids([tool], assistant=echoed)]
    fresh = bridge.prompt_ids([user, echoed, tool])
    assert fresh[:len(prompt) + len(sampled)] != got[:len(prompt) + len(sampled)]
    # An edited history, or other tools, is rendered afresh (None here: the caller renders it).
    assert service._extended_prompt(session, [{**user, "content": "11*52"}, echoed, tool], TOOLS) is None
    assert service._extended_prompt(session, [user, echoed, tool], TOOLS[:1]) is None
    assert service._extended_prompt(session, [user, {**echoed, "content": "hm"}, tool], TOOLS) is None


def sys_path_agent() -> None:
    import sys
    if "examples/agents" not in sys.path:
        sys.path.insert(0, "examples/agents")

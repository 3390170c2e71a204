"""The chat template of a real instruct model, everywhere a prompt becomes ids: one encoder for
training, held-out evaluation, the synchronous loop, preflight and `tokenflow eval`; generation
that stops at ``<|im_end|>``; the chat bridge's prefix rule on SmolLM2's ChatML template; and a
multi-turn tool episode whose ids and masks are the template's."""

from __future__ import annotations

import numpy as np
import pytest

from tests.real_model.real_testlib import chat_ids
from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig
from tokenflow.engine import SamplingParams
from tokenflow.envs import ChatBridge
from tokenflow.envs.calculator import CalculatorEnv
from tokenflow.errors import InputError
from tokenflow.tasks.prompts import chat_prompt_ids, encode_prompt, prompt_encoder
from tokenflow.runtime.drivers.episodes import EpisodeSpec, run_episodes

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

SYSTEM = "Answer in a few words."
DATA = ["--task.name", "dataset", "--task.train_path", "tests/real_model/questions.jsonl",
        "--task.eval_path", "tests/real_model/eval.jsonl", "--task.reward", "tests/real_model/rewards.py:answer_reward"]


def _cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, ["--model.path", "smollm2-135m-instruct", *DATA, *overrides])


def test_one_encoder_renders_the_template_with_the_system_prompt(tokenizer):
    text = "What is 17 + 25?"
    encode = prompt_encoder(tokenizer, _cfg("--task.chat_template", "true", "--task.system_prompt", SYSTEM).task)
    ids = encode(text)
    assert ids == chat_ids(tokenizer, text, SYSTEM)
    rendered = tokenizer.decode(ids)
    assert rendered == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    # without a system prompt, the template's own system message
    assert "named SmolLM" in tokenizer.decode(prompt_encoder(tokenizer, _cfg("--task.chat_template", "true").task)(text))
    # chat_template off: the plain encoding, unchanged
    assert prompt_encoder(tokenizer, _cfg().task)(text) == encode_prompt(tokenizer, text)


def test_a_batch_encoding_from_the_template_becomes_ids(tokenizer):
    """transformers 5's apply_chat_template(tokenize=True) returns a BatchEncoding unless told
    not to (the orchestrator listed its keys: int('input_ids') in the engine worker)."""
    class ReturnsBatchEncoding:
        def apply_chat_template(self, messages, **kw):
            kw.pop("return_dict", None)
            return tokenizer.apply_chat_template(messages, return_dict=True, **kw)

    assert chat_prompt_ids(ReturnsBatchEncoding(), "hi", SYSTEM) == chat_ids(tokenizer, "hi", SYSTEM)


def test_the_sync_loop_encodes_as_training_does(engine, tokenizer):
    from tokenflow.runtime.orchestrator.sync_loop import _generate_and_score
    from tokenflow.tasks import build_task

    cfg = _cfg("--task.chat_template", "true", "--task.system_prompt", SYSTEM)
    task = build_task(cfg.task)
    prompts = [task.train_prompt(0)]
    base = SamplingParams(temperature=0.0, max_tokens=4, n=1)
    (group,) = _generate_and_score(engine, tokenizer, task, [], cfg, base, prompts, first_gid=0)
    assert group[0].prompt_ids.tolist() == chat_ids(tokenizer, prompts[0].text, SYSTEM)


def test_preflight_refuses_a_chat_template_the_model_lacks(tokenizer):
    from tokenflow.runtime.run.preflight import check_chat_prompt
    from tokenflow.runtime.run.preflight import load_tokenizer
    from tokenflow.model_store import resolve_model_path
    from tokenflow.tasks import build_task

    cfg = _cfg("--task.chat_template", "true")
    task = build_task(cfg.task)
    check_chat_prompt(task, tokenizer, cfg.task)  # SmolLM2 has one
    plain = load_tokenizer(resolve_model_path("default"))  # the char-level model has none
    with pytest.raises(InputError, match="no chat template"):
        check_chat_prompt(task, plain, cfg.task)


def test_generation_stops_at_im_end(engine, tokenizer):
    (r,), = engine.generate([chat_ids(tokenizer, "What is 17 + 25?")], SamplingParams(temperature=0.0, max_tokens=48))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in engine.eos_token_ids
    assert r.finish_reason == "stop" and int(r.completion_ids[-1]) == im_end and r.num_tokens < 48
    assert r.text == "17 + 25 = 32."


def test_the_chatml_template_preserves_prefixes(tokenizer):
    for tools in (None, CalculatorEnv.tools):
        bridge = ChatBridge(tokenizer, tools=tools)
        assert bridge.turn_end_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
        check = bridge.prefix_check()
        assert check.ok, check.reason
        assert bridge.preserves_prefixes()
        # a tool result after the turn end: "\n" (what the template writes after <|im_end|>), the
        # tool message, then the next generation prompt
        env = bridge.environment_ids([{"role": "tool", "tool_call_id": "call00000", "name": "mul", "content": "3901"}])
        assert tokenizer.decode(env) == "\n<|im_start|>tool\n3901<|im_end|>\n<|im_start|>assistant\n"


def test_a_tool_episode_is_the_templates_ids_with_the_right_masks(engine, tokenizer):
    spec = "tests.real_model.real_testlib:CalculatorFirstTurnCalls"
    examples = [CalculatorEnv.train_example(i, 0) for i in range(2)]
    specs = [EpisodeSpec(spec, ex, max_total_tokens=240) for ex in examples]
    params = SamplingParams(temperature=0.0, max_tokens=64, n=1)
    groups = run_episodes(engine, specs, params)
    bridge = ChatBridge(tokenizer, tools=CalculatorEnv.tools)
    for (r,), ex in zip(groups, examples):
        assert not r.failed, r.info
        record = r.info["episode"]["episode"]
        assert r.info["episode"]["turns"] >= 2
        messages = record.messages
        assert r.prompt_ids.tolist() == bridge.prompt_ids(messages[:1])
        tool = next(m for m in messages if m["role"] == "tool")
        assert tool["content"] == str(ex["a"] * ex["b"])
        # runs of the loss mask: model turn (ends with <|im_end|> or the token limit), the
        # environment's ids (the template's rendering of the tool result), the next model turn
        mask = r.loss_mask
        cuts = [0] + [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]] + [len(mask)]
        runs = [(a, b, int(mask[a])) for a, b in zip(cuts, cuts[1:])]
        assert [m for _, _, m in runs][:3] == [1, 0, 1]
        a, b, _ = runs[0]
        first_turn = r.completion_ids[a:b]
        assert int(first_turn[-1]) in bridge.turn_end_ids or b - a == 64
        a, b, _ = runs[1]
        turn = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        assert r.completion_ids[a:b].tolist() == bridge.environment_ids([tool], assistant=messages[turn])
        assert tokenizer.decode(r.completion_ids[a:b]).startswith("\n<|im_start|>tool\n")
        assert np.all(r.logprobs[mask == 0] == 0) and np.all(r.logprobs[mask == 1] < 0.0 + 1e-6)
        assert r.turns[:runs[1][1]].max() == 0 and (r.turns[runs[2][0]:runs[2][1]] == 1).all()
        # the model's second turn reads the tool result: it ends the episode with a turn end
        a, b, _ = runs[2]
        assert int(r.completion_ids[b - 1]) in bridge.turn_end_ids or b - a == 64
        assert tokenizer.decode(r.completion_ids[a:b], skip_special_tokens=True) == messages[3]["content"]

"""`tokenflow serve` on smollm2-135m-instruct with the official `openai` client: chat (through
the model's ChatML template) and completions, greedy, token for token transformers' greedy
generate()."""

from __future__ import annotations

import pytest
import torch

from tests.real_model.real_testlib import chat_ids
from tests.serve.serve_testlib import extra, served, sync_client

pytestmark = [pytest.mark.real_model, pytest.mark.slow, pytest.mark.timeout(300)]

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(smollm2):
    with served(NAME) as s:
        yield s


def _hf_greedy(hf, prompt_ids: list[int], max_new_tokens: int, eos: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():  # the mask given: the pad token <|im_end|> is in chat prompts
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt_ids):].tolist()


def test_chat_is_transformers_greedy_through_the_template(server, hf_smollm2, tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = sync_client(server).chat.completions.create(model=NAME, messages=messages, temperature=0.0, max_tokens=24,
                                                    extra_body={"return_token_ids": True})
    prompt = extra(r, "prompt_token_ids")
    assert prompt == chat_ids(tokenizer, messages[0]["content"])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = extra(r.choices[0], "token_ids")
    assert ids == _hf_greedy(hf_smollm2, prompt, 24, im_end)
    assert ids[-1] == im_end and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "The capital of France is Paris."


def test_completions_are_transformers_greedy(server, hf_smollm2, tokenizer):
    text = "The capital of France is"
    r = sync_client(server).completions.create(model=NAME, prompt=text, temperature=0.0, max_tokens=12,
                                               extra_body={"return_token_ids": True})
    prompt = extra(r.choices[0], "prompt_token_ids")
    assert prompt == tokenizer(text)["input_ids"]
    ids = extra(r.choices[0], "token_ids")
    assert len(ids) == 12 or ids[-1] == tokenizer.eos_token_id
    assert ids == _hf_greedy(hf_smollm2, prompt, 12, tokenizer.eos_token_id)
    assert r.choices[0].text == tokenizer.decode(ids, skip_special_tokens=True)

"""lm-evaluation-harness against `tokenflow serve`: its ``local-completions`` model scores a
multiple-choice task (a local JSONL file, a task YAML of its own) through ``/v1/completions``
with ``echo`` and ``logprobs``, its tokenizer fetched from the server (``/tokenizer_info``,
``/tokenize``, ``/detokenize``: no ``tokenizer=`` argument, no local copy). Each choice's
log-likelihood lm-eval computes is compared with transformers' own on the same tokens, within
the derived float32 bound of `tests.real_model.real_testlib.float32_bounds` per token."""

from __future__ import annotations

import json

import pytest
import torch

from tests.real_model.real_testlib import float32_bounds
from tests.serve.serve_testlib import served

lm_eval = pytest.importorskip("lm_eval")

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ARITHMETIC = [  # the shipped tiny model's language: sums
    {"question": "12+34=", "choices": ["46", "45", "64"], "answer": 0},
    {"question": "7+8=", "choices": ["14", "15", "16"], "answer": 1},
    {"question": "40+21=", "choices": ["62", "60", "61"], "answer": 2},
    {"question": "5+5=", "choices": ["10", "55", "1"], "answer": 0},
]
QUESTIONS = [
    {"question": "The capital of France is", "choices": ["Paris", "Berlin", "a banana"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["five", "four", "twenty-two"], "answer": 1},
    {"question": "The sun rises in the", "choices": ["west", "north", "east"], "answer": 2},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Kelvin", "per hour"], "answer": 0},
]


def _task(folder, name: str, docs: list[dict], delimiter: str) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{{{question}}}}\"\n"
        f"doc_to_choice: \"{{{{choices}}}}\"\ndoc_to_target: \"{{{{answer}}}}\"\n"
        f"target_delimiter: \"{delimiter}\"\nmetric_list:\n  - metric: acc\n")


@torch.no_grad()
def _hf_loglikelihood(hf, tokenizer, context: str, continuation: str) -> tuple[float, float]:
    """transformers' log-likelihood of ``continuation`` after ``context``, tokenized as lm-eval
    does (the whole text, split after the context's tokens), and its bound: the per-token max
    bound times the continuation's tokens."""
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    cont = whole[len(ctx):]
    logits = hf(torch.tensor([whole]), use_cache=False).logits[0, len(ctx) - 1:len(whole) - 1].float()
    lp = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(cont)[:, None])[:, 0]
    return float(lp.sum()), float_bound(hf, logits) * len(cont)


def float_bound(hf, logits) -> float:
    return float32_bounds(hf, logits)[0]


def _evaluate(model: str, docs: list[dict], delimiter: str, tmp_path, backend: str = "remote") -> dict:
    """lm-eval's ``local-completions`` on ``model`` served; ``backend`` "auto" lets it find the
    remote tokenizer itself (it probes ``/tokenize`` with the text "test", which the tiny model's
    digits-only vocabulary cannot encode: there it is named)."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenflow.model_store import resolve_model_path

    _task(tmp_path, "tf_mc", docs, delimiter)
    with served(model, reference=False) as s:
        lm = LocalCompletionsAPI(base_url=f"{s.url}/v1/completions", model=model,
                                 max_length=s.engine.max_model_len, max_retries=1, tokenizer_backend=backend)
        assert lm.tokenizer_backend == "remote"  # the server's tokenizer, no local copy
        out = lm_eval.simple_evaluate(model=lm, tasks=["tf_mc"], task_manager=TaskManager(include_path=str(tmp_path)),
                                      log_samples=True, bootstrap_iters=0)
    path = resolve_model_path(model)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    worst, samples = 0.0, out["samples"]["tf_mc"]
    assert len(samples) == len(docs)
    for sample in samples:
        doc = sample["doc"]
        got = [float(r[0]) for r in sample["filtered_resps"]]
        want = [_hf_loglikelihood(hf, tokenizer, doc["question"], delimiter + c) for c in doc["choices"]]
        for g, (w, bound) in zip(got, want):
            assert abs(g - w) <= bound, (doc, g, w, bound)
            worst = max(worst, abs(g - w))
    acc = out["results"]["tf_mc"]["acc,none"]
    print(f"{model}: lm-eval acc {acc:.2f}; {sum(len(d['choices']) for d in docs)} choice log-likelihoods, "
          f"max |lm-eval - transformers| {worst:.2e}")
    return out


def test_lm_eval_scores_a_multiple_choice_task_on_the_tiny_model(tmp_path):
    _evaluate("default", ARITHMETIC, "", tmp_path)


@pytest.mark.real_model
def test_lm_eval_scores_a_multiple_choice_task_on_smollm2(tmp_path):
    out = _evaluate("smollm2-135m-instruct", QUESTIONS, " ", tmp_path, backend="auto")
    assert out["results"]["tf_mc"]["acc,none"] >= 0.5  # a real model gets most of these

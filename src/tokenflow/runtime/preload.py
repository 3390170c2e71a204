"""What the local backend's fork server imports before it forks any worker
(``runtime.start_method = "forkserver"``, see ``tokenflow.runtime.worker_start``).

Importing this module is the preload: torch, transformers' tokenizer machinery and the engine,
trainer and weight-sync code, so that a forked engine or trainer starts with all of it in
memory. Nothing here runs a model, starts a thread or touches a GPU: the server must stay safe
to fork. A module that fails to import is skipped (the worker imports it, and reports the
error, itself).
"""

from __future__ import annotations

import importlib

MODULES = (
    "torch",
    "numpy",
    "safetensors.torch",
    "huggingface_hub.utils",
    "transformers",
    "transformers.utils.logging",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_tokenizers",
    "transformers.models.auto.configuration_auto",
    "transformers.activations",  # what a model's config imports first (torch.distributed.tensor, accelerate)
    "transformers.models.llama.configuration_llama",
    "transformers.models.qwen2.configuration_qwen2",
    "transformers.models.qwen3.configuration_qwen3",
    "tokenflow.runtime.engine_worker",
    "tokenflow.runtime.trainer_worker",
    "tokenflow.engine.factory",
    "tokenflow.engine.llm_engine",
    "tokenflow.engine.models.llama",
    "tokenflow.engine.models.qwen2",
    "tokenflow.engine.models.qwen3",
    "tokenflow.engine.models.mistral",
    "tokenflow.trainer.trainer",
    "tokenflow.sync.base",
    "tokenflow.sync.shared_memory",
)

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S112 - an optional extra missing, say; the worker will tell
        continue

"""What the local backend's fork server imports before it forks any worker
(``runtime.start_method = "forkserver"``, see ``tokenflow.runtime.backends.local.start``).

Importing this module is the preload: torch, transformers' fast tokenizer and the engine,
trainer and weight-sync code, so that a forked engine or trainer starts with all of it in
memory. Not transformers' config classes (``transformers.activations`` and what it imports: 1.4 s
on an AVX2 machine in December 2026, torch's compiler and distributed tensors among them): the
engine reads a complete Llama config without them (`tokenflow.engine.loading.plain_config`) and
starts generating while the trainer, forked at the same moment, imports them itself.
Nothing here runs a model, starts a thread or touches a GPU: the server must stay safe to fork.
A module that fails to import is skipped (the worker imports it, and reports the error, itself).
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
    "transformers.tokenization_utils_tokenizers",
    "tokenflow.runtime.workers.engine_worker",
    "tokenflow.runtime.workers.trainer_worker",
    "tokenflow.engine.factory",
    "tokenflow.engine.builtin.llm_engine",
    "tokenflow.engine.builtin.models.llama",
    "tokenflow.engine.builtin.models.qwen2",
    "tokenflow.engine.builtin.models.qwen3",
    "tokenflow.engine.builtin.models.mistral",
    "tokenflow.trainer.trainer",
    "tokenflow.sync.factory",
    "tokenflow.sync.shared_memory",
)

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S112 - an optional extra missing, say; the worker will tell
        continue

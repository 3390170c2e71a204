"""Reading a Hugging Face model folder, and deriving the engine's context length."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenflow.engine.loading.weights import load_checkpoint

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass
class ModelFolder:
    hf_config: object
    state_dict: dict[str, torch.Tensor]
    tokenizer: object | None
    eos_token_ids: list[int]
    """EOS ids of ``generation_config.json`` (chat models often list several)."""


def read_model_folder(path: str | Path, tokenizer=None) -> ModelFolder:
    """Config, weights, tokenizer (if the folder has one and none was given) and EOS ids."""
    from tokenflow.engine.loading.plain_config import read_plain_llama_config
    from tokenflow.engine.loading.tokenizer_files import read_tokenizer

    folder = Path(path)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json)")
    hf_config = read_plain_llama_config(folder)
    if hf_config is None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(folder)
    if tokenizer is None and any((folder / f).exists() for f in _TOKENIZER_FILES):
        tokenizer = read_tokenizer(folder)
    eos: list[int] = []
    if (folder / "generation_config.json").exists():
        eos = as_id_list(json.loads((folder / "generation_config.json").read_text()).get("eos_token_id"))
    return ModelFolder(hf_config, load_checkpoint(folder), tokenizer, eos)


def as_hf_config(config):
    """A transformers config from a config object or its dict (``model_type`` required)."""
    if isinstance(config, dict):
        from transformers import AutoConfig

        fields = dict(config)
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    return config


def as_id_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def context_length(model_cls, hf_config, requested: int | None) -> int:
    """``max_model_len``: as requested, else the model's max positions. A sliding window does not
    cap it: windowed layers mask the keys behind the window."""
    limit = getattr(hf_config, "max_position_embeddings", None) or 4096
    if requested is not None and requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's max_position_embeddings {limit}")
    return requested or limit

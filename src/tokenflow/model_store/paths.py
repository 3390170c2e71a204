"""Model names to folders."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tokenflow.errors import InputError
from tokenflow.model_store.catalog import BUILT_MODELS

SHIPPED_MODELS = {
    "default": ("default_model", "make_default_model"),
    "default-moe": ("default_moe_model", "make_moe_model"),
    "default-tool": ("tool_model", "make_tool_model"),
}
"""``model.path`` names of the tiny models the package ships: (assets folder, the script that
rebuilds it)."""


def shipped_model_path(name: str) -> Path:
    """The assets folder of a shipped model (whether or not its weights are there)."""
    return Path(str(resources.files("tokenflow") / "assets" / SHIPPED_MODELS[name][0]))


MODEL_NAMES = (*SHIPPED_MODELS, *BUILT_MODELS)
"""Every name ``model.path`` takes instead of a folder."""


def resolve_model_path(path: str) -> str:
    """The folder ``path`` names: a shipped model's assets folder, a built model's folder in the
    cache (built on first use: `tokenflow.model_store.build`), or ``path`` itself when it is a
    folder. Its contents are checked later (``tokenflow.runtime.run.preflight.check_model_folder``)."""
    if path in BUILT_MODELS:
        from tokenflow.model_store.build import ensure_built

        return str(ensure_built(path))
    if path in SHIPPED_MODELS:
        folder, script = SHIPPED_MODELS[path]
        p = shipped_model_path(path)
        if not (p / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"the shipped model {path!r} is missing from {p}; rebuild it with "
                f"`python -m tokenflow.shipped_models.{script} --out src/tokenflow/assets/{folder}`")
        return str(p)
    if not Path(path).is_dir():
        raise InputError(f"model.path {path!r} is not a folder; point model.path at a Hugging Face model "
                         "folder (config.json, *.safetensors, tokenizer files)")
    return path

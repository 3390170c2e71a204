"""Where model folders come from: the tiny models the package ships, and user folders.

``model.path`` (and every other place that takes a model: teachers, PRMs, ``tokenflow eval``,
``serve`` and ``bench``) goes through `resolve_model_path`, which turns a shipped model's name
into its folder and checks that anything else is a folder.

Layer 2 (models and weights): imports only the standard library and `tokenflow.errors`.
"""

from tokenflow.model_store.paths import SHIPPED_MODELS, resolve_model_path, shipped_model_path

__all__ = ["SHIPPED_MODELS", "resolve_model_path", "shipped_model_path"]

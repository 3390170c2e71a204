"""The rollout engine seam: what every backend implements, and the backends behind it.

The seam (this folder's own modules): `base` (the `RolloutEngine` protocol, `TokenDelta`),
`backends` (`ENGINES`, the table of backends by ``engine.backend``, and each one's
`EngineCapabilities`), `factory` (`make_engine`), `sampling_params`, `request` (the request
checks and seeds every backend applies), `routing` (the layout of recorded MoE routing),
`errors`, `stats`, and `loading/` (reading a Hugging Face model folder: weights, checksum,
tokenizer, config; shared by the backends, the trainer worker and the preflight). Its config
section (`[engine]`, EngineConfig) is `tokenflow.config.engine`.

The backends: `builtin/` (tokenflow's pure-PyTorch engine, the CPU default and the reference:
continuous batching with per-token behaviour log-probs, policy versions and sampling supports,
weight updates between decode steps) and `vllm/`. A backend imports the seam, never another
backend; docs/engine.md, "Adding a backend".

May import: layer 1 (records and wiring) and `tokenflow.model_store`. `backends` is itself a
record of layer 1 (the standard library and `tokenflow.registry` only), so the config reads it.
"""

from tokenflow._lazy import lazy_getattr
from tokenflow.config.engine import EngineConfig
from tokenflow.engine.errors import InvalidRequest, UnsupportedModel, WeightUpdateError
from tokenflow.engine.sampling_params import SamplingParams

# The engine itself imports torch; it loads on first use so that reading a config stays light.
_EXPORTS = {
    "ENGINES": "tokenflow.engine.backends",
    "Engine": "tokenflow.engine.builtin.llm_engine",
    "EngineCapabilities": "tokenflow.engine.backends",
    "RolloutEngine": "tokenflow.engine.base",
    "make_engine": "tokenflow.engine.factory",
    "register_backend": "tokenflow.engine.backends",
    "weights_checksum": "tokenflow.engine.loading.weights",
}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = ["ENGINES", "Engine", "EngineCapabilities", "EngineConfig", "InvalidRequest", "RolloutEngine",
           "SamplingParams", "UnsupportedModel", "WeightUpdateError", "make_engine", "register_backend",
           "weights_checksum"]

"""The built-in rollout engine: continuous batching with per-token behaviour log-probs, policy
versions and sampling supports, and weight updates between decode steps.

Layout (one concept per file): `config` (EngineConfig), `sampling_params`, `sequence`,
`request` (validation), `scheduler`, `kv_cache`, `models/` (Llama, Qwen2, Qwen3, Mistral),
`model_runner`, `sampler`, `weights`, `weight_update`, `llm_engine` (Engine), `base`
(the `RolloutEngine` protocol every engine implements).
"""

from tokenflow._lazy import lazy_getattr
from tokenflow.engine.config import EngineConfig
from tokenflow.engine.errors import InvalidRequest, UnsupportedModel, WeightUpdateError
from tokenflow.engine.sampling_params import SamplingParams

# The engine itself imports torch; it loads on first use so that reading a config stays light.
_EXPORTS = {
    "Engine": "tokenflow.engine.llm_engine",
    "RolloutEngine": "tokenflow.engine.base",
    "weights_checksum": "tokenflow.engine.loading.weights",
}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = ["Engine", "EngineConfig", "InvalidRequest", "RolloutEngine", "SamplingParams", "UnsupportedModel",
           "WeightUpdateError", "weights_checksum"]

"""The built-in rollout engine: continuous batching with per-token behaviour log-probs, policy
versions and sampling supports, and weight updates between decode steps.

Layout (one concept per file): `config` (EngineConfig), `sampling_params`, `sequence`,
`request` (validation), `scheduler`, `kv_cache`, `models/` (Llama, Qwen2, Qwen3, Mistral),
`model_runner`, `sampler`, `weights`, `weight_update`, `llm_engine` (Engine), `base`
(the `RolloutEngine` protocol every engine implements).
"""

from tokenflow.engine.base import RolloutEngine
from tokenflow.engine.config import EngineConfig
from tokenflow.engine.errors import InvalidRequest, WeightUpdateError
from tokenflow.engine.llm_engine import Engine
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.weights import weights_checksum

__all__ = [
    "Engine",
    "EngineConfig",
    "InvalidRequest",
    "RolloutEngine",
    "SamplingParams",
    "WeightUpdateError",
    "weights_checksum",
]

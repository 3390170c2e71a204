"""The built-in engine (``engine.backend = "builtin"``): tokenflow's pure-PyTorch rollout
engine, the CPU default and the reference the conformance suite and the trainer are checked
against. Continuous batching with per-token behaviour log-probs, policy versions and sampling
supports; weight updates between decode steps; prefix sharing for a group's samples; parked KV
caches for multi-turn continuations.

Layout (one concept per file): `llm_engine` (`Engine`), `sequence` (a sample's state, and
`make_group`, which builds a request's sequences from the seam's `plan_request`), `scheduler`,
`model_runner`, `sampler` (behaviour log-probs, sampling supports), `weight_update` (the update
modes), `cache/` (KV slots, parked KV), `models/` (Llama, Qwen2/3, Mistral and their MoE
families) and `kernels/` (decode attention and RMSNorm in C++, compiled on first use). Its capabilities are `tokenflow.engine.backends.BUILTIN`.

May import: layer 1 and the engine seam (``tokenflow.engine``'s own modules and ``loading/``);
never another backend (``tokenflow.engine.vllm``).
"""

from tokenflow._lazy import lazy_getattr

_EXPORTS = {"Engine": "tokenflow.engine.builtin.llm_engine"}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)
__all__ = ["Engine"]

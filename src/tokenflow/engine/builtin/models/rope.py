"""Rotary position embeddings: inverse frequencies from the config, and cos/sin tables.

The numerics follow transformers (rotate-half convention; ``freqs = position * inv_freq`` in
float32, ``cos``/``sin`` scaled by the rope type's attention factor, then cast to the model
dtype), so logits match `AutoModelForCausalLM`. The tables are computed once for every position
up to ``max_len`` and indexed per step.
"""

from __future__ import annotations

import torch

from tokenflow.engine.errors import UnsupportedModel

# Rope types whose frequencies change with the sequence length at run time.
_DYNAMIC_TYPES = ("dynamic", "longrope")


def rope_parameters(config) -> dict:
    """The config's RoPE settings as one dict with ``rope_type`` and ``rope_theta``.

    transformers 5 configs carry ``rope_parameters``; v4-style configs carry ``rope_theta`` and
    ``rope_scaling`` (whose type key was ``type``)."""
    params = getattr(config, "rope_parameters", None)
    if params:
        params = dict(params)
    else:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def inverse_frequencies(config, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2], attention scaling) for the config's rope type."""
    params = rope_parameters(config)
    rope_type = params["rope_type"]
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModel("partial_rotary_factor != 1 is not supported by the built-in engine")
    if rope_type == "default":
        theta = params["rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    if rope_type in _DYNAMIC_TYPES:
        raise UnsupportedModel(
            f"rope_type {rope_type!r} changes with the sequence length; the built-in engine "
            "supports static rope types (default, linear, llama3, yarn)"
        )
    # Scaled types: transformers' own initialisers, so the frequencies are exactly theirs.
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise UnsupportedModel(f"unknown rope_type {rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


def rope_tables(config, head_dim: int, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed-sin tables ``[max_len, head_dim]`` in ``dtype``.

    The sin table carries rotate-half's sign (its first half negated), so that
    ``rotate_half(x) * sin == x.roll(head_dim // 2, -1) * signed_sin`` exactly (a sign flip is
    exact in floating point) with one kernel fewer."""
    inv_freq, scaling = inverse_frequencies(config, head_dim)
    positions = torch.arange(max_len, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scaling, emb.sin() * scaling
    half = head_dim // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.to(dtype), signed_sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x`` [N, T, heads, D]; ``cos``/``signed_sin`` [N, T, 1, D]. Same values as
    transformers' ``x * cos + rotate_half(x) * sin``."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

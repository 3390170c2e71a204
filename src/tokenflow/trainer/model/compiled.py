"""Compiled decoder layers (``trainer.compile_layers``): each decoder layer of the policy runs
through ``torch.compile``, which fuses the elementwise work around the matrix products (autocast's
casts, RMSNorm, rotary, SiLU, the attention's softmax) into generated kernels, forward and
backward.

One compiled graph serves every layer (the layers share their code; their parameters are inputs)
and every micro-batch shape (``dynamic=True``: sizes are symbols, except that a size of 1 is
specialised, so one-row micro-batches get a graph of their own, as do rows for which transformers
builds no attention mask). Compiling costs tens of seconds on a CPU, so :func:`warm_up` pays it
when the trainer starts, while the engines generate the first batch, on dummy rows of every kind;
the RNG state and the gradients are left as they were.

Where compiling cannot work (no C++ compiler for a CPU trainer) or fails, the layers go back to
their eager forward and the trainer says so: the switch never stops a run.
"""

from __future__ import annotations

import logging
import shutil
import time
import types

import numpy as np
import torch

from tokenflow.trainer.model.loading import decoder_layers
from tokenflow.trainer.shared_prompts import attn_implementation, block_mask, model_mask

log = logging.getLogger(__name__)


def cannot_compile(device: torch.device) -> str | None:
    """Why this process cannot compile the layers, or None."""
    if device.type == "cpu" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return "no C++ compiler on PATH (torch.compile's CPU kernels are C++)"
    return None


def compile_layers(model, device: torch.device, backend: str = "inductor") -> int:
    """Compile ``model``'s decoder layers in place with ``torch.compile``'s ``backend``; returns
    how many (0, with a warning, where they cannot be). Each layer's forward becomes one compiled
    function of its class, bound to it: the layers share the compiled graphs (their parameters
    are the graphs' inputs)."""
    layers = decoder_layers(model)
    why = cannot_compile(device) or (None if layers else "the model has no decoder layer list")
    if why:
        log.warning("trainer.compile_layers: %s; the layers run eagerly", why)
        return 0
    import torch._inductor.config as inductor

    # Compile in this process: a pool of compile workers would each hold an imported torch for
    # the rest of the run (hundreds of MB apiece, on a laptop whose memory the run budgets).
    inductor.compile_threads = 1
    by_class: dict[type, object] = {}
    for layer in layers:
        cls = type(layer)
        if cls not in by_class:
            by_class[cls] = torch.compile(cls.forward, backend=backend, dynamic=True)
        layer.forward = types.MethodType(by_class[cls], layer)
    return len(layers)


def is_compiled(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` runs the compiled forward :func:`compile_layers` gave it."""
    return "forward" in vars(layer)


def uncompile_layers(model) -> None:
    """Back to each layer's class forward."""
    for layer in decoder_layers(model):
        vars(layer).pop("forward", None)


def warm_up(runner, vocab: int, *, scoring: bool = False, tokens: int = 24, own_masks: bool = False) -> float | None:
    """Compile now: a forward and backward through ``runner``'s training path on dummy rows of
    every kind a micro-batch can have (two rows or one; each with one sequence per row or with a
    restart of the position ids, as packing and padding make them: transformers then builds an
    attention mask where it otherwise may pass none; with ``own_masks``, the trainer's own mask
    every time, as when it shares prompts), and with ``scoring`` the same rows in a no-grad
    forward in eval mode (the trainer's no-grad passes: dynamo compiles those apart). Kinds that
    share a graph cost one forward (and backward). Gradients are dropped and the RNG state
    restored. Returns the seconds it took, or None where it failed: the layers are then eager
    again and the error is logged."""
    t0 = time.perf_counter()
    device = runner.device
    ids = torch.arange(tokens, device=device) % vocab
    whole = torch.arange(tokens, device=device)
    restarted = torch.cat([whole[: tokens // 2], whole[: tokens - tokens // 2]])
    kinds = [(rows, positions) for rows in (2, 1) for positions in ((whole,) if own_masks else (whole, restarted))]

    def forward(rows: int, positions: torch.Tensor) -> torch.Tensor:
        mask = None
        if own_masks:  # built as the micro-batches build theirs (a causal one: any layout is the same graph)
            segment = np.zeros((rows, tokens), dtype=np.int64)
            mask = model_mask(block_mask(segment, segment - 1).to(device), attn_implementation(runner.model))
        with runner.autocast():
            return runner.model.get_decoder()(input_ids=ids.expand(rows, tokens),
                                              position_ids=positions.expand(rows, tokens),
                                              attention_mask=mask, use_cache=False).last_hidden_state

    was_training = runner.model.training
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for rows, positions in kinds:
                forward(rows, positions).float().square().mean().backward()
                if scoring:
                    runner.model.eval()
                    with torch.no_grad():
                        forward(rows, positions)
                    runner.model.train(was_training)
    except Exception as exc:  # a compiler error of any kind: the eager layers still train
        log.warning("trainer.compile_layers: compiling failed (%s: %s); the layers run eagerly",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        uncompile_layers(runner.model)
        return None
    finally:
        runner.model.train(was_training)
        runner.model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0

"""Lean activations (``trainer.lean_activations``): the RMSNorms and gated MLPs of Llama-family
models as autograd functions that keep less for the backward pass and recompute the cheap rest.

What autograd keeps, per token and layer, for transformers' modules under bfloat16 autocast:

    RMSNorm  x (float32) and x·rstd (float32)                     → here x and rstd only
    MLP      x cast to bfloat16 twice (gate, up), gate, silu(gate),
             up, silu(gate)·up, and bfloat16 copies of the three
             weights (autocast's casts)                            → here x once, gate and up

The backward pass recomputes x·rstd, silu(gate) and silu(gate)·up (elementwise, a few percent of
a step) and casts the float32 weights again (cheap beside the products they feed). The forward
runs exactly the ops transformers' modules run, in the same dtypes, so its outputs are
bit-identical; the gradients differ from autograd's only in the order of float32 roundings
(tests/trainer/test_lean_layers.py bounds it).

Only instances whose class is one of the families below and whose parts are plain ``nn.Linear``
layers with a SiLU are changed (the instance's forward, so parameter names and checkpoints stay);
anything else (LoRA's wrapped projections, other activations, Gemma's 1 + weight norm) keeps its
own forward.
"""

from __future__ import annotations

import logging
import types

import torch
import torch.nn.functional as F

# NORMS: x·rsqrt(mean(x²) + eps), times the weight, computed in float32 and cast back to the
# input's dtype; MLPS: down(silu(gate(x)) · up(x)), bias-free
from tokenflow.trainer.model.lean_families import MLPS, NORMS

log = logging.getLogger(__name__)


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float):
        xf = x.to(torch.float32)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        h = x.to(torch.float32) * rstd
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad * h.to(x.dtype)).reshape(-1, h.shape[-1]).sum(0).to(weight.dtype)
        dh = (grad * weight).to(torch.float32)
        # d/dx of x·rstd: rstd · (dh − h · mean(dh · h))
        grad_x = rstd * (dh - h * (dh * h).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


class GatedMLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, dtype):
        # Autocast is off in here: the casts it would make are made by hand, once each.
        with torch.autocast(device_type=x.device.type, enabled=False):
            xc = x.to(dtype)
            gate = F.linear(xc, w_gate.to(dtype))
            up = F.linear(xc, w_up.to(dtype))
            out = F.linear(F.silu(gate) * up, w_down.to(dtype))
        ctx.save_for_backward(xc, gate, up, w_gate, w_up, w_down)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xc, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        dtype = xc.dtype
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            grad_out = grad_out.to(dtype)
            act = F.silu(gate)
            prod = act * up
            flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
            grad_prod = grad_out @ w_down.to(dtype)
            grad_up = grad_prod * act
            grad_gate = torch.ops.aten.silu_backward(grad_prod * up, gate)
            # Each branch's input gradient is cast to float32 before they are summed, as autograd
            # sums the gradients of autocast's two casts of x.
            grad_x = (grad_gate @ w_gate.to(dtype)).to(ctx.x_dtype) + (grad_up @ w_up.to(dtype)).to(ctx.x_dtype)
            grads = [None, None, None]
            for i, (g, inp, w) in enumerate(((grad_gate, xc, w_gate), (grad_up, xc, w_up), (grad_out, prod, w_down))):
                if ctx.needs_input_grad[1 + i]:
                    grads[i] = (flat(g).t() @ flat(inp)).to(w.dtype)
        return grad_x, *grads, None


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return RMSNormFn.apply(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not _plain(self):  # wrapped since (LoRA): the module's own forward
        return type(self).forward(self, x)
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    return GatedMLPFn.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, dtype)


def _plain(mlp) -> bool:
    return all(type(getattr(mlp, p, None)) is torch.nn.Linear and getattr(mlp, p).bias is None
               for p in ("gate_proj", "up_proj", "down_proj"))


def _silu(mlp) -> bool:
    act = getattr(mlp, "act_fn", None)
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def use_lean_layers(model) -> int:
    """Swap the forward of every recognised RMSNorm and gated MLP instance in ``model``; returns
    how many were swapped."""
    swapped = 0
    for module in model.modules():
        name = type(module).__name__
        if name in NORMS and hasattr(module, "variance_epsilon") and isinstance(module.weight, torch.nn.Parameter):
            module.forward = types.MethodType(_norm_forward, module)
            swapped += 1
        elif name in MLPS and _plain(module) and _silu(module):
            module.forward = types.MethodType(_mlp_forward, module)
            swapped += 1
    log.debug("lean activations: %d norms and MLPs", swapped)
    return swapped

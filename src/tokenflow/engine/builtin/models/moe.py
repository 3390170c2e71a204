"""Mixture-of-experts feed-forward blocks, and the record of which experts each token used.

Parameter names follow transformers ≥ 5, which keeps a layer's experts fused in 3-D tensors::

    model.layers.{i}.mlp.gate.weight              [E, H]       the router
    model.layers.{i}.mlp.experts.gate_up_proj     [E, 2I, H]   gate rows, then up rows
    model.layers.{i}.mlp.experts.down_proj        [E, H, I]

That is what a trainer's ``state_dict()`` (and so a live weight sync) carries. ``save_pretrained``
still writes the per-expert names of older checkpoints (``mlp.experts.{e}.gate_proj.weight``,
Mixtral's ``block_sparse_moe.experts.{e}.w1.weight``); `fuse_expert_weights` maps those onto
the fused names, so both load through the same path.

Routing is softmax over the router logits in float32, then top-k, then (where the config asks)
the k weights renormalised to sum to 1 — as the Hugging Face routers of Qwen2/3-MoE and
Mixtral compute it. While a `RoutingRecorder` is active every block appends its top-k expert
ids, so the engine can hand the trainer the exact routing of each token (Keep Routing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenflow.engine.errors import UnsupportedModel
from tokenflow.engine.routing import is_sparse_layer


@dataclass(frozen=True)
class MoeSpec:
    """What a family's sparse block looks like (read from its config)."""

    num_experts: int
    top_k: int
    expert_size: int
    normalise: bool
    """Renormalise the top-k softmax weights to sum to 1 (``norm_topk_prob``; Mixtral always)."""
    shared_expert_size: int = 0
    """Qwen2-MoE: a dense expert every token goes through, scaled by a sigmoid gate."""


class RoutingRecorder:
    """Collects the top-k expert ids of every sparse layer during one forward pass.

    Blocks append in layer order, so `take` stacks them as [tokens, moe_layers, top_k]."""

    def __init__(self) -> None:
        self.active = False
        self.layers: list[torch.Tensor] = []

    def add(self, indices: torch.Tensor) -> None:
        if self.active:
            self.layers.append(indices)

    def start(self) -> None:
        self.active, self.layers = True, []

    def take(self) -> torch.Tensor | None:
        """[tokens, moe_layers, top_k] of this forward (None if nothing was recorded); stops."""
        layers, self.active, self.layers = self.layers, False, []
        return torch.stack(layers, dim=1) if layers else None


class MoeExperts(nn.Module):
    """E SwiGLU experts in two fused 3-D parameters (transformers' layout)."""

    def __init__(self, hidden: int, spec: MoeSpec) -> None:
        super().__init__()
        self.num_experts = spec.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(spec.num_experts, 2 * spec.expert_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(spec.num_experts, hidden, spec.expert_size))

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [n, H], indices/weights [n, k] -> Σ_j weights[:, j] · expert_{indices[:, j]}(x)."""
        out = torch.zeros_like(x)
        flat = indices.reshape(-1)
        # Group (token, slot) pairs by expert once, then one matmul pair per expert hit.
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        k = indices.shape[1]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            pairs = order[start:start + count]
            start += count
            tokens = pairs // k
            gate, up = F.linear(x[tokens], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert])
            y = y * weights.reshape(-1)[pairs, None]
            out.index_add_(0, tokens, y.to(out.dtype))
        return out


class SharedExpert(nn.Module):
    """Qwen2-MoE's dense expert (unfused gate/up/down, as its checkpoints name them)."""

    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, size, bias=False)
        self.up_proj = nn.Linear(hidden, size, bias=False)
        self.down_proj = nn.Linear(size, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """Router + experts (+ a gated shared expert where the family has one)."""

    def __init__(self, config, spec: MoeSpec, recorder: RoutingRecorder) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"hidden_act {config.hidden_act!r}: only SwiGLU (silu) experts are supported")
        hidden = config.hidden_size
        self.spec = spec
        self.gate = nn.Linear(hidden, spec.num_experts, bias=False)
        self.experts = MoeExperts(hidden, spec)
        if spec.shared_expert_size:
            self.shared_expert = SharedExpert(hidden, spec.shared_expert_size)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)
        self.recorder = recorder

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, H] -> (expert ids [n, k], their weights [n, k] in float32)."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, indices = torch.topk(probs, self.spec.top_k, dim=-1)
        if self.spec.normalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return indices, weights

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        indices, weights = self.route(x)
        self.recorder.add(indices)
        out = self.experts(x, indices, weights.to(x.dtype))
        if self.spec.shared_expert_size:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)


# -- checkpoint names -----------------------------------------------------------------------------

_PER_EXPERT = re.compile(
    r"^(?P<layer>.*\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(?P<e>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_PROJ = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def fuse_expert_weights(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint names -> transformers' fused expert tensors (others unchanged).

    A layer whose experts are incomplete is left as it came, so the weight check names the
    missing and unexpected tensors instead of failing here."""
    per_layer: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in named.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            if ".block_sparse_moe.gate." in name:  # Mixtral's router, under its old name
                name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
            out[name] = tensor
            continue
        per_layer.setdefault(m["layer"], {})[(int(m["e"]), _PROJ[m["proj"]])] = (name, tensor)
    for layer, parts in per_layer.items():
        experts = sorted({e for e, _ in parts})
        complete = experts == list(range(len(experts))) and all(
            (e, p) in parts for e in experts for p in ("gate", "up", "down"))
        if not complete:
            out.update(dict(parts.values()))
            continue
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate")][1], parts[(e, "up")][1]], dim=0) for e in experts])
        out[f"{layer}.mlp.experts.down_proj"] = torch.stack([parts[(e, "down")][1] for e in experts])
    return out


# -- the model side ---------------------------------------------------------------------------------


def sparse_layer_mlp(layer_cls, spec_of):
    """A decoder-layer class like ``layer_cls`` whose sparse layers get a `SparseMoeBlock`
    (``spec_of(config)`` describes it) and whose other layers keep the dense MLP."""

    class SparseDecoderLayer(layer_cls):
        def make_mlp(self, config, flags, index):
            if is_sparse_layer(config, index):
                return SparseMoeBlock(config, spec_of(config), RoutingRecorder())
            return super().make_mlp(config, flags, index)

    SparseDecoderLayer.__name__ = layer_cls.__name__.replace("DecoderLayer", "MoeDecoderLayer")
    return SparseDecoderLayer


class MoeMixin:
    """For a ``LlamaForCausalLM`` subclass with sparse layers: one `RoutingRecorder` shared by
    its blocks, the list of sparse layers, and checkpoint-name fusing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.attach_recorder()

    def attach_recorder(self) -> None:
        self.routing = RoutingRecorder()
        self.moe_layers = [i for i, layer in enumerate(self.model.layers) if isinstance(layer.mlp, SparseMoeBlock)]
        for i in self.moe_layers:
            self.model.layers[i].mlp.recorder = self.routing
        self.top_k = self.model.layers[self.moe_layers[0]].mlp.spec.top_k if self.moe_layers else 0
        self.num_experts = self.model.layers[self.moe_layers[0]].mlp.spec.num_experts if self.moe_layers else 0

    def canonical_weights(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return fuse_expert_weights(named)

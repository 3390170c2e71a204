"""The Llama family (Llama, and via small subclasses Qwen2, Qwen3, Mistral) for inference.

Module and parameter names follow the Hugging Face checkpoints (``model.layers.0.self_attn...``)
except that q/k/v and gate/up are fused into one matmul each (`MergedLinear`), which saves
kernel launches per layer; `hf_views` maps every Hugging Face name onto a view of the fused
parameters, so `load_weights` takes checkpoint and trainer state dicts unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenflow.engine.errors import UnsupportedModel
from tokenflow.engine.builtin.models.attention import (
    AttentionContext,
    decode_attention,
    extend_attention,
    packed_prefill_attention,
    prefill_attention,
)
from tokenflow.engine.builtin.models.packed import Linear, pack_linears
from tokenflow.engine.builtin.models.rope import apply_rope, rope_tables


@dataclass(frozen=True)
class ArchFlags:
    """Where the family members differ (besides q/k norm, which Qwen3 adds by subclass)."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False


class MergedLinear(Linear):
    """One linear layer standing for several Hugging Face ones stacked along the output dim."""

    def __init__(self, in_features: int, shards: list[tuple[str, int]], bias: bool) -> None:
        super().__init__(in_features, sum(size for _, size in shards), bias=bias)
        self.shards = shards


class LlamaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    kernel = None
    """The compiled CPU kernel (`tokenflow.engine.builtin.kernels.RMSNorm`; set by the engine)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As transformers: normalise in float32, cast back, then scale (one fused kernel in
        # float32, where the casts are no-ops).
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * h.to(x.dtype)

    def add_forward(self, h: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h + delta, norm(h + delta))``: the residual add and the next norm (one kernel)."""
        if self.kernel is not None:
            return self.kernel(delta, self.weight, self.eps, residual=h)
        h = h + delta
        return h, self(h)


class LlamaMLP(nn.Module):
    def __init__(self, config, flags: ArchFlags) -> None:
        super().__init__()
        size = config.intermediate_size
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"hidden_act {config.hidden_act!r}: only SwiGLU (silu) is supported")
        self.gate_up_proj = MergedLinear(config.hidden_size, [("gate_proj", size), ("up_proj", size)],
                                         bias=flags.mlp_bias)
        self.down_proj = Linear(size, config.hidden_size, bias=flags.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaAttention(nn.Module):
    def __init__(self, config, flags: ArchFlags) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim_of(config)
        self.scaling = self.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size, [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)],
            bias=flags.qkv_bias,
        )
        self.o_proj = Linear(q_size, config.hidden_size, bias=flags.o_bias)

    def rotate_qk(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE on the query and key heads (adjacent in the fused projection: one pass)."""
        qk = apply_rope(qk, cos, sin)
        return qk[:, :, : self.num_heads], qk[:, :, self.num_heads:]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: AttentionContext, layer: int) -> torch.Tensor:
        n, t, _ = x.shape
        heads = self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(x).view(n, t, heads + self.num_kv_heads, self.head_dim)
        q, k = self.rotate_qk(qkv[:, :, :heads], cos, sin)
        v = qkv[:, :, heads:]
        if ctx.kind == "decode":
            out = decode_attention(q[:, 0], k[:, 0], v[:, 0], ctx, layer, self.scaling)
        elif ctx.pack_index is not None:
            out = packed_prefill_attention(q[0], k[0], v[0], ctx, layer, self.scaling)
        else:
            attend = extend_attention if ctx.kind == "extend" else prefill_attention
            out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         ctx, layer, self.scaling).transpose(1, 2)
        return self.o_proj(out.reshape(n, t, -1))


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(self, config, flags: ArchFlags, index: int = 0) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config, flags)
        self.mlp = self.make_mlp(config, flags, index)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: AttentionContext, layer: int) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(h), cos, sin, ctx, layer)
        h, x = self.post_attention_layernorm.add_forward(h, attended)
        return h + self.mlp(x)

    def make_mlp(self, config, flags: ArchFlags, index: int) -> nn.Module:
        """The feed-forward block of layer ``index`` (mixture-of-experts families override it)."""
        return LlamaMLP(config, flags)


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer

    def __init__(self, config, flags: ArchFlags) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(config, flags, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
    routing = None
    """A mixture-of-experts model's `RoutingRecorder` (None for dense models)."""
    packs_weights = False
    """Keep the linear layers' weights packed for oneDNN too (``engine.pack_weights``; set by the
    engine where `packed.can_pack`): packed again after every load."""
    packed_bytes = 0
    """What the packed copies take."""
    moe_layers: list[int] = []
    """Indices of the layers with a sparse (mixture-of-experts) feed-forward block."""

    def __init__(self, config, max_len: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.model = self.model_cls(config, self.arch_flags(config))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.window = self.sliding_window(config)
        self.windowed_layers = frozenset(self.window_layers(config)) if self.window is not None else frozenset()
        cos, sin = rope_tables(config, head_dim_of(config), max_len, dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.requires_grad_(False)
        self.to(dtype)

    @classmethod
    def arch_flags(cls, config) -> ArchFlags:
        bias = bool(getattr(config, "attention_bias", False))
        return ArchFlags(qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(config, "mlp_bias", False)))

    @classmethod
    def sliding_window(cls, config) -> int | None:
        """Attention window of the model's layers, if any layer is windowed."""
        return None

    @classmethod
    def window_layers(cls, config) -> list[int]:
        """Indices of the windowed layers (all of them unless the config says otherwise)."""
        types = getattr(config, "layer_types", None)
        if types:
            return [i for i, t in enumerate(types) if t == "sliding_attention"]
        return list(range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """``input_ids``/``positions`` [N, T] -> final-norm hidden states [N, T, hidden]."""
        h = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].unsqueeze(2)
        sin = self.rope_sin[positions].unsqueeze(2)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, ctx, i)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """The head's logits, cast to float32 unless ``float32`` is False (a decode step hands
        them to the sampler in the model's dtype; it makes its float32 copy in its first pass)."""
        logits = self.lm_head(hidden)
        return logits.float() if float32 else logits

    def hf_views(self) -> dict[str, torch.Tensor]:
        """Every parameter under its Hugging Face name, as a view into this model's tensors."""
        views: dict[str, torch.Tensor] = {}
        for module_name, module in self.named_modules():
            shards = getattr(module, "shards", None)
            parent = module_name.rpartition(".")[0]
            for pname, param in module.named_parameters(recurse=False):
                if self.tied and module_name == "lm_head":
                    continue  # the embedding matrix, already listed
                if shards is None:
                    views[f"{module_name}.{pname}"] = param.data
                    continue
                offset = 0
                for shard, size in shards:
                    views[f"{parent}.{shard}.{pname}"] = param.data.narrow(0, offset, size)
                    offset += size
        return views

    def canonical_weights(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Checkpoint tensors under the names `hf_views` uses (MoE families fuse experts)."""
        return named

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into the model (names and shapes checked by caller)."""
        views = self.hf_views()
        for name, tensor in named_tensors:
            if name in views:
                views[name].copy_(tensor)
        self.repack()

    def repack(self) -> None:
        """Pack the linear layers' weights again (after any write to them), if this model packs."""
        if self.packs_weights:
            self.packed_bytes = pack_linears(self)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Random weights as transformers initialises them (normal(0, initializer_range))."""
        gen = torch.Generator().manual_seed(seed)
        std = getattr(self.config, "initializer_range", 0.02)
        for name, view in self.hf_views().items():
            if "norm" in name:
                view.fill_(1.0)
            elif name.endswith(".bias"):
                view.zero_()
            else:
                view.copy_(torch.randn(view.shape, generator=gen) * std)
        self.repack()


def layer_types_window(config) -> int | None:
    """The window of configs that mark windowed layers in ``layer_types`` (Qwen2, Qwen3)."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return config.sliding_window
    return None


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

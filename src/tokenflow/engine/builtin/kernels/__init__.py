"""tokenflow's own CPU kernels for the built-in engine (``engine.cpu_kernels``), compiled on
first use and cached (`build`): decode attention over the slot KV cache
(``decode_attention.cpp``) and RMSNorm with the residual add before it (``rms_norm.cpp``).

Where one cannot be built (no compiler) or cannot serve the model, the engine says why at start
and runs PyTorch's operations in its place.

May import: layer 1, ``tokenflow.model_store`` (the cache folder the libraries go to) and
``tokenflow.engine.builtin.models`` (the norms it hands the kernel to).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from tokenflow.engine.builtin.kernels.build import KernelUnavailable, entry_point

logger = logging.getLogger(__name__)

MAX_GROUP = 16
"""Most query heads per kv head (each keeps its query and sums in registers)."""
MAX_HEAD_DIM = 256
DTYPES = {torch.float32: 0, torch.bfloat16: 1}

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


def supports(dtype: torch.dtype, group: int, head_dim: int) -> str | None:
    """Why the attention kernel cannot serve this model (None: it can)."""
    if dtype not in DTYPES:
        return f"dtype {dtype} (float32 and bfloat16 only)"
    if not 1 <= group <= MAX_GROUP:
        return f"{group} query heads per kv head (1-{MAX_GROUP} only)"
    if head_dim % 8 or not 8 <= head_dim <= MAX_HEAD_DIM:
        return f"head dim {head_dim} (a multiple of 8 up to {MAX_HEAD_DIM} only)"
    return None


class DecodeAttention:
    """The attention kernel, built for one model's shape, called with the engine's tensors."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, scale: float) -> torch.Tensor:
        """``q`` [B, KVH, G, D]; ``k_cache``/``v_cache`` [slots, KVH, capacity, D] (slot b is row b);
        ``k``/``v`` [B, KVH, D], this step's keys and values, written at position ``ends[b] - 1``
        of slot b; ``starts``/``ends`` int64 [B]: row b then attends positions
        ``starts[b] <= j < ends[b]``. Returns [B, KVH, G, D]."""
        q = q.contiguous()
        batch, kv_heads, group, dim = q.shape
        # The kernel reads and writes raw memory: what it is handed is checked here.
        if {t.dtype for t in (k_cache, v_cache, k, v)} != {q.dtype}:
            raise ValueError("the queries, the KV cache and the new keys/values must share one dtype")
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
            raise ValueError("the KV cache's rows and the new keys/values must be contiguous in their last dim")
        if (k.shape != (batch, kv_heads, dim) or v.shape != k.shape or k_cache.shape[1:2] != (kv_heads,)
                or k_cache.shape[3] != dim or v_cache.shape != k_cache.shape):
            raise ValueError("the KV cache and the new keys/values must match the queries' kv heads and head dim")
        for t in (starts, ends):
            if t.dtype != torch.int64 or not t.is_contiguous() or t.shape != (batch,):
                raise ValueError(f"starts/ends: contiguous int64 tensors of {batch} rows")
        slots, capacity = k_cache.shape[0], k_cache.shape[2]
        out = torch.empty_like(q)
        # The rows' bounds are checked by the kernel itself, before it touches anything (2).
        code = self.fn(DTYPES[q.dtype], q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                       *k_cache.stride()[:3], *v_cache.stride()[:3], k.data_ptr(), v.data_ptr(),
                       *k.stride()[:2], *v.stride()[:2], starts.data_ptr(), ends.data_ptr(),
                       batch, kv_heads, group, dim, slots, capacity, scale, torch.get_num_threads())
        if code == 2:
            raise ValueError(f"rows end at positions 1..{capacity} of slots 0..{slots - 1}")
        if code:
            raise ValueError(f"the decode-attention kernel was built for another shape than {q.dtype}, "
                             f"group {group}, head dim {dim}")
        return out


def decode_attention_kernel(dtype: torch.dtype, group: int, head_dim: int) -> tuple[DecodeAttention | None, str]:
    """(the kernel built for this shape, "") where it can run, else (None, why not)."""
    why = supports(dtype, group, head_dim)
    if why is not None:
        return None, why
    defines = [f"-DTF_GROUP={int(group)}", f"-DTF_HEAD_DIM={int(head_dim)}", f"-DTF_BFLOAT16={DTYPES[dtype]}"]
    argtypes = [ctypes.c_int, *[_ptr] * 4, *[_i64] * 6, _ptr, _ptr, *[_i64] * 4, _ptr, _ptr, *[_i64] * 6,
                ctypes.c_float, ctypes.c_int]
    try:
        return DecodeAttention(entry_point("decode_attention.cpp", defines, "tf_decode_attention", argtypes,
                                           ctypes.c_int)), ""
    except KernelUnavailable as e:
        return None, str(e)


class RMSNorm:
    """The RMSNorm kernel: ``norm(x)``, or ``norm(x, residual=h)`` for ``(h + x, norm(h + x))``."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.dtype not in DTYPES or weight.dtype != x.dtype:
            raise ValueError(f"RMSNorm kernel: float32 or bfloat16 rows and weight alike, got {x.dtype}/{weight.dtype}")
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).contiguous()
        if weight.numel() != rows.shape[1] or (residual is not None and residual.shape != shape):
            raise ValueError(f"RMSNorm kernel: a weight of {rows.shape[1]} and a residual shaped like the rows")
        out = torch.empty_like(rows)
        summed = None
        if residual is not None:
            residual = residual.reshape(rows.shape).contiguous()
            summed = torch.empty_like(rows)
        self.fn(DTYPES[x.dtype], rows.data_ptr(), residual.data_ptr() if residual is not None else None,
                weight.contiguous().data_ptr(), summed.data_ptr() if summed is not None else None,
                out.data_ptr(), rows.shape[0], rows.shape[1], eps, torch.get_num_threads())
        if summed is None:
            return out.view(shape)
        return summed.view(shape), out.view(shape)


def rms_norm_kernel() -> tuple[RMSNorm | None, str]:
    argtypes = [ctypes.c_int, *[_ptr] * 5, _i64, _i64, ctypes.c_float, ctypes.c_int]
    try:
        return RMSNorm(entry_point("rms_norm.cpp", [], "tf_rms_norm", argtypes)), ""
    except KernelUnavailable as e:
        return None, str(e)


def use_engine_kernels(enabled: bool, model, device: torch.device, hf_config) -> DecodeAttention | None:
    """Give ``model``'s RMSNorms the norm kernel and return the attention kernel, where
    ``engine.cpu_kernels`` asks for them and they can run here; a warning says why one cannot."""
    if not enabled or device.type != "cpu":
        return None
    from tokenflow.engine.builtin.models.llama import LlamaRMSNorm, head_dim_of

    dtype = model.lm_head.weight.dtype
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    attention, why = decode_attention_kernel(dtype, heads // kv_heads, head_dim_of(hf_config))
    if attention is None:
        logger.warning("engine: decode attention by PyTorch's operations, not the compiled kernel "
                       "(engine.cpu_kernels): %s", why)
    norm, why = rms_norm_kernel() if dtype in DTYPES else (None, f"dtype {dtype}")
    if norm is None:
        logger.warning("engine: RMSNorm by PyTorch's operations, not the compiled kernel (engine.cpu_kernels): %s", why)
    for module in model.modules():
        if isinstance(module, LlamaRMSNorm):
            module.kernel = norm
    return attention

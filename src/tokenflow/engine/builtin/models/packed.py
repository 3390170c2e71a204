"""Linear layers that may also hold their weight in oneDNN's pre-packed layout (CPU, bfloat16 or
float32), and run a float32 product of a few rows (a decode step) the way round MKL does fast.

A bfloat16 matrix product on the CPU goes through oneDNN, which wants the weight in a blocked
layout of its own (AMX tiles where the CPU has them). Given PyTorch's ``[out, in]`` weight it
reorders it into that layout on every call: at a decode step's few rows that reorder costs as
much as the product. ``engine.pack_weights`` reorders each weight once, after every weight
load, and runs the product on the packed copy. The products are oneDNN's either way, and
bitwise equal (tests/engine/test_packed_weights.py); the price is a second copy of the linear
weights (the originals stay: weight updates, checksums and the tinker sampler read them by
their Hugging Face names).

A float32 product goes through MKL's sgemm unless its weight is packed. oneDNN's float32 kernels
on a packed weight are faster at a decode step's rows (SmolLM2's head at 36 rows: 16 ms against
27-30 ms, two threads, AVX2), so large float32 weights are packed too; their results differ from
sgemm's by summation order only (tests/engine/test_packed_float32.py bounds it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenflow.engine.builtin.models import LARGE_WEIGHT
from tokenflow.precision import onednn_bf16_supported

BATCH_HINT = 64
"""The rows oneDNN picks the packed layout for (a decode batch); any number of rows runs."""

SKINNY_ROWS = 64
"""Up to this many rows, a float32 product on the CPU by a weight of at least `LARGE_WEIGHT`
elements that is not packed (``engine.pack_weights = false``, as in the laptop example) runs as
``weight @ x.T`` (then transposed back and made contiguous) instead of ``x @ weight.T``: MKL's sgemm handles a few rows against a
transposed weight poorly (SmolLM2's head at 4 rows: 18.7 ms, against 5.4 ms the other way round,
two threads, AVX2). A decode step is a few rows; a prefill, hundreds, stays as it was (slower the
other way round from 128 rows; at 64 about even in two microbenchmark runs, and 64 gave the best
end-to-end of 16, 32, 64 and 128). SmolLM2 decoding in float32 (`tokenflow bench engine`'s
workload, AVX2, two threads), three runs alternating both ways in one process, median of three
each: 176 -> 201, 164 -> 190 and 186 -> 196 tokens/s."""

def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch can pack weights for ``device``/``dtype``: CPU float32 with oneDNN, or
    CPU bfloat16 on a CPU oneDNN computes bfloat16 on (AVX-512 BW/VL/DQ, AVX-NE-CONVERT, Arm
    BF16). Elsewhere (bfloat16 on an AVX2-only CPU) the reorder refuses ("bf16 path needs the
    cpu support ...") and the engine multiplies its weights as they are."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and onednn_bf16_supported())


def packs(weight: torch.Tensor) -> bool:
    """Whether `pack_linears` packs this weight: every bfloat16 one; a float32 one of at least
    `LARGE_WEIGHT` elements."""
    return weight.dtype != torch.float32 or weight.numel() >= LARGE_WEIGHT


class Linear(nn.Linear):
    """`nn.Linear` that runs on its packed weight once `pack` has made one."""

    packed: torch.Tensor | None = None

    def pack(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), BATCH_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            if (x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() <= SKINNY_ROWS * x.shape[-1]
                    and self.weight.numel() >= LARGE_WEIGHT):
                rows = x.reshape(-1, x.shape[-1])
                y = torch.mm(self.weight, rows.t()).t().contiguous()
                if self.bias is not None:
                    y += self.bias
                return y.view(*x.shape[:-1], y.shape[-1])
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], y.shape[-1])


def pack_linears(model: nn.Module) -> int:
    """Pack every `Linear` of ``model`` whose weight `packs` from its current weight; returns the
    bytes of the weights packed (what the packed copies take, less any padding of oneDNN's blocks)."""
    total = 0
    for module in model.modules():
        if isinstance(module, Linear) and packs(module.weight):
            module.pack()
            total += module.weight.numel() * module.weight.element_size()
    return total


def packing_note(model) -> str:
    """For the engine's start-up line: what packing costs, if this model packs."""
    if not getattr(model, "packs_weights", False) or not model.packed_bytes:
        return ""
    return f", linear weights also packed for oneDNN ({model.packed_bytes / 1e6:.0f} MB; engine.pack_weights)"

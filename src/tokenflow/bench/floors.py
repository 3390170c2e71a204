"""What the hardware allows a model: the memory-bandwidth and matrix-product floors of this machine,
measured here, and what they make of decoding and training.

    decode, B sequences per step:  time/step ≥ max(weight bytes ÷ bandwidth, 2·N·B ÷ matmul rate)
                                   tokens/s  ≤ B ÷ that
    training, T tokens:            time ≥ 6·N·T ÷ matmul rate (forward 2·N·T, backward 4·N·T)

N counts the parameters a token passes through (the embedding table is a lookup, not a product;
a tied output head is a product). Bandwidth is a large tensor copy (read + write bytes ÷
seconds); the matmul rate is the best of a few square-ish products at the model's hidden size,
in the dtype asked, on the threads asked. Both are measured in the calling process, so a loaded
machine gives lower floors, as it gives slower runs: compare within one run.
"""

from __future__ import annotations

import time


def _best(fn, repeat: int) -> float:
    fn()  # warm-up: allocation, kernel selection
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def memory_bandwidth(mib: int = 512, repeat: int = 5) -> float:
    """Bytes per second of a large copy (each byte read once and written once)."""
    import torch

    src = torch.ones(mib * 2 ** 20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _best(lambda: dst.copy_(src), repeat)
    return 2 * src.numel() * 4 / seconds


def matmul_rate(hidden: int, dtype: str = "float32", tokens: int = 2048, repeat: int = 5) -> float:
    """FLOP/s of a (tokens × hidden) @ (hidden × 4·hidden) product, the shape of an MLP's."""
    import torch

    dt = getattr(torch, dtype)
    a = torch.randn(tokens, hidden).to(dt)
    b = torch.randn(hidden, 4 * hidden).to(dt)
    seconds = _best(lambda: a @ b, repeat)
    return 2 * tokens * hidden * 4 * hidden / seconds


def model_figures(model) -> dict:
    """Parameters a token's products use, and the bytes the engine reads per decode step."""
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embed
    # The lookup is no product; a tied head is the same table used as one.
    product_params = params - (0 if tied else embed.numel())
    return {"params": params, "product_params": product_params}


def floors(model, dtype: str, batch: int, threads: int | None = None) -> dict:
    """This machine's floors for ``model`` decoding ``batch`` sequences per step in ``dtype``."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    fig = model_figures(model)
    width = 2 if dtype == "bfloat16" else 4
    weight_bytes = fig["params"] * width
    bw = memory_bandwidth()
    rate = matmul_rate(model.config.hidden_size, dtype)
    memory_s, compute_s = weight_bytes / bw, 2 * fig["product_params"] * batch / rate  # per decode step
    return {
        "params": fig["params"],
        "weight_bytes": weight_bytes,
        "memory_bandwidth_gb_s": round(bw / 1e9, 2),
        "matmul_gflop_s": round(rate / 1e9, 1),
        "decode_batch": batch,
        "decode_floor_tokens_per_s": round(batch / max(memory_s, compute_s), 1),
        "decode_floor_bound": "memory" if memory_s >= compute_s else "compute",
        "train_floor_tokens_per_s": round(rate / (6 * fig["product_params"]), 1),
        "threads": torch.get_num_threads(),
    }

"""bfloat16 against float32 matrix products on this CPU, one thread, at SmolLM2-135M's shapes.

    python benchmarks/cpu_precision.py [--threads 1] [--seconds 0.5]

Prints one JSON object: the CPU's vector level, whether it has bfloat16 matrix units (what
``dtype = "native"`` reads, `tokenflow.precision`), what "native" resolves to, and per shape the
GFLOP/s of each dtype (best of three timed windows) and bfloat16 ÷ float32. Where bfloat16 is
emulated the ratio is far below 1, and a config should say "native" or "float32".
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tokenflow.precision import cpu_description, cpu_has_native_bf16, native_dtype

# [tokens, in, out]: a 384-token micro-batch through the MLP's up projection and attention's
# output projection (hidden 576, intermediate 1536), and a 64-sequence decode step through them.
SHAPES = ((384, 576, 1536), (384, 576, 576), (64, 576, 1536), (64, 1536, 576))


def gflops(m: int, k: int, n: int, dtype: torch.dtype, seconds: float) -> float:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b  # the kernel chosen and built
    best = float("inf")
    for _ in range(3):
        reps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3 or reps == 0:
            a @ b
            reps += 1
        best = min(best, elapsed / reps)
    return 2 * m * k * n / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.5, help="time per shape and dtype")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for m, k, n in SHAPES:
        f32 = gflops(m, k, n, torch.float32, args.seconds)
        bf16 = gflops(m, k, n, torch.bfloat16, args.seconds)
        rows.append({"shape": [m, k, n], "float32_gflops": round(f32, 2), "bfloat16_gflops": round(bf16, 2),
                     "bfloat16_over_float32": round(bf16 / f32, 3)})
    print(json.dumps({"cpu": cpu_description(), "native_bf16": cpu_has_native_bf16(),
                      "native_dtype": native_dtype("cpu"), "threads": args.threads, "shapes": rows}))


if __name__ == "__main__":
    main()

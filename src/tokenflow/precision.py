"""Which precision a device multiplies fastest: the ``"native"`` value of ``engine.dtype`` and
``trainer.dtype``.

bfloat16 halves the bytes a decode step reads and, on hardware with bfloat16 matrix units,
doubles the matmul rate. Without such units the CPU's bfloat16 products are emulated, and slow:
on an AVX2-only CPU (AMD EPYC, torch 2.13) one thread multiplied SmolLM2-135M's shapes at
1.2-2.3 GFLOP/s in bfloat16 against 77-88 in float32, 36-68× slower
(`benchmarks/cpu_precision.py`; an AVX-512 CPU without the units converts instead, at a cost not
measured here). Most laptops' CPUs have neither AVX-512 nor the units. ``"native"`` is bfloat16
where the device has them (CUDA; x86 CPUs with AMX or AVX-512 BF16; Arm CPUs with the BF16
extension) and float32 elsewhere.

Resolved where the config is read (the driver's machine), so a run's saved config names the
precision it ran in, and a resume keeps it.
"""

from __future__ import annotations

import functools
import platform

_X86_FLAGS = ("amx_bf16", "avx512_bf16")


def _cpuinfo_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); None off Linux."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return set()


def onednn_bf16_supported() -> bool:
    """oneDNN's own check of the CPU (the one its bfloat16 weight packing makes): what the engine
    asks before packing, and the answer where there is no /proc/cpuinfo to read (macOS)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX, AVX-512 BF16, Arm BF16)."""
    flags = _cpuinfo_flags()
    return onednn_bf16_supported() if flags is None else bool(flags & {*_X86_FLAGS, "bf16"})


@functools.cache
def cpu_onednn_bf16() -> bool:
    """Whether oneDNN runs bfloat16 products on this CPU at all: what its weight packing needs
    (AVX-512 BW/VL/DQ, AVX-NE-CONVERT, AMX, Arm BF16; the check torch's
    ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` makes), read without importing torch."""
    flags = _cpuinfo_flags()
    if flags is None:
        return onednn_bf16_supported()
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or bool(flags & {"avx_ne_convert", "amx_bf16", "bf16"})


def cpu_description() -> str:
    """The CPU's vector level as torch reports it ("AVX2", "AVX512", ...), for messages."""
    import torch

    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def native_dtype(device: str) -> str:
    """"bfloat16" where ``device`` ("cpu", "cuda", "auto": CUDA when visible) has bfloat16 matrix
    units, else "float32"."""
    if device == "cuda":
        return "bfloat16"
    if device == "auto":
        import torch

        if torch.cuda.is_available():
            return "bfloat16"
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def slow_bf16_warning(section: str, device: str, dtype: str) -> str | None:
    """A warning for ``{section}.dtype = "bfloat16"`` on a CPU without bfloat16 units, else None."""
    if dtype != "bfloat16" or native_dtype(device) == "bfloat16":
        return None
    return (f'{section}.dtype = "bfloat16" on a CPU without bfloat16 matrix units ({cpu_description()}): '
            "its matrix products are emulated (36-68x slower than float32 on an AVX2-only CPU; "
            "python benchmarks/cpu_precision.py measures this one); "
            f'set {section}.dtype = "native" (bfloat16 where the CPU has the units, float32 here) or "float32"')

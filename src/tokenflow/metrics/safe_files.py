"""Writing files in a run folder without following links.

A run folder is data: people download it, share it and copy it between machines, so a link in
it may point anywhere (``metrics.jsonl`` → someone's ``~/.bashrc``). Every file tokenflow writes
there is opened with ``O_NOFOLLOW`` on its last component, and a whole-file rewrite goes to a
temporary created exclusively (``O_EXCL``, a fresh random name) and then renamed over the file
(``os.replace`` replaces a link itself, never what it points to). A link where tokenflow writes is
refused with `RunFolderError` naming it; ``tokenflow.runtime.run.folder_guard`` refuses a folder
that carries one before a run starts, so these refusals are the second line.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import IO

from tokenflow.errors import RunFolderError

_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "r+": os.O_RDWR | os.O_CREAT}


def link_refused(path: str | Path) -> RunFolderError:
    """The error for a symbolic link found where tokenflow writes."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return RunFolderError(f"{path} is a symbolic link (to {target}); tokenflow writes a run folder's files "
                          "itself and never through a link: replace the link with a copy of the file it "
                          "points to, or remove it")


def open_fd(path: str | Path, mode: str = "w", perms: int = 0o644) -> int:
    """A descriptor of ``path`` opened for ``mode`` ("w", "a", "r+"; created if missing), never
    through a link."""
    try:
        return os.open(path, _FLAGS[mode] | os.O_NOFOLLOW | os.O_CLOEXEC, perms)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise link_refused(path) from None
        raise


def open_text(path: str | Path, mode: str = "w") -> IO[str]:
    """``open(path, mode, encoding="utf-8")`` for "w" or "a", never through a link."""
    return os.fdopen(open_fd(path, mode), mode, encoding="utf-8")


def write_atomic(path: str | Path, data: str | bytes, *, fsync: bool = False) -> None:
    """Replace ``path`` with ``data`` whole: a fresh temporary beside it (created exclusively, so
    never an existing file or link), renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

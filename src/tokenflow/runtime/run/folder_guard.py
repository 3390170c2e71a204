"""What makes a folder a run folder, and what a run folder cannot make tokenflow do.

A run folder is data: people download it, share it, copy it between machines. So

* a folder is a run folder only if it carries tokenflow's marker, ``.tokenflow-run`` (a JSON
  object ``{"format": 1}``), written when tokenflow creates the folder. A new run never starts
  in (and so never cleans) a non-empty folder without it; ``--resume`` refuses one.
* a run folder carries no symbolic links: tokenflow writes its files (the lock, metrics, the
  ledger, summaries, checkpoints) in the folder itself, and a link there could point anywhere.
  A folder with a link anywhere in it is refused before anything is written; every write is
  also made without following links (`tokenflow.metrics.safe_files`). Refused rather than
  replaced: a link is either a mistake the user should hear about or someone else's trap, and
  replacing it would silently drop what the user meant by it. A run folder may itself be a link
  (``runs/x`` → a larger disk): only what is inside it is checked.

Run folders an earlier tokenflow made carry no marker. ``--resume`` (which the user gives
explicitly) accepts one that holds what every such run wrote before its first step
(``config.toml``, ``checkpoints/``, ``.lock``, no links), and writes the marker into it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from tokenflow.errors import RunFolderError
from tokenflow.metrics.safe_files import link_refused

log = logging.getLogger(__name__)

MARKER = ".tokenflow-run"
FORMAT = 1
LEGACY_FILES = ("config.toml", "checkpoints", ".lock")  # what every run of an earlier tokenflow wrote first


def has_marker(root: str | Path) -> bool:
    marker = Path(root) / MARKER
    return marker.is_file() and not marker.is_symlink()


def write_marker(root: str | Path) -> None:
    """Mark ``root`` as a run folder (kept as it is when marked already)."""
    try:
        fd = os.open(Path(root) / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT}, f)


def _check_format(root: Path) -> None:
    marker = root / MARKER
    try:
        fmt = json.loads(marker.read_text(encoding="utf-8")).get("format")
    except (ValueError, UnicodeDecodeError, AttributeError, OSError):
        fmt = None
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise RunFolderError(f"{marker} does not read as tokenflow's run marker (a JSON object with an integer "
                             '"format"); it was damaged or not written by tokenflow')
    if fmt > FORMAT:
        raise RunFolderError(f"{root} is a run folder of format {fmt}, made by a newer tokenflow (this one reads "
                             f"format {FORMAT}); resume it with that version")


def check_no_links(root: str | Path) -> None:
    """`RunFolderError` naming the first symbolic link anywhere inside ``root``."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            if path.is_symlink():
                raise link_refused(path)


def _is_empty(root: Path) -> bool:
    return not root.exists() or (root.is_dir() and next(root.iterdir(), None) is None)


def claim_for_new_run(root: str | Path) -> None:
    """Refuse to start a run in ``root`` unless it is new, empty, or a run folder (marked) without links."""
    root = Path(root)
    if _is_empty(root):
        return
    if not root.is_dir():
        raise RunFolderError(f"{root} is not a folder; choose another --output-dir")
    if not has_marker(root):
        raise RunFolderError(f"{root} is not empty and holds no {MARKER} marker, so it is not a tokenflow run "
                             "folder; tokenflow never cleans a folder it did not create: choose a new or empty "
                             "--output-dir")
    _check_format(root)
    check_no_links(root)


def claim_for_resume(root: str | Path, *, mark: bool = True) -> None:
    """Refuse to resume ``root`` unless it is a run folder without links; with ``mark``, mark a
    complete run folder of an earlier tokenflow (see the module's docstring)."""
    root = Path(root)
    if _is_empty(root):
        return  # nothing there yet: the run starts from step 0
    if not root.is_dir():
        raise RunFolderError(f"{root} is not a folder; give --resume the folder of a run")
    check_no_links(root)
    if has_marker(root):
        _check_format(root)
        return
    missing = [name for name in LEGACY_FILES if not (root / name).exists()]
    if missing:
        raise RunFolderError(f"{root} is not a tokenflow run folder: it has no {MARKER} marker (written when "
                             f"tokenflow creates a run) and no {', '.join(missing)} (what an earlier tokenflow's "
                             "runs hold); give --resume the folder of a run `tokenflow train` created")
    if mark:
        write_marker(root)
        log.info("%s is a run folder of an earlier tokenflow; marked it as a run folder (%s)", root, MARKER)

"""Checkpoints on disk and the ``tinker://`` paths that name them.

``tinker://MODEL_ID/weights/NAME`` is a training state (``save_state``: trainable weights,
optionally the optimizer); ``tinker://MODEL_ID/sampler_weights/NAME`` is a sampler snapshot
(``save_weights_for_sampler`` with a name: merged weights as safetensors, loadable by any
engine or by transformers). Both live under ``ROOT/MODEL_ID/`` with a ``meta.json``.
Names and ids come from clients, so each is checked against a strict pattern and every path is
resolved and kept inside the root: a name cannot climb out of it or follow a link.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tokenflow.tinker.errors import user_error

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")  # the SDK's ids: SESSION:train:N
KINDS = {"weights": "training", "sampler_weights": "sampler"}


def check_name(name: str, what: str = "name") -> str:
    pattern = _MODEL_ID if what == "model id" else _NAME
    if not isinstance(name, str) or not pattern.fullmatch(name) or ".." in name:
        raise user_error(f"{what} {name!r} is not allowed: use 1-128 letters, digits, '_', '-' or '.', "
                         "starting with a letter or digit")
    return name


@dataclass
class Location:
    model_id: str
    kind: str  # "weights" | "sampler_weights"
    name: str

    @property
    def path(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"


def parse(path: str) -> Location:
    """A ``tinker://`` path, checked; a user error naming the expected shape otherwise."""
    if not isinstance(path, str) or not path.startswith("tinker://"):
        raise user_error(f"path {path!r} is not a tinker:// path (tinker://MODEL_ID/weights/NAME "
                         "or tinker://MODEL_ID/sampler_weights/NAME)")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS:
        raise user_error(f"path {path!r} is not tinker://MODEL_ID/weights/NAME or "
                         "tinker://MODEL_ID/sampler_weights/NAME")
    return Location(check_name(parts[0], "model id"), parts[1], check_name(parts[2], "checkpoint name"))


class Store:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def folder(self, loc: Location, *, create: bool = False) -> Path:
        p = (self.root / loc.model_id / loc.kind / loc.name)
        for part in (self.root / loc.model_id, self.root / loc.model_id / loc.kind, p):
            if part.is_symlink():
                raise user_error(f"{loc.path}: the service's checkpoint folder holds a link there; refusing")
        if create:
            p.mkdir(parents=True, exist_ok=True)
        if not p.resolve().is_relative_to(self.root):
            raise user_error(f"{loc.path} resolves outside the checkpoint root")
        return p

    def exists(self, loc: Location) -> bool:
        return (self.folder(loc) / "meta.json").is_file()

    def write_meta(self, loc: Location, meta: dict) -> None:
        folder = self.folder(loc, create=True)
        meta = {**meta, "time": time.time(), "tinker_path": loc.path}
        tmp = folder / "meta.json.tmp"
        tmp.write_text(json.dumps(meta))
        tmp.replace(folder / "meta.json")

    def meta(self, loc: Location) -> dict:
        f = self.folder(loc) / "meta.json"
        if not f.is_file():
            raise user_error(f"no checkpoint at {loc.path}")
        return json.loads(f.read_text())

    def delete(self, loc: Location) -> None:
        folder = self.folder(loc)
        if not folder.is_dir():
            raise user_error(f"no checkpoint at {loc.path}")
        shutil.rmtree(folder)

    def list(self, model_id: str) -> list[tuple[Location, dict]]:
        check_name(model_id, "model id")
        out = []
        for kind in KINDS:
            base = self.root / model_id / kind
            if not base.is_dir() or base.is_symlink():
                continue
            for child in sorted(base.iterdir()):
                if child.is_symlink() or not (child / "meta.json").is_file():
                    continue
                loc = Location(model_id, kind, child.name)
                out.append((loc, json.loads((child / "meta.json").read_text())))
        return out

    def size(self, loc: Location) -> int:
        return sum(f.stat().st_size for f in self.folder(loc).rglob("*") if f.is_file() and not f.is_symlink())

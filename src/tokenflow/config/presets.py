"""Named presets: a config file can start from one with a single line.

    preset = "tiny-cpu"      # at the top of a config file, or `tokenflow train --preset tiny-cpu`

    [trainer]
    lr = 1e-4                # the file's keys override the preset's

A file that names no preset starts from the library's defaults (the field defaults, which suit a
pretrained LLM: lr 1e-6, a constant schedule). ``tokenflow train`` with no file at all runs the
``tiny-cpu`` preset: the shipped tiny model on the arithmetic task, on the CPU, lr 3e-4.
Presets are TOML files in ``tokenflow/configs/presets/``.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from tokenflow.errors import ConfigError

DEFAULT_PRESET = "tiny-cpu"
"""The preset ``tokenflow train`` runs when given no config file."""


def presets_dir() -> Path:
    return Path(str(resources.files("tokenflow") / "configs" / "presets"))


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def preset_path(name: str) -> Path:
    path = presets_dir() / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return path


def merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``, section by section (a value in ``over`` wins)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_preset(data: dict, name: str | None) -> dict:
    """The file's data on top of preset ``name`` (None: the data as is)."""
    if name is None:
        return data
    if not isinstance(name, str):
            raise ConfigError(f'preset must be a name such as "{DEFAULT_PRESET}" (got {name!r})')
    return merge(tomllib.loads(preset_path(name).read_text()), data)


def default_config_path() -> Path:
    """The embedded default run (preset "tiny-cpu"): the shipped model on the arithmetic task,
    async, on the CPU."""
    return preset_path(DEFAULT_PRESET)

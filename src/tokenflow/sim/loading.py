"""Build a :class:`SimConfig` from layers: preset < TOML file < dotted overrides < sweep point.

Each layer is a raw ``{section: {key: value}}`` dict. The training config's keys that describe
the pipeline (``rollout.max_staleness``, ``sync.every``, ...) are the simulator's names for it,
in a TOML file, an override or a sweep; the simulator's own ``[workload]`` / ``[pipeline]`` keys
are their aliases (table ``TRAINING_KEYS``, docs/simulate.md). Training keys are translated
onto the aliases first, so a training TOML works unchanged; the rest of the training config is
ignored. Unknown keys in the simulator's own sections are refused with the list of valid keys.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomllib
from pydantic import ValidationError

from tokenflow.config.loading import ConfigError as _TrainConfigError
from tokenflow.config.sim import SimConfig
from tokenflow.sim.presets import PRESETS

log = logging.getLogger(__name__)

OWN_SECTIONS = ("hardware", "workload", "pipeline", "sim")

TRAINING_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    ("rollout", "prompts_per_step"): ("workload", "prompts_per_step"),
    ("rollout", "group_size"): ("workload", "group_size"),
    ("rollout", "max_staleness"): ("pipeline", "max_staleness"),
    ("rollout", "batch_order"): ("pipeline", "batch_order"),
    ("algorithm", "max_token_age"): ("pipeline", "max_token_age"),
    ("sampling", "max_tokens"): ("workload", "max_tokens"),
    ("engine", "update_mode"): ("pipeline", "update_mode"),
    ("sync", "every"): ("pipeline", "sync_every"),
    ("sync", "transport"): ("pipeline", "transport"),
    ("sync", "bucket_mb"): ("pipeline", "bucket_mb"),
}
"""(training section, key) -> (simulator section, key): each training key and its simulator alias."""


class ConfigError(_TrainConfigError):
    """A configuration the simulator cannot use; the message says what to change."""


def set_dotted(raw: dict, dotted: str, value: Any) -> None:
    """Set ``section.key`` in a raw layer."""
    section, sep, key = dotted.partition(".")
    if not sep or not key or "." in key:
        raise ConfigError(f"override {dotted!r}: expected section.key (e.g. hardware.inference_gpus)")
    raw.setdefault(section, {})[key] = value


def _translate(layer: dict, origin: str) -> dict:
    """Map a raw layer's training sections onto the simulator's sections."""
    out: dict[str, dict] = {s: dict(layer.get(s, {})) for s in OWN_SECTIONS if s in layer}
    ignored = [s for s in layer if s not in OWN_SECTIONS
               and not any(s == t for t, _ in TRAINING_KEYS)]
    if ignored:
        log.debug("%s: ignoring training-only sections %s", origin, ignored)
    for (tsec, tkey), (ssec, skey) in TRAINING_KEYS.items():
        section = layer.get(tsec)
        if not isinstance(section, dict) or tkey not in section:
            continue
        value = section[tkey]
        own = out.setdefault(ssec, {})
        if skey in own and own[skey] != value:
            raise ConfigError(f"{origin}: [{tsec}] {tkey} = {value!r} conflicts with "
                              f"[{ssec}] {skey} = {own[skey]!r}; give it once")
        own[skey] = value
    return out


def _merge(base: dict, top: dict) -> dict:
    merged = copy.deepcopy(base)
    for section, values in top.items():
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}] must be a table of keys")
        merged.setdefault(section, {}).update(values)
    return merged


def _check_keys(raw: dict) -> None:
    for section, values in raw.items():
        fields = SimConfig.model_fields[section].annotation.model_fields
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"[{section}] has unknown key(s) {', '.join(unknown)}; "
                              f"valid keys: {', '.join(fields)}")


def load_layers(layers: Iterable[tuple[str, dict]]) -> SimConfig:
    """Validate the merge of ``(origin, raw layer)`` pairs, lowest precedence first."""
    raw: dict = {}
    for origin, layer in layers:
        raw = _merge(raw, _translate(layer, origin))
    _check_keys(raw)
    if "hardware" not in raw:
        raise ConfigError("no [hardware] section: give a TOML with one, or --preset "
                          f"({', '.join(PRESETS)})")
    try:
        return SimConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError("; ".join(lines)) from e


def read_toml(path: str | Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def preset_layer(name: str) -> dict:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


def build_layers(config_path: str | Path | None = None, preset: str | None = None,
                 overrides: dict[str, Any] | None = None) -> list[tuple[str, dict]]:
    """The layers of a run: preset, TOML file, then ``{"section.key": value}`` overrides."""
    layers: list[tuple[str, dict]] = []
    if preset:
        layers.append((f"preset {preset}", preset_layer(preset)))
    if config_path:
        layers.append((str(config_path), read_toml(config_path)))
    if overrides:
        top: dict = {}
        for k, v in overrides.items():
            set_dotted(top, k, v)
        layers.append(("command line", top))
    return layers


def load_config(config_path: str | Path | None = None, preset: str | None = None,
                overrides: dict[str, Any] | None = None) -> SimConfig:
    """The simulator config from a preset, a TOML file and dotted overrides."""
    return load_layers(build_layers(config_path, preset, overrides))

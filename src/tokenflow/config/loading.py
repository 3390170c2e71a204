"""Load a config tree from TOML plus dotted command-line overrides, with errors a user can act on.

    cfg = load_config(TrainConfig, "run.toml", ["--algorithm.clip_high", "0.28"])

Override values are parsed as TOML values (``0.28``, ``true``, ``[1, 2]``, ``"text"``); anything
that does not parse is taken as a plain string, so ``--task.name dataset`` works unquoted.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tokenflow.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--a.b", "1", "--c.d=x"]`` → ``{"a.b": 1, "c.d": "x"}``."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected an override like --section.key VALUE, got {arg!r}")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"override --{key} has no value; write --{key} VALUE")
            value = args[i + 1]
            i += 2
        out[key.replace("-", "_")] = parse_value(value)
    return out


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {p!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The config class of the section at ``loc`` (None when loc leaves the tree)."""
    current: Any = model
    for part in loc:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        current = field.annotation
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _describe(model: type[BaseModel], err: dict) -> str:
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc) or "(config)"
    if err["type"] == "extra_forbidden":
        section = _model_at(model, loc[:-1])
        valid = sorted(section.model_fields) if section else []
        where = f"[{'.'.join(loc[:-1])}]" if loc[:-1] else "the top level"
        hint = difflib.get_close_matches(loc[-1], valid, n=1)
        msg = f"unknown key {key!r}"
        if hint:
            msg += f" (did you mean {'.'.join(loc[:-1] + (hint[0],))!r}?)"
        return f"{msg}; valid keys in {where}: {', '.join(valid)}"
    if err["type"] == "value_error":  # a validator's message already names the keys
        return err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    shown = f" (got {value!r})" if not isinstance(value, dict) else ""
    return f"{key}: {err['msg']}{shown}; set a valid {key} (`tokenflow train --help-config` documents every key)"


def validate(model: type[M], data: dict) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [_describe(model, err) for err in e.errors()]
        raise ConfigError("invalid config: " + "; ".join(lines)) from None


def load_config(model: type[M], path: str | Path | None = None, overrides: list[str] | dict | None = None,
                *, preset: str | None = None) -> M:
    """The file at ``path`` on top of its preset (its top-level ``preset = "name"``, or ``preset``
    here, which wins), then the overrides. No preset: the file on top of the field defaults."""
    from tokenflow.config.presets import apply_preset

    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist; check the path")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML ({e}); fix the syntax there") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
        except OSError as e:
            raise ConfigError(f"config file {str(p)!r} cannot be read ({e.strerror}); check the path") from None
    named = data.pop("preset", None)
    data = apply_preset(data, preset or named)
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return validate(model, data)


def to_toml(cfg: BaseModel) -> str:
    """The resolved config as TOML (keys left at None are omitted: TOML has no null)."""
    import tomli_w

    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))


def describe_fields(model: type[BaseModel], prefix: str = "",
                    resolved: BaseModel | None = None) -> list[tuple[str, str, str, str]]:
    """(dotted key, resolved value, library default, doc) for every field, for ``--help-config``.

    ``resolved`` is a loaded config; without one the resolved value is the default. Values are
    shown as TOML would write them (``"cpu"``, ``3e-4``, ``true``)."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += describe_fields(ann, key + ".", getattr(resolved, name) if resolved is not None else None)
            continue
        default = field.get_default(call_default_factory=True)
        value = getattr(resolved, name) if resolved is not None else default
        rows.append((key, toml_value(value), toml_value(default), (field.description or "").strip()))
    return rows


def toml_value(value: Any) -> str:
    """One value as TOML writes it; None (which TOML cannot hold) as ``none`` (the key is unset)."""
    import tomli_w
    from pydantic import TypeAdapter

    if value is None:
        return "none"
    plain = TypeAdapter(type(value)).dump_python(value, mode="json")
    if isinstance(plain, list):  # inline, on one line (tomli_w writes one element a line)
        return "[" + ", ".join(toml_value(v) for v in plain) + "]"
    if isinstance(plain, dict):  # an inline table (tomli_w writes a table as its own section)
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in plain.items()) + "}"
    return tomli_w.dumps({"v": plain}).split("=", 1)[1].strip()

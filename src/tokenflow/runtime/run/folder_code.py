"""Code a run folder's config names runs only when the user says so for that run.

A run folder's ``config.toml`` is data from wherever the folder came from. Some of its keys name
code that tokenflow would import and call: a reward, environment, agent or token-scorer function
(``module:name`` or ``path/to/file.py:name``), and ``trust_remote_code = true``, which lets
transformers import the model code a checkpoint's ``config.json`` names in its ``auto_map``
(a ``.py`` file beside it). ``tokenflow train --resume`` and ``tokenflow eval`` refuse such a
config with one line naming the key, unless the user passes ``--trust-run-config`` or names the
key again on the command line (``--task.reward my_reward.py:fn``), which makes it the user's.
An option in ``[task.options]`` that reads as such a spec counts too (the Gym adapter imports its
``make``), and so does a verifiers task's ``env`` (a taskset, which is code).

Not code: a registered name without a colon (a built-in or an installed plugin's scorer, task or
estimator), and ``tokenflow.*:name`` (the library's own modules).
"""

from __future__ import annotations

import re

from tokenflow.errors import RunFolderError

TRUST_FLAG = "--trust-run-config"

CODE_KEYS = {  # key → what its value names
    "task.reward": "a reward function", "task.env": "an environment class", "task.agent": "an agent function",
    "scorer.token": "a token scorer",
}
REMOTE_CODE_KEYS = ("model.trust_remote_code", "trainer.trust_remote_code")


def names_code(spec) -> bool:
    """Whether ``spec`` names code outside tokenflow: a ``file.py:name`` or a ``module:name``."""
    if not isinstance(spec, str) or ":" not in spec:
        return False
    target = spec.rsplit(":", 1)[0]
    return target.endswith(".py") or not (target == "tokenflow" or target.startswith("tokenflow."))


def _option_names_code(value) -> bool:
    """An option's string that reads as ``path/to/file.py:name`` or ``dotted.module:name`` outside
    tokenflow (the Gym adapter's ``make``, say): an option handed to code may be imported as
    code. Strings whose part before the colon is no module path (a URL, a time) are not."""
    if not isinstance(value, str) or ":" not in value:
        return False
    target = value.rsplit(":", 1)[0]
    return names_code(value) and (target.endswith(".py") or re.fullmatch(r"[A-Za-z_][\w.]*", target) is not None)


def _code_options(options, prefix: str = "task.options"):
    """``(dotted key, value)`` of every value in ``[task.options]`` (nested tables included) that
    names code."""
    for key, value in (options or {}).items():
        if isinstance(value, dict):
            yield from _code_options(value, f"{prefix}.{key}")
        elif _option_names_code(value):
            yield f"{prefix}.{key}", value


def _value(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node


def code_keys(cfg, given: set[str]) -> list[str]:
    """``key = value`` of every key of ``cfg`` that names code and that the user did not give
    (``given``: the dotted keys of the command line's overrides)."""
    def from_user(key: str) -> bool:
        return any(key == g or key.startswith(g + ".") for g in given)

    found = [f"{key} = {_value(cfg, key)!r} ({what})" for key, what in CODE_KEYS.items()
             if not from_user(key) and names_code(_value(cfg, key))]
    vf_env = getattr(cfg.task, "options", {}).get("env") if getattr(cfg.task, "name", "") == "verifiers" else None
    if isinstance(vf_env, str) and not from_user("task.options.env"):  # a taskset id or folder: code
        found.append(f"task.options.env = {vf_env!r} (a verifiers environment)")
    found += [f"{key} = {value!r} (code an option names)" for key, value in _code_options(
        getattr(cfg.task, "options", None)) if not from_user(key)
        and not any(f.startswith(f"{key} = ") for f in found)]  # the verifiers line names it already
    found += [f"{key} = true (model code the checkpoint's config.json names in auto_map)"
              for key in REMOTE_CODE_KEYS if not from_user(key) and _value(cfg, key) is True]
    return found


def refuse_folder_code(cfg, overrides: list[str], config_path, trusted: bool) -> None:
    """`RunFolderError` when the config read from a run folder (``config_path``) names code the
    user neither trusted (``trusted``: ``--trust-run-config``) nor named again in ``overrides``."""
    if trusted:
        return
    from tokenflow.config.loading import parse_overrides

    found = code_keys(cfg, set(parse_overrides(overrides)))
    if found:
        key = found[0].split(" ", 1)[0]
        raise RunFolderError(f"{config_path} names code to import and run: {'; '.join(found)}; a run folder's "
                             f"config runs no code unless you say so: pass {TRUST_FLAG} if you trust this folder, "
                             f"or name it yourself (--{key} VALUE)")

"""The command-line reference page, generated from the parsers and the config's field docs.

    python -m tokenflow.cli.reference > cli.md

The docs site builds it on every build (``docs/hooks/cli_reference.py``), so the page cannot
drift from the code: a key's documentation lives only under its field.
"""

from __future__ import annotations

import argparse
import sys


def _commands_markdown() -> list[str]:
    from tokenflow.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions  # noqa: SLF001 - argparse lists subcommands nowhere public
               if isinstance(a, argparse._SubParsersAction))
    out = ["## Commands", ""]
    for name, p in sub.choices.items():
        p.prog = f"tokenflow {name}"
        p.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=96)
        out += [f"### `tokenflow {name}`", "", "```text", p.format_help().rstrip(), "```", ""]
    return out


def _config_markdown() -> list[str]:
    from tokenflow.config.loading import describe_fields, load_config
    from tokenflow.config.presets import DEFAULT_PRESET
    from tokenflow.config.root import TrainConfig

    preset = load_config(TrainConfig, None, preset=DEFAULT_PRESET)
    rows = describe_fields(TrainConfig, resolved=preset)
    out = ["## Config keys", "",
           "Every key of a training config, by section: the library default (what a file that names no "
           f"preset starts from), the value under the preset `{DEFAULT_PRESET}` where it differs (what "
           "`tokenflow train` with no file runs), and the key's documentation. Set a key in the "
           "file's `[section]` or as `--section.key VALUE`.", ""]
    section = None
    for key, value, default, doc in rows:
        head = key.split(".", 1)[0]
        if head != section:
            section = head
            doc_of_section = (TrainConfig.model_fields[head].description or "").strip()
            out += [f"### `[{head}]`", "", doc_of_section, "",
                    f"| key | default | `{DEFAULT_PRESET}` | |", "|---|---|---|---|"]
        cell = " ".join(doc.split()).replace("|", "\\|")
        shown = "" if value == default else f"`{value}`"
        out.append(f"| `{key}` | `{default}` | {shown} | {cell} |")
    return out + [""]


def markdown() -> str:
    lines = ["# Command line and config keys", "",
             "Generated from the command-line parsers and the config's field documentation "
             "(`python -m tokenflow.cli.reference`).", ""]
    return "\n".join(lines + _commands_markdown() + _config_markdown())


if __name__ == "__main__":
    sys.stdout.write(markdown())

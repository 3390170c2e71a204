"""MkDocs hook: add reference/cli.md, generated from tokenflow's parsers and config field docs."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

SRC = Path(__file__).resolve().parents[2] / "src"


def on_files(files, config):
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from tokenflow.cli.reference import markdown

    files.append(File.generated(config, "reference/cli.md", content=markdown()))
    return files

"""Print this project's requirements and those of the named extras, one a line, read from
pyproject.toml: an environment built in two steps (its packages first, beside other work, then
the checkout itself) installs them without this checkout, whose editable build writes into the
source tree (scripts/vllm_cpu_env.sh, scripts/tinker_env.sh, their ``deps`` step; .ci/run).

    python3 scripts/requirements_of.py vllm-cpu real
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
extras = project["optional-dependencies"]
unknown = [name for name in sys.argv[1:] if name not in extras]
if unknown:
    sys.exit(f"no extra named {', '.join(unknown)} in pyproject.toml; its extras: {', '.join(extras)}")
print("\n".join([*project["dependencies"], *(r for name in sys.argv[1:] for r in extras[name])]))

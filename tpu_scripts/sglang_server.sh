#!/usr/bin/env bash
# Serves an HF folder with SGLang on a GPU host: the production rollout engine of DESIGN.md §6b, which the agent
# loop reaches through osvl_jax.rollout.remote.sglang_client.SGLangEngine (export the policy with osvl_jax.export_hf).
#
#   tpu_scripts/sglang_server.sh --model_path=/ckpt/hf [--tp_size=1] [--mem_fraction_static=0.85]
#       [--host=0.0.0.0] [--port=30000] [--context_length=N] [--weight_version=V]
#       [--router_port=30100 [--worker_urls=http://h1:30000,http://h2:30000]]
#       [--venv=~/sglang_venv] [--sglang_spec=sglang==0.5.23] [--skip_setup] [--dry_run] [-- EXTRA SERVER FLAGS]
#
# 1. Setup (skipped by --skip_setup): a venv of its own (SGLang pins torch/transformers versions of its own, so it
#    never shares the project's .venv) with SGLang at the version tests/serve/sglang_schema.json records, and the
#    sglang-router of setup.py. 0.5.23's base package has everything the server needs; its [all] extra only adds
#    the diffusion, tracing and http2 stacks (pass --sglang_spec='sglang[all]==0.5.23' to have them anyway).
# 2. `python -m sglang.launch_server --model-path ... --tp-size ... --mem-fraction-static ... --host --port`, with
#    SGLANG_MM_AVOID_RETOKENIZE=1: for a pre-tokenized request with images, SGLang 0.5.23 then keeps the sent
#    input_ids verbatim and only expands each <|image_pad|> into the image's features
#    (srt/multimodal/processors/base_processor.py, process_and_combine_mm_data -> _expand_input_ids); off, it
#    decodes the ids and re-tokenizes the text (retokenization drift, sgl-project/sglang#26555). 0.5.23 defaults
#    it on (srt/environ.py); the script sets it so that a host environment cannot turn it off. The client checks
#    every answer's meta_info.prompt_tokens against the context it sent.
#    And SGLANG_RETURN_ORIGINAL_LOGPROB=0 (0.5.23's default, set so that a host environment cannot turn it on):
#    SGLang (srt/layers/sampler.py) then returns, for a sampled request, the log-probs of the distribution it
#    sampled from, log_softmax(logits / temperature), which is what the trainer recomputes at grpo.temperature
#    (policy.loss_logprobs) and what osvl_jax.serve and JaxSampler report; =1 would return temperature-1
#    log-probs and make every ratio at a rollout temperature other than 1 compare two distributions.
#    No flag is needed to keep vision ids out of sampling: the client sends sampling_params.logit_bias (native in
#    0.5.23, added to the logits before sampling), not a custom_logit_processor (which would need
#    --enable-custom-logit-processor).
# 3. With --router_port: the server runs in the background (log: server.log beside the venv), the script waits
#    for its /health, then runs `python -m sglang_router.launch_router --worker-urls ...` (this server plus
#    --worker_urls, round robin) in the foreground. Without it the server runs in the foreground.
#
# --dry_run prints every command (one per line, shell-quoted) instead of running it.
set -euo pipefail

SGLANG_SPEC_DEFAULT="sglang==0.5.23"   # = tests/serve/sglang_schema.json's sglang_version
ROUTER_SPEC="sglang-router==0.3.2"     # = setup.py's pin

model_path=""
tp_size=1
mem_fraction_static=0.85
host="0.0.0.0"
port=30000
context_length=""
weight_version=""
router_port=""
worker_urls=""
venv="${HOME}/sglang_venv"
sglang_spec="$SGLANG_SPEC_DEFAULT"
python="${PYTHON:-python3}"
skip_setup=0
dry_run=0
extra=()

usage() {
  sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

die() {
  echo "sglang_server.sh: $*" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --model_path=*) model_path="${1#*=}" ;;
    --tp_size=*) tp_size="${1#*=}" ;;
    --mem_fraction_static=*) mem_fraction_static="${1#*=}" ;;
    --host=*) host="${1#*=}" ;;
    --port=*) port="${1#*=}" ;;
    --context_length=*) context_length="${1#*=}" ;;
    --weight_version=*) weight_version="${1#*=}" ;;
    --router_port=*) router_port="${1#*=}" ;;
    --worker_urls=*) worker_urls="${1#*=}" ;;
    --venv=*) venv="${1#*=}" ;;
    --sglang_spec=*) sglang_spec="${1#*=}" ;;
    --skip_setup) skip_setup=1 ;;
    --dry_run) dry_run=1 ;;
    -h | --help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (SGLang server flags go after --, e.g. -- --context-length 32768)" ;;
  esac
  shift
done

[[ -n "$model_path" ]] || die "--model_path is required (an HF folder: config.json + safetensors)"
[[ "$tp_size" =~ ^[1-9][0-9]*$ ]] || die "--tp_size must be a positive integer, got '$tp_size'"
[[ "$port" =~ ^[0-9]+$ ]] || die "--port must be an integer, got '$port'"
[[ -z "$router_port" || "$router_port" =~ ^[0-9]+$ ]] || die "--router_port must be an integer, got '$router_port'"
[[ -z "$worker_urls" || -n "$router_port" ]] || die "--worker_urls needs --router_port"
[[ "$mem_fraction_static" =~ ^0?\.[0-9]+$ ]] || die "--mem_fraction_static must be in (0, 1), got '$mem_fraction_static'"
if [[ "$dry_run" == 0 && ! -f "$model_path/config.json" ]]; then
  die "--model_path=$model_path has no config.json (export one with python -m osvl_jax.export_hf)"
fi

# One word as the shell reads it: bare when plain, else single-quoted.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf '%s' "${1@Q}"
  fi
}

# Runs a command, or prints it (shell-quoted, one line) under --dry_run.
run() {
  if [[ "$dry_run" == 1 ]]; then
    local arg line=""
    for arg in "$@"; do
      line+="$(quote "$arg") "
    done
    echo "${line% }"
  else
    "$@"
  fi
}

py="$venv/bin/python"
if [[ "$skip_setup" == 0 ]]; then
  if [[ "$dry_run" == 1 || ! -x "$py" ]]; then
    run "$python" -m venv "$venv"
  fi
  run "$py" -m pip install -q --upgrade pip
  run "$py" -m pip install -q "$sglang_spec" "$ROUTER_SPEC"
fi

server=(env SGLANG_MM_AVOID_RETOKENIZE=1 SGLANG_RETURN_ORIGINAL_LOGPROB=0 "$py" -m sglang.launch_server --model-path "$model_path"
  --tp-size "$tp_size" --mem-fraction-static "$mem_fraction_static" --host "$host" --port "$port")
if [[ -n "$context_length" ]]; then
  server+=(--context-length "$context_length")
fi
if [[ -n "$weight_version" ]]; then
  server+=(--weight-version "$weight_version")
fi
server+=("${extra[@]}")

if [[ -z "$router_port" ]]; then
  run "${server[@]}"
  exit 0
fi

# The router reaches this server on its own address (0.0.0.0 is a bind address, not a destination).
local_host="$host"
if [[ "$host" == "0.0.0.0" ]]; then
  local_host="127.0.0.1"
fi
workers=("http://${local_host}:${port}")
if [[ -n "$worker_urls" ]]; then
  IFS=',' read -r -a more <<<"$worker_urls"
  workers+=("${more[@]}")
fi
router=("$py" -m sglang_router.launch_router --host "$host" --port "$router_port" --policy round_robin
  --worker-urls "${workers[@]}")

log="$(dirname "$venv")/server.log"
if [[ "$dry_run" == 1 ]]; then
  run "${server[@]}"
  run "${router[@]}"
  exit 0
fi
"${server[@]}" >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT
echo "sglang_server.sh: server pid $server_pid, log $log; waiting for http://${local_host}:${port}/health"
until curl -sf "http://${local_host}:${port}/health" >/dev/null; do
  kill -0 "$server_pid" 2>/dev/null || die "the server exited; see $log"
  sleep 5
done
"${router[@]}"

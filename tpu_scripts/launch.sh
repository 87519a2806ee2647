#!/usr/bin/env bash
# Runs a training entry point on a Cloud TPU VM (one host or a multi-host pod slice) with gcloud.
#
#   tpu_scripts/launch.sh [run] --name=NAME --zone=ZONE [--project=P] [--accelerator_type=v5p-32]
#       [--runtime_version=tpu-ubuntu2204-base] [--queued_resource] [--spot | --best_effort]
#       [--entry=osvl_jax.train.sft] --config=configs/qwen3vl_paper.py:sft_8b --workdir=gs://BUCKET/run
#       [--data_dir=DIR] [--env=KEY=VALUE ...] [--skip_setup] [--dry_run] [-- --config.sft.lr=1e-5 ...]
#   tpu_scripts/launch.sh logs   --name=NAME --zone=ZONE [--worker=0|all]   # stream the job's log
#   tpu_scripts/launch.sh stop   --name=NAME --zone=ZONE                    # stop the job on every worker
#   tpu_scripts/launch.sh delete --name=NAME --zone=ZONE [--queued_resource] # release the TPU
#
# `run` creates the TPU VM (or a queued resource, then waits until it is ACTIVE) unless it exists, copies this
# working tree to every worker (tarball; .venv, .git and workdir/ left out), runs tpu_scripts/setup.sh there
# (venv + pinned jax[tpu]), and starts `python -m ENTRY --config=CONFIG --workdir=WORKDIR [overrides]` on all
# workers at once, detached, logging to ~/osvl_jax/run.log. Every worker gets OSVL_DISTRIBUTED=auto, so each
# entry point calls jax.distributed.initialize() (osvl_jax/distributed.py) and JAX finds the pod's hosts.
# Use a gs:// workdir on a pod: every host writes its checkpoint shards there, process 0 the metrics.
#
# --dry_run prints every command (one per line, shell-quoted) instead of running it; it assumes the TPU does not
# exist yet, so the creation commands are printed too. GCLOUD=/path/to/gcloud overrides the gcloud binary.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GCLOUD="${GCLOUD:-gcloud}"
# shellcheck disable=SC2088  # the tilde is expanded by the workers' shell, not here
REMOTE_DIR='~/osvl_jax'
TARBALL="${OSVL_TARBALL:-/tmp/osvl_jax_src.tar.gz}"  # local and remote path of the copy

action=run
name="${TPU_NAME:-}"
zone="${TPU_ZONE:-}"
project=""
accelerator_type="v5p-8"
runtime_version="tpu-ubuntu2204-base"
queued_resource=0
provisioning=""
entry="osvl_jax.train.sft"
config=""
workdir=""
data_dir=""
worker="0"
skip_setup=0
dry_run=0
envs=()
overrides=()

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

die() {
  echo "launch.sh: $*" >&2
  exit 2
}

if [[ $# -gt 0 && "$1" != -* ]]; then
  action="$1"
  shift
fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name=*) name="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --accelerator_type=*) accelerator_type="${1#*=}" ;;
    --runtime_version=*) runtime_version="${1#*=}" ;;
    --queued_resource) queued_resource=1 ;;
    --spot) provisioning="--spot" ;;
    --best_effort) provisioning="--best-effort" ;;
    --entry=*) entry="${1#*=}" ;;
    --config=*) config="${1#*=}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --data_dir=*) data_dir="${1#*=}" ;;
    --env=*) envs+=("${1#*=}") ;;
    --worker=*) worker="${1#*=}" ;;
    --skip_setup) skip_setup=1 ;;
    --dry_run) dry_run=1 ;;
    -h | --help) usage 0 ;;
    --) shift; overrides=("$@"); break ;;
    --config.*) overrides+=("$1") ;;
    *) die "unknown argument '$1' (entry point overrides go after --, e.g. -- --config.sft.lr=1e-5)" ;;
  esac
  shift
done

[[ -n "$name" ]] || die "--name is required (or TPU_NAME)"
[[ -n "$zone" ]] || die "--zone is required (or TPU_ZONE)"
[[ "$provisioning" != "--best-effort" || "$queued_resource" == 1 ]] || die "--best_effort needs --queued_resource"

scope=(--zone="$zone")
if [[ -n "$project" ]]; then
  scope+=(--project="$project")
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

# True when the command succeeds; under --dry_run prints it and answers false (the resource is assumed absent).
probe() {
  if [[ "$dry_run" == 1 ]]; then
    run "$@"
    return 1
  fi
  "$@" >/dev/null 2>&1
}

tpu_ssh() {  # tpu_ssh WORKER COMMAND
  run "$GCLOUD" compute tpus tpu-vm ssh "$name" "${scope[@]}" --worker="$1" --command="$2"
}

ensure_tpu() {
  if [[ "$queued_resource" == 1 ]]; then
    if ! probe "$GCLOUD" compute tpus queued-resources describe "$name" "${scope[@]}"; then
      local create=("$GCLOUD" compute tpus queued-resources create "$name" --node-id="$name" "${scope[@]}"
                    --accelerator-type="$accelerator_type" --runtime-version="$runtime_version")
      if [[ -n "$provisioning" ]]; then
        create+=("$provisioning")
      fi
      run "${create[@]}"
    fi
    local state_cmd=("$GCLOUD" compute tpus queued-resources describe "$name" "${scope[@]}"
                     --format='value(state.state)')
    if [[ "$dry_run" == 1 ]]; then
      run "${state_cmd[@]}"
      return
    fi
    local state
    while state="$("${state_cmd[@]}")"; [[ "$state" != ACTIVE ]]; do
      case "$state" in
        FAILED | SUSPENDED) die "queued resource $name is $state" ;;
      esac
      echo "launch.sh: queued resource $name is ${state:-unknown}; waiting for ACTIVE" >&2
      sleep 30
    done
  else
    if ! probe "$GCLOUD" compute tpus tpu-vm describe "$name" "${scope[@]}"; then
      local create=("$GCLOUD" compute tpus tpu-vm create "$name" "${scope[@]}"
                    --accelerator-type="$accelerator_type" --version="$runtime_version")
      if [[ -n "$provisioning" ]]; then
        create+=("$provisioning")
      fi
      run "${create[@]}"
    fi
  fi
}

copy_project() {
  run tar -czf "$TARBALL" -C "$REPO" --exclude=./.venv --exclude=./.git --exclude=./workdir \
    --exclude='__pycache__' --exclude=./osvl_jax.egg-info .
  run "$GCLOUD" compute tpus tpu-vm scp "$TARBALL" "$name:$TARBALL" "${scope[@]}" --worker=all
  local setup="mkdir -p $REMOTE_DIR && tar -xzf $TARBALL -C $REMOTE_DIR"
  if [[ "$skip_setup" == 0 ]]; then
    setup+=" && bash $REMOTE_DIR/tpu_scripts/setup.sh"
  fi
  tpu_ssh all "$setup"
}

start_job() {
  [[ -n "$config" ]] || die "--config is required"
  [[ -n "$workdir" ]] || die "--workdir is required (a gs:// URL on a multi-host TPU)"
  local vars=(OSVL_DISTRIBUTED=auto PYTHONUNBUFFERED=1)
  if [[ -n "$data_dir" ]]; then
    vars+=(OSVL_DATA_DIR="$data_dir")
  fi
  vars+=("${envs[@]}")
  local arg job=""
  for arg in env "${vars[@]}" .venv/bin/python -m "$entry" --config="$config" --workdir="$workdir" \
      "${overrides[@]}"; do
    job+="$(quote "$arg") "
  done
  # setsid: the job outlives the ssh session and leads its own process group (run.pid), which `stop` ends.
  tpu_ssh all "cd $REMOTE_DIR && (setsid nohup ${job% } > run.log 2>&1 < /dev/null & echo \$! > run.pid)"
  if [[ "$dry_run" == 0 ]]; then
    echo "launch.sh: started $entry on every worker of $name; logs: $0 logs --name=$name --zone=$zone" >&2
  fi
}

case "$action" in
  run)
    [[ -n "$config" ]] || die "--config is required"
    [[ -n "$workdir" ]] || die "--workdir is required (a gs:// URL on a multi-host TPU)"
    ensure_tpu
    copy_project
    start_job
    ;;
  logs)
    tpu_ssh "$worker" "tail -n +1 -F $REMOTE_DIR/run.log"
    ;;
  stop)
    tpu_ssh all "cd $REMOTE_DIR && if [ -f run.pid ]; then kill -TERM -- -\$(cat run.pid) 2>/dev/null || true; rm -f run.pid; fi"
    ;;
  delete)
    if [[ "$queued_resource" == 1 ]]; then
      run "$GCLOUD" compute tpus queued-resources delete "$name" "${scope[@]}" --force --quiet
    else
      run "$GCLOUD" compute tpus tpu-vm delete "$name" "${scope[@]}" --quiet
    fi
    ;;
  *) die "unknown command '$action' (run, logs, stop, delete)" ;;
esac

#!/usr/bin/env bash
# Issue 22's GPU check, one call on the lent device machine (one NVIDIA H200), about 7.5 minutes (parts: speed ~3,
# flags ~1.5, compile ~2.7; DEVICE_CHECK_PARTS picks a subset, default all three):
#   speed:   bench/step_speed.py at the real Qwen3-VL-8B decoder layer sizes (hidden 4096, 32 heads / 8 kv heads of
#            128, SwiGLU 12288, vocabulary 151,936), bf16, each layer rematerialised, layers under scan, one
#            8,192-token row, 16 of the 36 layers (the HF reference model is initialised on the CPU, which bounds
#            the layers that fit the time): JAX with the blockwise XLA attention and with cuDNN flash attention,
#            and PyTorch (SDPA), alternating, with the bf16 8192^3 matmul rate of both (a chain of 8 products per
#            call) as the reference;
#   flags:   the same JAX steps alone under MaxText's single-GPU XLA flags (cuBLAS instead of Triton GEMMs, the
#            latency-hiding scheduler);
#   compile: bench/compile_count.py on the GPU (programs per SFT step, GRPO update and sampler call over batches
#            of random image grids).
# Run from the repository root on the device machine (its image has jax[cuda], torch, transformers, flax, optax,
# orbax): `bash bench/device_check.sh`; results in $OUT (default /tmp/device_check).
# What its image lacks comes with the call: the wheels of ml_collections, json-repair, tensorboardX, dill and
# opentelemetry-api in .devwheels/ (`pip download --no-deps`), and the Qwen tokenizer (for compile_count) in
# .devdata/qwen/tokenizer (a copy of $OSVL_DATA_DIR/qwen/tokenizer); both folders are git-ignored and carried.
set -uo pipefail
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # the project is not installed there
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}  # the rest for PyTorch
if compgen -G '.devwheels/*.whl' > /dev/null; then
  python3 -m pip install -q --no-deps .devwheels/*.whl 2>&1 | tail -2
fi
export OSVL_DATA_DIR=${OSVL_DATA_DIR:-$PWD/.devdata}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import jax, torch, transformers, flax; print("jax", jax.__version__, jax.devices(), "torch", torch.__version__, "transformers", transformers.__version__, "flax", flax.__version__)'
} 2>&1 | tee "$OUT/machine.txt"

PARTS=${DEVICE_CHECK_PARTS:-speed flags compile}
STEP_ARGS=(--tokens 8192 --vocab 151936 --hidden 4096 --layers 16 --heads 32 --kv_heads 8 --head_dim 128
           --intermediate 12288 --dtype bfloat16 --matmul 8192 --matmul_chain 8 --repeats 5 --scan_layers --remat
           --attention_block 1024)
if [[ " $PARTS " == *" speed "* ]]; then
  timeout 360 python3 bench/step_speed.py "${STEP_ARGS[@]}" --attention blockwise,cudnn 2>&1 | grep -v -i warn \
    | tee "$OUT/step_speed_8b_layers.txt"
fi
if [[ " $PARTS " == *" flags "* ]]; then   # MaxText's single-GPU XLA flags, JAX alone
  XLA_FLAGS="--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_latency_hiding_scheduler=true" \
    timeout 200 python3 bench/step_speed.py "${STEP_ARGS[@]}" --attention cudnn,blockwise --no_torch 2>&1 \
    | grep -v -i warn | tee "$OUT/step_speed_8b_layers_xla_flags.txt"
fi
if [[ " $PARTS " == *" compile "* ]]; then
  timeout 240 python3 bench/compile_count.py --n 3 --seed 1 2>&1 | grep -v -i warn | tee "$OUT/compile_count.txt"
fi

#!/usr/bin/env bash
# What a TPU VM worker installs (run by launch.sh on every worker, from the copied project folder):
# a Python venv in .venv with the project (`pip install -e .`), jax with its TPU runtime at the project's pinned
# version (gcsfs for gs:// workdirs comes pinned with the project), and the CPU build of
# torch (the image processor and HF reference need it; the default wheel would pull CUDA). Idempotent: a rerun
# only checks the pins.
#
#   bash tpu_scripts/setup.sh            # PYTHON=python3.11 to choose the interpreter
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
JAX_VERSION=0.10.2          # = setup.py's jax pin; jax[tpu] adds the matching libtpu
TORCH_VERSION=2.13.0        # = setup.py's torch pin
OPENCV_VERSION=5.0.0.93     # = the Makefile's opencv-contrib-python-headless reinstall
PIP=(.venv/bin/python -m pip install -q)

if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
"${PIP[@]}" -e . "jax[tpu]==${JAX_VERSION}"
# rapidocr pulls opencv-python-headless, whose cv2 would shadow the contrib build (SIFT, dnn_superres).
"${PIP[@]}" --force-reinstall --no-deps "opencv-contrib-python-headless==${OPENCV_VERSION}"
.venv/bin/python -c 'import jax, jaxlib; print(f"setup.sh: jax {jax.__version__}, jaxlib {jaxlib.__version__}")'

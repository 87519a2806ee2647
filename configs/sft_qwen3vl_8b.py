"""Qwen3-VL-8B: the paper's SFT run on the expert trajectories
(lr 2e-5, 8 epochs, 32k context, images <= 262,144 pixels).

Settings: configs/qwen3vl_paper.py (what the paper fixes, what is chosen here). Set the placeholders:
model.hf_path (the released Qwen3-VL-8B-Instruct folder), data.dir.

Run on a v5p-64 slice (config.tpu; mesh in config.mesh):
  tpu_scripts/launch.sh --name=osvl-8b --zone=ZONE --accelerator_type=v5p-64 \
      --entry=osvl_jax.train.sft --config=configs/sft_qwen3vl_8b.py --workdir=gs://BUCKET/sft_qwen3vl_8b \
      -- --config.model.hf_path=/path/to/Qwen3-VL-8B-Instruct --config.data.dir=/path/to/osvl_data
  What launch.sh starts on every host:
  python -m osvl_jax.train.sft --config=configs/sft_qwen3vl_8b.py --workdir=gs://BUCKET/sft_qwen3vl_8b
Memory plan per chip (shapes only, no weights; `--compile` also compiles the step on the local devices):
  python -m osvl_jax.plan --config=configs/sft_qwen3vl_8b.py [--chip=v5p]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # configs/: the shared paper settings
import qwen3vl_paper  # noqa: E402  pylint: disable=g-import-not-at-top


def get_config():
  return qwen3vl_paper.get_config('sft', '8b')

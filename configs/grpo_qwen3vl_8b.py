"""Qwen3-VL-8B: the paper's fatal-aware GRPO run
(lr 1e-6, G = 8, 256 prompts/step in mini-batches of 64, clip (0.2, 0.28), beta 0, 4,096 new tokens x up to 50 calls).

Settings: configs/qwen3vl_paper.py (what the paper fixes, what is chosen here). Set the placeholders:
model.hf_path (the released Qwen3-VL-8B-Instruct folder), data.dir, grpo.init_from (the SFT workdir), and the
judge's endpoint judge.base_url / judge.model (the paper's LLM judges; GRPO refuses to start without them).

Run on a v5p-64 slice (config.tpu; mesh in config.mesh):
  tpu_scripts/launch.sh --name=osvl-8b --zone=ZONE --accelerator_type=v5p-64 \
      --entry=osvl_jax.train.grpo --config=configs/grpo_qwen3vl_8b.py --workdir=gs://BUCKET/grpo_qwen3vl_8b \
      -- --config.model.hf_path=/path/to/Qwen3-VL-8B-Instruct --config.data.dir=/path/to/osvl_data \
      --config.grpo.init_from=gs://BUCKET/sft_qwen3vl_8b \
      --config.judge.base_url=http://JUDGE_HOST:PORT/v1 --config.judge.model=JUDGE_MODEL
  What launch.sh starts on every host:
  python -m osvl_jax.train.grpo --config=configs/grpo_qwen3vl_8b.py --workdir=gs://BUCKET/grpo_qwen3vl_8b
Memory plan per chip (shapes only, no weights; `--compile` also compiles the step on the local devices):
  python -m osvl_jax.plan --config=configs/grpo_qwen3vl_8b.py [--chip=v5p]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # configs/: the shared paper settings
import qwen3vl_paper  # noqa: E402  pylint: disable=g-import-not-at-top


def get_config():
  return qwen3vl_paper.get_config('grpo', '8b')

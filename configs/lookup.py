"""The lookup world (DESIGN.md §6b, "Learning testbed"): a tiny random-init Qwen3-VL learns a multimodal tool task by
SFT, then GRPO raises its accuracy under injected tool failures, through the same trainers as the paper's runs.

Run (each stage resumable; bench/learning_world.py runs all of them and the Table 3b comparison):
  .venv/bin/python -m data_pipeline.lookup_world --config=configs/lookup.py --workdir=W
  .venv/bin/python -m osvl_jax.train.sft --config=configs/lookup.py --workdir=W
  .venv/bin/python -m osvl_jax.train.grpo --config=configs/lookup.py --workdir=W
Variants: `configs/lookup.py:hops=2` (two dependent lookups: post-failure tokens after a recoverable prefix, where
`mask` and `mask_clamp` differ).

The model: 4 layers of width 64 with the compact vocabulary (`model.vocab='dataset'`: only the ~300 Qwen ids the world
uses, `data/vocab_ids.json`). Expected (BENCHMARKS.md, "Learning"): after SFT, greedy accuracy >= 0.9 without
failures; GRPO (mask_clamp) raises held-out greedy accuracy under 30% failures by learning to retry.
"""

import importlib.util
import os

import ml_collections

from data_pipeline import lookup_world

_HERE = os.path.dirname(os.path.abspath(__file__))


def _demo() -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location('osvl_configs_demo', os.path.join(_HERE, 'demo.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  """`arg`: '' (1 hop) or 'hops=2'."""
  options = dict(kv.split('=', 1) for kv in arg.split(',') if kv)
  unknown = set(options) - {'hops'}
  if unknown:
    raise ValueError(f'configs/lookup.py:{arg}: unknown option(s) {sorted(unknown)}; expected hops=1|2')
  hops = int(options.get('hops', 1))
  c = _demo()
  c.image.min_pixels = 64 * 64
  c.image.max_pixels = 64 * 64
  c.data = lookup_world.default_config()
  c.data.hops = hops
  # 2400 SFT items (~225 with a retry): at 600 (58 retries) the SFT policy copied the day right in only ~62% of its
  # retries, so GRPO's retry lever could not pay (BENCHMARKS.md, "Learning").
  c.data.sft_items = 2400
  c.data.min_pixels = c.image.get_ref('min_pixels')
  c.data.max_pixels = c.image.get_ref('max_pixels')
  c.data.seed = c.get_ref('seed')
  c.data.system_prompt = c.get_ref('system_prompt')

  c.model.text = ml_collections.ConfigDict({'num_hidden_layers': 4, 'rope_theta': 10_000.0})
  c.model.vocab = 'dataset'

  c.tools = ml_collections.ConfigDict(lookup_world.tool_config(c.data, failure_rate=0.0))
  c.tools.lookup.seed = c.get_ref('seed')

  c.rollout.max_turns = 3 * hops * 3 + 1
  c.rollout.max_new_tokens = 48
  c.rollout.max_total_tokens = 1024
  c.rollout.prefix_cache_slots = 0

  c.sft.steps = 1200   # 4 epochs of the 2400 items; 600 left key copy and accuracy at 0.9 / 0.8
  c.sft.batch_size = 8
  c.sft.lr = 3e-3
  c.sft.warmup_steps = c.sft.get_ref('steps') // 20
  c.sft.length_buckets = (512, 1024)
  c.sft.log_every = 20
  c.sft.ckpt_every = 200

  c.eval.num_prompts = 40
  c.eval.temperature = 0.0

  g = c.grpo
  g.steps = 40
  g.prompts_per_step = 4
  g.num_generations = 8
  g.lr = 5e-4
  g.lr_schedule = 'constant'
  g.temperature = 1.0
  g.top_p = 1.0
  g.length_buckets = (512, 1024)
  g.max_loss_tokens = 0
  g.loss_bucket = 64
  g.ckpt_every = 40
  return c

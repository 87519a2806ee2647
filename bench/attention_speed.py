"""Dense vs blockwise causal attention on CPU: kernel (one layer's attention) and tiny-model train step.

  .venv/bin/python bench/attention_speed.py [--batch 4] [--length 3072] [--blocks 64,128,256] [--repeats 3]
      [--num-loss 256] [--skip-kernel]

Shapes follow `Qwen3VLConfig.tiny()` (Hkv=2, G=2, D=16). Variants are timed interleaved (round robin) so load from
other processes on a shared machine hits them alike; the minimum over repeats is printed, plus compile time.
Feeds BENCHMARKS.md, "Attention, CPU".
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from osvl_jax.models.qwen3_vl import attention
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rl import losses
from osvl_jax.trajectory import tokens as tokens_lib


def _run(fn, args):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0


def _race(named, repeats):
  """named: {name: (jitted fn, args)} -> {name: (compile+first run s, min s)}; timed round robin."""
  first = {n: _run(f, a) for n, (f, a) in named.items()}
  best = {n: float('inf') for n in named}
  for _ in range(repeats):
    for n, (f, a) in named.items():
      best[n] = min(best[n], _run(f, a))
  return {n: (first[n], best[n]) for n in named}


def _report(title, results):
  base = results['dense'][1]
  print(f'\n{title}')
  for n, (first, best) in results.items():
    print(f'  {n:14s} {best:7.3f} s   (x{base / best:5.2f})   first call incl. compile {first:6.2f} s', flush=True)


def kernel_bench(b, t, blocks, repeats):
  kv, g, d = 2, 2, 16
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((b, t, kv, g, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, t, kv, d)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((b, t, kv, d)), jnp.float32)
  lengths = np.linspace(t, t // 2, b).astype(int)
  key_mask = jnp.asarray(np.arange(t)[None] < lengths[:, None])       # right padding

  def dense(q, k, v, km):
    return attention.dense_attention(q, k, v, jnp.tril(jnp.ones((t, t), bool))[None] & km[:, None, :])

  fns = {'dense': dense}
  for blk in blocks:
    fns[f'blockwise{blk}'] = (lambda blk: lambda q, k, v, km: attention.causal_attention(q, k, v, km, blk))(blk)
  args = (q, k, v, key_mask)
  _report(f'attention kernel forward  [B={b}, T={t}, Hkv={kv}, G={g}, D={d}]',
          _race({n: (jax.jit(f), args) for n, f in fns.items()}, repeats))

  def grad_of(f):
    return jax.jit(jax.grad(lambda q, k, v, km: jnp.sum(f(q, k, v, km) ** 2), argnums=(0, 1, 2)))
  _report('attention kernel forward+backward', _race({n: (grad_of(f), args) for n, f in fns.items()}, repeats))


def model_bench(b, t, blocks, repeats, num_loss=256):
  config = Qwen3VLConfig.tiny()
  rng = np.random.default_rng(0)
  lengths = np.linspace(t, t // 2, b).astype(int)
  mask = np.arange(t)[None] < lengths[:, None]
  batch = {
      'input_ids': jnp.asarray(np.where(mask, rng.integers(0, 151000, (b, t)), tokens_lib.ENDOFTEXT_ID), jnp.int32),
      'attention_mask': jnp.asarray(mask),
      'position_ids': jnp.asarray(rope.text_position_ids(np.zeros(b, np.int64), t)),
      'loss_positions': jnp.asarray(np.sort(rng.integers(0, t // 2 - 1, (b, num_loss)), axis=1), jnp.int32),
      'loss_targets': jnp.asarray(rng.integers(0, 151000, (b, num_loss)), jnp.int32),
      'completion_mask': jnp.ones((b, num_loss), bool),
  }

  def loss_fn(model, batch):
    hidden, _ = model(batch['input_ids'], batch['position_ids'], batch['attention_mask'])
    gathered = jnp.take_along_axis(hidden, batch['loss_positions'][..., None], axis=1)
    logprobs = losses.token_logprobs(model.logits(gathered), batch['loss_targets'])
    return losses.sft_loss(logprobs, batch['completion_mask'])[0]

  fwd_jit = nnx.jit(loss_fn)
  grad_jit = nnx.jit(nnx.value_and_grad(loss_fn))
  variants = {'dense': ('dense', 128)}
  variants.update({f'blockwise{blk}': ('blockwise', blk) for blk in blocks})
  models = {}
  for n, (impl, blk) in variants.items():
    m = model_lib.Qwen3VLModel(config, rngs=nnx.Rngs(0))
    m.language_model.attention_impl, m.language_model.attention_block = impl, blk
    models[n] = m
  ref = float(fwd_jit(models['dense'], batch))
  for n, m in models.items():
    print(f'  loss {n:14s} {float(fwd_jit(m, batch)):.7f} (dense {ref:.7f})')
  _report(f'tiny model forward (loss)  [B={b}, T={t}]',
          _race({n: (fwd_jit, (m, batch)) for n, m in models.items()}, repeats))
  _report('tiny model train step (value_and_grad)',
          _race({n: (grad_jit, (m, batch)) for n, m in models.items()}, repeats))


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--length', type=int, default=3072)
  p.add_argument('--blocks', default='64,128,256')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--num-loss', type=int, default=256, help='loss positions per row (vocab projection)')
  p.add_argument('--skip-kernel', action='store_true')
  a = p.parse_args()
  blocks = [int(x) for x in a.blocks.split(',')]
  print(f'jax {jax.__version__}, devices {jax.devices()}')
  if not a.skip_kernel:
    kernel_bench(a.batch, a.length, blocks, a.repeats)
  model_bench(a.batch, a.length, blocks, a.repeats, a.num_loss)


if __name__ == '__main__':
  main()

"""Decode throughput of the embedded sampler on a rollout mesh vs on the training (FSDP) layout, 8 simulated devices.

  .venv/bin/python bench/rollout_sharded.py [--batch 16] [--prompt-len 128] [--new-tokens 64] [--repeats 2]
      [--tensors 2,8]

Issue 49. One random Qwen3-VL text decoder (hidden 256, 4 layers, 8 query / 8 key-value heads of 32, MLP 768, the
real 151,936-id vocabulary, untied lm_head), float32, on 8 XLA:CPU devices (the script adds
--xla_force_host_platform_device_count=8 to XLA_FLAGS when no device count is given). The same weights decode the
same random `--prompt-len`-token prompts, greedy, exactly `--new-tokens` ids per row (the end-of-sequence ids are
never sampled, a bench-only subclass), in these layouts:
  fsdp:      the weights as the trainer holds them (`sharding.shard_model` on data 1 x fsdp 8: every parameter split
             over the 8 devices), the sampler given no mesh: each decode step gathers every weight;
  tensor T:  `JaxSampler(mesh=layout.mesh_from_config({'tensor': T}))`: the weights resharded to the rollout layout
             (tensor-parallel within a replica of T devices, 8 / T replicas), the batch and the KV cache split over
             the replicas and the KV heads over 'tensor'.
Decode time excludes the prefill (`stats['decode_s']`). One untimed warm-up call per layout (2 new ids: the same
cache length, so it compiles what the timed calls run), then `--repeats` timed calls, interleaved, best kept; the
rows must be equal id for id between the layouts (greedy, same weights). The 8 devices share this machine's cores,
so the figure is the layout's overhead (gathers, resharding), not a TPU's speed. Prints per layout decode tokens/s,
ms per decode step and prefill seconds; last line `ratio_sharded_over_fsdp=<smallest over --tensors>` (issue 49's
target >= 1.5). Feeds BENCHMARKS.md, "Rollouts on a mesh".
"""

import argparse
import dataclasses
import os


def _config():
  """The bench's Qwen3VLConfig: `tiny()` with wider text layers and 8 KV heads (tensor 8 divides them)."""
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=g-import-not-at-top
  base = Qwen3VLConfig.tiny(tie_word_embeddings=False)
  text = dataclasses.replace(base.text, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=8, head_dim=32, mrope_section=(8, 4, 4))
  return dataclasses.replace(base, text=text, vision=dataclasses.replace(base.vision, out_hidden_size=256))


def main() -> None:
  parser = argparse.ArgumentParser(prog='rollout_sharded.py', description=__doc__.split('\n')[0])
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--prompt-len', type=int, default=128)
  parser.add_argument('--new-tokens', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--tensors', default='2,8', help='comma-separated tensor sizes of the rollout mesh')
  args = parser.parse_args()
  if args.new_tokens < 2:
    parser.error(f'--new-tokens must be >= 2 (decode time is measured after the first id), got {args.new_tokens}')
  if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl import model as model_lib  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl import sharding  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.embedded import jax_sampler, layout  # pylint: disable=g-import-not-at-top

  if jax.device_count() != 8:
    raise SystemExit(f'needs 8 devices, found {jax.device_count()} (XLA_FLAGS={os.environ.get("XLA_FLAGS")!r})')
  tensors = [int(t) for t in args.tensors.split(',')]

  class FullLengthSampler(jax_sampler.JaxSampler):
    never_sampled = jax_sampler.JaxSampler.never_sampled + tj.EOS_IDS  # every row emits exactly --new-tokens

  config = _config()
  model = model_lib.Qwen3VLModel(config, nnx.Rngs(0))
  tokenizer = tj.load_tokenizer()
  kw = dict(max_new_tokens=args.new_tokens, temperature=0.0, max_len=args.prompt_len + args.new_tokens,
            bucket=64, pad_batch_pow2=False)
  samplers = {'fsdp': FullLengthSampler(sharding.shard_model(nnx.clone(model), sharding.make_mesh(fsdp=8)),
                                        tokenizer, **kw)}
  for t in tensors:
    samplers[f'tensor {t}'] = FullLengthSampler(nnx.clone(model), tokenizer,
                                                mesh=layout.mesh_from_config({'tensor': t}), **kw)
  prompts = np.random.default_rng(0).integers(100, 150000, size=(args.batch, args.prompt_len)).astype(np.int32)
  n, decoded = args.new_tokens, args.new_tokens - 1

  def run(sampler, n=n):
    gens = sampler.generate([(p, []) for p in prompts], max_new_tokens=n)
    assert all(len(g.ids) == n for g in gens), [len(g.ids) for g in gens]
    return sampler.stats['prefill_s'], sampler.stats['decode_s'], [g.ids.tolist() for g in gens]

  print(f'model: hidden {config.text.hidden_size}, {config.text.num_hidden_layers} layers, '
        f'{config.text.num_key_value_heads} KV heads, vocab {config.text.vocab_size}; batch {args.batch}, prompt '
        f'{args.prompt_len}, {n} new ids; {jax.device_count()} devices; load {os.getloadavg()[0]:.2f}', flush=True)
  for sampler in samplers.values():
    run(sampler, 2)   # warm-up: compiles prefill and decode for this shape
  best = {k: (float('inf'), float('inf')) for k in samplers}
  ids = {}
  for _ in range(args.repeats):
    for name, sampler in samplers.items():
      prefill_s, decode_s, ids[name] = run(sampler)
      if decode_s < best[name][1]:
        best[name] = (prefill_s, decode_s)
  mismatched = [k for k in samplers if ids[k] != ids['fsdp']]
  if mismatched:
    raise SystemExit(f'greedy ids differ from the fsdp layout\'s: {mismatched}')
  tps = {k: args.batch * decoded / v[1] for k, v in best.items()}
  for name, (prefill_s, decode_s) in best.items():
    print(f'  {name:9s} decode {tps[name]:8.1f} tok/s  {1e3 * decode_s / decoded:7.2f} ms/step   prefill '
          f'{prefill_s:6.3f} s   x{tps[name] / tps["fsdp"]:.2f} of fsdp', flush=True)
  print(f'(load {os.getloadavg()[0]:.2f}; every layout decoded the same ids)')
  print(f'ratio_sharded_over_fsdp={min(tps[f"tensor {t}"] for t in tensors) / tps["fsdp"]:.2f}')


if __name__ == '__main__':
  main()

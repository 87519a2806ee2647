"""Decode throughput of the embedded JAX sampler vs transformers `generate` on the same small model (CPU).

  .venv/bin/python bench/sampler_speed.py [--batches 1,8,32] [--prompt-len 256] [--new-tokens 64] [--repeats 2]
      [--threads N]

One tiny random Qwen3-VL text decoder (hidden 256, 4 layers, 4 query / 2 key-value heads of 64, MLP 768) with the
real vocabulary of `qwen/configs/Qwen3-VL-8B-Instruct.config.json` (151,936 ids, untied lm_head), built as a
transformers `Qwen3VLForConditionalGeneration` (PyTorch, float32, sdpa attention, `torch.manual_seed(0)`); the
same weights go into the Flax model (`weights.load_hf_state_dict`). At each batch size both decode the same random
`--prompt-len`-token prompts, temperature-1 sampling, no top-k / top-p, exactly `--new-tokens` ids per row:
  transformers: `generate(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=N,
                 min_new_tokens=N, use_cache=True)` (min_new_tokens masks the end-of-sequence ids);
  JAX: `JaxSampler(temperature=1.0, top_p=1.0, max_new_tokens=N)` with the end-of-sequence ids added to its
       `never_sampled` ids (a bench-only subclass), the same masking.
Decode time excludes the prefill for both the same way: from the moment the first new id exists (HF: the
streamer's second `put`; JAX: `stats['prefill_s']`) to the end, for the remaining N-1 ids per row. One untimed
warm-up call per shape (2 new ids: the same cache length, so it compiles the programs the timed calls run), then
`--repeats` timed calls, interleaved, best kept. Torch and XLA get the same thread count, `--threads`, 1 by
default: on the shared 2-core dev machine (load ~4) a process gets about one core, XLA:CPU ran these dots on one
thread whatever its flags (CPU time = wall time), and torch with 2 OpenMP threads on one core was 8x slower
than with 1 (227 vs 29 ms per decode step at batch 1), which is no fair reference. The figures move with the
machine's load (printed): compare runs made under the same load. Prints per batch: decode tokens/s and ms per
decode step of each, and their ratio; last line `ratio_jax_over_hf_generate=<smallest ratio over the batch
sizes>`. Feeds BENCHMARKS.md, "Sampler vs HF `generate`".
"""

import argparse
import dataclasses
import json
import os
import time


class _FirstTokenClock:
  """A `generate` streamer that records when the first new id is out (its second `put`; the first is the prompt)."""

  def __init__(self):
    self.puts = 0
    self.first_token_at = None

  def put(self, value):  # pylint: disable=unused-argument
    self.puts += 1
    if self.puts == 2:
      self.first_token_at = time.perf_counter()

  def end(self):
    pass


def _config(data_dir):
  """The bench's Qwen3VLConfig: the 8B checkpoint's vocabulary and rope, tiny widths, tiny vision tower."""
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=g-import-not-at-top
  with open(data_dir / 'qwen' / 'configs' / 'Qwen3-VL-8B-Instruct.config.json') as f:
    real = Qwen3VLConfig.from_hf_dict(json.load(f))
  text = dataclasses.replace(real.text, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64, mrope_section=(12, 10, 10),
                             max_position_embeddings=32768)
  vision = dataclasses.replace(Qwen3VLConfig.tiny().vision, out_hidden_size=256)
  return dataclasses.replace(real, text=text, vision=vision)


def main() -> None:
  parser = argparse.ArgumentParser(prog='sampler_speed.py', description=__doc__.split('\n')[0])
  parser.add_argument('--batches', default='1,8,32', help='comma-separated batch sizes')
  parser.add_argument('--prompt-len', type=int, default=256)
  parser.add_argument('--new-tokens', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--threads', type=int, default=1, help='torch and XLA:CPU threads (see the docstring)')
  args = parser.parse_args()
  if args.new_tokens < 2:
    parser.error(f'--new-tokens must be >= 2 (decode time is measured after the first id), got {args.new_tokens}')

  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_cpu_multi_thread_eigen=true '
                             f'intra_op_parallelism_threads={args.threads}')
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl import weights  # pylint: disable=g-import-not-at-top
  from osvl_jax.paths import data_dir  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.embedded import jax_sampler  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args.threads)
  config = _config(data_dir())
  torch.manual_seed(0)
  hf_config = transformers.Qwen3VLConfig(**config.to_hf_dict())
  hf_config._attn_implementation = 'sdpa'  # pylint: disable=protected-access
  hf = transformers.Qwen3VLForConditionalGeneration(hf_config).eval()
  model = weights.load_hf_state_dict(config, {k: v.numpy() for k, v in hf.state_dict().items()})

  class FullLengthSampler(jax_sampler.JaxSampler):
    never_sampled = jax_sampler.JaxSampler.never_sampled + tj.EOS_IDS  # as HF's min_new_tokens: no end of sequence

  sampler = FullLengthSampler(model, tj.load_tokenizer(), max_new_tokens=args.new_tokens, temperature=1.0,
                              top_p=1.0, seed=0, max_len=args.prompt_len + args.new_tokens, bucket=128)
  n, decoded = args.new_tokens, args.new_tokens - 1

  def run_hf(prompts, n=n):
    clock = _FirstTokenClock()
    t0 = time.perf_counter()
    with torch.no_grad():
      out = hf.generate(input_ids=torch.tensor(prompts, dtype=torch.long),
                        attention_mask=torch.ones(prompts.shape, dtype=torch.long), do_sample=True,
                        temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n, use_cache=True,
                        pad_token_id=tj.ENDOFTEXT_ID, streamer=clock)
    t1 = time.perf_counter()
    assert out.shape == (prompts.shape[0], prompts.shape[1] + n), out.shape
    return clock.first_token_at - t0, t1 - clock.first_token_at

  def run_jax(prompts, n=n):
    gens = sampler.generate([(p, []) for p in prompts], max_new_tokens=n)
    assert all(len(g.ids) == n for g in gens), [len(g.ids) for g in gens]
    return sampler.stats['prefill_s'], sampler.stats['decode_s']

  print(f'model: hidden {config.text.hidden_size}, {config.text.num_hidden_layers} layers, vocab '
        f'{config.text.vocab_size}; prompt {args.prompt_len}, {n} new ids; {args.threads} threads; '
        f'load {os.getloadavg()[0]:.2f}', flush=True)
  ratios = []
  for batch in [int(b) for b in args.batches.split(',')]:
    prompts = np.random.default_rng(batch).integers(100, 150000, size=(batch, args.prompt_len)).astype(np.int32)
    run_hf(prompts, 2)    # warm-up (2 new ids: the same cache length, so the same compiled programs)
    run_jax(prompts, 2)   # warm-up: compiles prefill and decode for this shape
    best = {'hf': (float('inf'), float('inf')), 'jax': (float('inf'), float('inf'))}
    for _ in range(args.repeats):
      for name, fn in (('hf', run_hf), ('jax', run_jax)):
        prefill_s, decode_s = fn(prompts)
        if decode_s < best[name][1]:
          best[name] = (prefill_s, decode_s)
    tps = {k: batch * decoded / v[1] for k, v in best.items()}
    ratios.append(tps['jax'] / tps['hf'])
    for name, label in (('hf', 'transformers generate'), ('jax', 'JaxSampler')):
      prefill_s, decode_s = best[name]
      print(f'  batch {batch:3d}  {label:22s} decode {tps[name]:8.1f} tok/s  {1e3 * decode_s / decoded:7.2f} ms/step'
            f'   prefill {prefill_s:6.3f} s', flush=True)
    print(f'  batch {batch:3d}  ratio jax/hf {ratios[-1]:.2f}   (load {os.getloadavg()[0]:.2f})', flush=True)
  print(f'ratio_jax_over_hf_generate={min(ratios):.2f}')


if __name__ == '__main__':
  main()

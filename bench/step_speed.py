"""Training-step speed, JAX (Flax NNX) vs transformers (PyTorch), same small Qwen3-VL config, in one run.

Command: `.venv/bin/python bench/step_speed.py [--tokens 1024] [--vocab 16384] [--repeats 5]`
Config: text hidden 512, 4 layers, 8 heads / 4 kv heads of 64, SwiGLU 1536, vocabulary `--vocab`; vision 2 blocks
of 256; one 256-patch image (64 merged tokens) inside a `--tokens`-token sequence, batch 1, float32.
`--hidden/--layers/--heads/--kv_heads/--head_dim/--intermediate/--dtype/--matmul/--attention_block/--scan_layers/--remat`
change the size and precision
(e.g. a larger bfloat16 config on a GPU: PyTorch then runs on CUDA, JAX on its default device).
A step is forward + backward of the mean next-token cross-entropy over all positions (no optimizer update): in JAX
through the trainers' own loss path (`train.policy.loss_logprobs` + `rl.losses.sft_loss`, jitted with
`nnx.cached_partial`), in PyTorch through `Qwen3VLForConditionalGeneration(..., labels=...)` (SDPA attention).
Also times a chain of `--matmul_chain` dependent [N, N] x [N, N] products (N = `--matmul`, default 2048, in
`--dtype`) in one call in both frameworks, as the machine's reachable matmul throughput.
`--attention blockwise,cudnn` times one JAX step per attention kernel (same weights), alternating; `--no_torch`
times JAX alone (a random Flax init; for XLA-flag variants in a second process).

Prints, among others:
  step_flops_utilization=<x>   JAX step model-FLOP/s (6 * matmul params * tokens + attention) divided by the
                               faster of the two measured matmul rates (the fastest kernel of --attention)
  ratio_jax_over_torch_tokens_per_s=<y>
Best of `--repeats` after one warm-up (compile) step; the two frameworks alternate so machine noise hits both.

Sharded vs replicated (`--sharding`, no PyTorch): the trainers' SFT step (`sft.make_train_step`: forward, backward,
AdamW update) of the same config on 8 simulated devices, once on the fsdp=8 mesh with the model's rules
(parameters, Adam moments and rows sharded, as `policy.create` / `placement.shard_batch` place them) and once as
the replicated data-parallel baseline (every parameter and moment NamedSharding(mesh, P()) on every device, rows
still split 8 ways: the same code under rules that map every parameter axis to None), alternating:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python bench/step_speed.py --sharding \
      [--rows 8 --tokens 128 --repeats 3]
Prints, for each: step_s, tokens_per_s, state_mib_per_device (parameters + optimizer state on device 0), and
sharded_over_replicated_step_time.
Feeds BENCHMARKS.md, "Step speed, CPU", "Step speed, GPU" (through bench/device_check.sh) and "Sharded step" (--sharding).
"""

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from osvl_jax.models.qwen3_vl import parity
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import weights
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig, TextConfig, VisionConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel
from osvl_jax.rl import losses
from osvl_jax.train import placement, policy, sft


def bench_config(vocab: int, hidden: int = 512, layers: int = 4, heads: int = 8, kv_heads: int = 4,
                 head_dim: int = 64, intermediate: int = 1536) -> Qwen3VLConfig:
  """The benchmark's text decoder (defaults: the CPU config of the module docstring) + a 2-block vision tower."""
  half = head_dim // 2
  mrope = (half - 2 * (half * 20 // 64), half * 20 // 64, half * 20 // 64)    # (24, 20, 20) at head_dim 128
  text = TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, mrope_section=mrope,
                    bos_token_id=None, eos_token_id=None)
  vis = VisionConfig(depth=2, hidden_size=256, intermediate_size=1024, num_heads=4, out_hidden_size=hidden,
                     num_position_embeddings=256, deepstack_visual_indexes=(0,))
  return Qwen3VLConfig(text=text, vision=vis, image_token_id=vocab - 3, vision_start_token_id=vocab - 5,
                       vision_end_token_id=vocab - 4, video_token_id=vocab - 2, tie_word_embeddings=False)


def step_flops(config: Qwen3VLConfig, tokens: int, patches: int) -> float:
  """Model FLOPs of forward+backward: 6 * (matmul weights) * rows + attention (12 * T^2 * heads * head_dim / 2
  causal, per layer), for text and vision."""
  t, v = config.text, config.vision
  attn = t.hidden_size * t.head_dim * (2 * t.num_attention_heads + 2 * t.num_key_value_heads)
  mlp = 3 * t.hidden_size * t.intermediate_size
  text = 6 * tokens * (t.num_hidden_layers * (attn + mlp) + t.hidden_size * t.vocab_size)
  text += t.num_hidden_layers * 12 * tokens * tokens * t.num_attention_heads * t.head_dim / 2
  vblock = 4 * v.hidden_size ** 2 + 2 * v.hidden_size * v.intermediate_size
  merged = v.hidden_size * 4
  vis = 6 * patches * (v.patch_dim * v.hidden_size + v.depth * vblock)
  vis += 6 * (patches // 4) * (1 + len(v.deepstack_visual_indexes)) * (merged * merged + merged * v.out_hidden_size)
  vis += v.depth * 12 * patches * patches * v.hidden_size
  return float(text + vis)


def _best(fn, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def _state_mib_on_first_device(*modules) -> float:
  """MiB of the modules' arrays (parameters, optimizer state) held by device 0."""
  total = 0
  for module in modules:
    for x in jax.tree.leaves(nnx.state(module)):
      total += sum(s.data.nbytes for s in x.addressable_shards if s.device == jax.devices()[0])
  return total / 2 ** 20


def compare_sharding(args, config: Qwen3VLConfig) -> None:
  """The SFT step on the fsdp=8 mesh (rules' shardings) vs replicated data parallelism, same data, 8 devices."""
  if jax.device_count() != 8:
    raise SystemExit(f'--sharding needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), '
                     f'have {jax.device_count()}')
  mesh = sharding.mesh_from_config({'fsdp': -1})
  rng = np.random.default_rng(0)
  rows, tokens = args.rows, args.tokens
  ids = rng.integers(0, args.vocab - 10, size=(rows, tokens)).astype(np.int32)
  pos, _ = rope.get_rope_index(ids, None, image_token_id=config.image_token_id)
  batch = {'input_ids': ids, 'attention_mask': np.ones((rows, tokens), bool), 'position_ids': np.asarray(pos),
           'pixel_values': None, 'loss_positions': np.tile(np.arange(tokens - 1, dtype=np.int32), (rows, 1)),
           'loss_targets': ids[:, 1:], 'completion_mask': np.ones((rows, tokens - 1), bool)}
  replicated_rules = tuple((name, axes if name == 'batch' else None) for name, axes in sharding.LOGICAL_RULES)
  setups = {}
  for name, rules in (('sharded', sharding.LOGICAL_RULES), ('replicated', replicated_rules)):
    model = sharding.shard_model(Qwen3VLModel(config, nnx.Rngs(0), dtype=args.jdtype, param_dtype=args.jdtype),
                                 mesh, rules)
    optimizer = policy.create_optimizer(model, policy.make_tx(1e-4, 100), mesh, rules)
    step = sft.make_train_step()

    def run(model=model, optimizer=optimizer, step=step, rules=rules, placed=placement.shard_batch(batch, mesh, rules)):
      with sharding.use_mesh(mesh, rules):
        return float(step(model, optimizer, placed, ())['loss'])

    setups[name] = (run, _state_mib_on_first_device(model, optimizer))
  t0 = time.perf_counter()
  warm = {name: run() for name, (run, _) in setups.items()}  # compile
  print(f'warmup_seconds={time.perf_counter() - t0:.1f} ' + ' '.join(f'loss_{k}={v:.5f}' for k, v in warm.items()))
  times = {name: [] for name in setups}
  for _ in range(args.repeats):               # alternate, so machine noise hits both
    for name, (run, _) in setups.items():
      times[name].append(_best(run, 1))
  for name, (_, mib) in setups.items():
    best = min(times[name])
    print(f'{name}: step_s={best:.3f} tokens_per_s={rows * tokens / best:.0f} state_mib_per_device={mib:.1f}')
  print(f'sharded_over_replicated_step_time={min(times["sharded"]) / min(times["replicated"]):.3f} '
        f'rows={rows} tokens={tokens} devices={jax.device_count()} mesh={dict(mesh.shape)} dtype={args.dtype}')


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--tokens', type=int, default=1024)
  ap.add_argument('--vocab', type=int, default=16384)
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--matmul', type=int, default=2048)
  ap.add_argument('--hidden', type=int, default=512)
  ap.add_argument('--layers', type=int, default=4)
  ap.add_argument('--heads', type=int, default=8)
  ap.add_argument('--kv_heads', type=int, default=4)
  ap.add_argument('--head_dim', type=int, default=64)
  ap.add_argument('--intermediate', type=int, default=1536)
  ap.add_argument('--attention_block', type=int, default=128, help='query block of the blockwise attention')
  ap.add_argument('--attention', default='blockwise',
                  help='JAX attention kernels to time, comma-separated: blockwise, dense, cudnn (GPU)')
  ap.add_argument('--no_torch', action='store_true', help='JAX alone (random Flax init, no PyTorch step)')
  ap.add_argument('--matmul_chain', type=int, default=4, help='dependent products per timed matmul call')
  ap.add_argument('--scan_layers', action='store_true', help='JAX decoder layers under jax.lax.scan')
  ap.add_argument('--remat', action='store_true',
                  help='rematerialise each decoder layer in the backward pass (JAX: TextModel.remat; PyTorch: '
                       'gradient_checkpointing_enable)')
  ap.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'),
                  help='parameters and compute in both frameworks (and the matmul)')
  ap.add_argument('--sharding', action='store_true',
                  help='sharded (fsdp=8) vs replicated data-parallel SFT step on 8 devices, instead of JAX vs torch')
  ap.add_argument('--rows', type=int, default=8, help='batch rows of the --sharding comparison')
  args = ap.parse_args()
  config = bench_config(args.vocab, args.hidden, args.layers, args.heads, args.kv_heads, args.head_dim,
                        args.intermediate)
  jdtype = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}[args.dtype]
  if args.sharding:
    args.jdtype = jdtype
    compare_sharding(args, config)
    return
  impls = args.attention.split(',')
  for impl in impls:
    if impl not in ('blockwise', 'dense', 'cudnn'):
      raise SystemExit(f'--attention: unknown kernel {impl!r} (blockwise, dense, cudnn)')
  tdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[args.dtype]
  tdev = 'cuda' if torch.cuda.is_available() else 'cpu'
  sync = torch.cuda.synchronize if tdev == 'cuda' else (lambda: None)
  grid = np.array([[1, 16, 16]])
  patches = 256
  rng = np.random.default_rng(0)
  n_img = patches // 4
  ids = rng.integers(0, args.vocab - 10, size=(1, args.tokens))
  ids[0, 10] = config.vision_start_token_id
  ids[0, 11:11 + n_img] = config.image_token_id
  ids[0, 11 + n_img] = config.vision_end_token_id
  pixels = rng.standard_normal((patches, config.vision.patch_dim)).astype(np.float32)

  if args.no_torch:   # JAX alone: a random Flax init on the default device
    hf = None
    model = Qwen3VLModel(config, nnx.Rngs(0), dtype=jdtype, param_dtype=jdtype, scan_layers=args.scan_layers)
  else:               # same weights in both (HF random init, copied into Flax)
    hf = parity.hf_model(config)
    hf.config._attn_implementation = 'sdpa'
    hf.train()
    model = weights.load_hf_state_dict(config, {k: v.detach().numpy() for k, v in hf.state_dict().items()},
                                       dtype=jdtype, param_dtype=jdtype, scan_layers=args.scan_layers)
    if args.remat:
      hf.gradient_checkpointing_enable()
    hf.to(device=tdev, dtype=tdtype)
  pos, _ = rope.get_rope_index(ids, grid, image_token_id=config.image_token_id)

  batch = {'input_ids': jnp.asarray(ids, jnp.int32), 'position_ids': jnp.asarray(pos), 'attention_mask': None,
           'pixel_values': jnp.asarray(pixels, jdtype), 'loss_positions': jnp.arange(args.tokens - 1)[None],
           'loss_targets': jnp.asarray(ids[:, 1:], jnp.int32), 'completion_mask': jnp.ones((1, args.tokens - 1), bool)}

  def loss_fn(m, batch):
    logprobs = policy.loss_logprobs(m, dict(batch, image_grid_thw=grid))
    return losses.sft_loss(logprobs, batch['completion_mask'])[0]

  jax_steps = {}
  for i, impl in enumerate(impls):   # one model (same weights) and one compiled step per attention kernel
    m = model if i == 0 else nnx.clone(model)
    m.language_model.attention_impl, m.language_model.attention_block = impl, args.attention_block
    m.language_model.remat = args.remat
    grad_step = nnx.cached_partial(nnx.jit(nnx.value_and_grad(loss_fn)), m)

    def jax_step(grad_step=grad_step):
      loss, grads = grad_step(batch)
      jax.block_until_ready(grads)
      return float(loss)
    jax_steps[impl] = jax_step

  t_ids, t_grid = torch.tensor(ids, device=tdev), torch.tensor(grid, device=tdev)
  t_pix = torch.tensor(pixels, device=tdev, dtype=tdtype)
  mm = torch.tensor((ids == config.image_token_id).astype(np.int32), device=tdev)

  def torch_step():
    hf.zero_grad(set_to_none=True)
    out = hf(input_ids=t_ids, pixel_values=t_pix, image_grid_thw=t_grid, mm_token_type_ids=mm, labels=t_ids)
    out.loss.backward()
    sync()
    return float(out.loss)

  # The matmul reference: a chain of --matmul_chain dependent products in one call (one dispatch, one sync), so the
  # rate is the kernels', not the call overhead's; a scaled to keep the chain finite.
  chain = args.matmul_chain
  a = jnp.asarray(rng.standard_normal((args.matmul, args.matmul)) / np.sqrt(args.matmul), jdtype)

  @jax.jit
  def matmul(x):
    y = x
    for _ in range(chain):
      y = y @ x
    return y
  ta = torch.tensor(np.asarray(a, np.float32), device=tdev, dtype=tdtype)

  def torch_matmul():
    y = ta
    for _ in range(chain):
      y = y @ ta
    sync()

  t0 = time.perf_counter()
  warm = {}
  for impl, step in list(jax_steps.items()):                       # warm-up (JAX compile)
    try:
      warm[impl] = step()
    except Exception as e:                                         # e.g. cuDNN without a GPU: time the others
      print(f'jax_{impl}: failed: {type(e).__name__}: {str(e)[:300]}', flush=True)
      del jax_steps[impl]
  if not jax_steps:
    raise SystemExit('no JAX step ran')
  tl = None if hf is None else torch_step()
  jax.block_until_ready(matmul(a))
  torch_matmul()
  print(f'warmup_seconds={time.perf_counter() - t0:.1f} '
        + ' '.join(f'loss_jax_{impl}={v:.4f}' for impl, v in warm.items())
        + ('' if tl is None else f' loss_torch={tl:.4f}'), flush=True)
  jt, tt, jm, tm = {impl: [] for impl in jax_steps}, [], [], []
  for _ in range(args.repeats):              # alternate frameworks and kernels
    for impl, step in jax_steps.items():
      jt[impl].append(_best(step, 1))
    if hf is not None:
      tt.append(_best(torch_step, 1))
    jm.append(_best(lambda: jax.block_until_ready(matmul(a)), 1))
    tm.append(_best(torch_matmul, 1))
  jt = {impl: min(v) for impl, v in jt.items()}
  jm, tm = min(jm), min(tm)
  flops = step_flops(config, args.tokens, patches)
  mm_flops = chain * 2 * args.matmul ** 3
  best_matmul = mm_flops / min(jm, tm)
  best = min(jt, key=jt.get)
  print(f'step_gflop={flops / 1e9:.1f}')
  for impl, t in jt.items():
    print(f'jax_{impl}: step_s={t:.3f} tokens_per_s={args.tokens / t:.0f} step_gflops={flops / t / 1e9:.1f} '
          f'step_flops_utilization={flops / t / best_matmul:.3f}')
  print(f'jax_matmul_gflops={mm_flops / jm / 1e9:.1f} torch_matmul_gflops={mm_flops / tm / 1e9:.1f} '
        f'(chain of {chain} [{args.matmul}]^2 products)')
  if hf is not None:
    tt = min(tt)
    print(f'torch: step_s={tt:.3f} tokens_per_s={args.tokens / tt:.0f} step_gflops={flops / tt / 1e9:.1f} '
          f'torch_step_flops_utilization={flops / tt / best_matmul:.3f}')
    print(f'ratio_jax_over_torch_tokens_per_s={tt / jt[best]:.3f}')
  print(f'step_flops_utilization={flops / jt[best] / best_matmul:.3f} (jax_{best})')
  print(f'devices={jax.devices()} torch_device={tdev} torch_threads={torch.get_num_threads()} dtype={args.dtype} '
        f'xla_flags={os.environ.get("XLA_FLAGS", "")!r}')


if __name__ == '__main__':
  main()

"""Per-chip memory of GRPO's rollout phase on the embedded sampler (issue 49), from abstract shapes only, and whether
the trainer and the sampler fit a chip together (they share one process: the trainer's state stays live while the
sampler rolls out).

Units: bytes per chip; GB = 1e9 bytes in the printed figures.

The rollout's shapes are the trainer's (`rollout_shapes`; what `factory.make_engine` and the agent loop give the
sampler):
  B  rows decoded together: the episodes running at once, min(grpo.prompts_per_step x grpo.num_generations,
     rollout.max_concurrency), padded as `decode_batch.DecodeBatch` pads one `generate`'s batch (a power of two,
     then a multiple of the replicas R)
  C  cache slots per row: the sampler's max_len = rollout.max_total_tokens + rollout.max_new_tokens rounded up to
     its bucket (`prefill_inputs.length_rung` at max_len: the longest cache the sampler compiles)
  P  prompt tokens one admission prefills per row, on the same ladder: rollout.max_total_tokens (without a prefix
     cache every turn re-sends and prefills its whole context); with rollout.prefix_cache_slots > 0 the first
     turn's prompt, rollout.max_prompt_tokens (else max_new_tokens), taken as no shorter than what a later turn
     prefills after its cached prefix (its last turn and observation)
  c  the KV cache's dtype bytes: model.dtype (the factory passes no cache_dtype: `Qwen3VLModel.init_cache`'s
     default, the compute dtype); p the parameter dtype's (the sampler samples the trainer's parameters)

Per chip on a rollout layout {'tensor': T, 'data': R} (`rollout/embedded/layout.py`: weights split over 'tensor'
by `DECODE_RULES`, nothing over 'fsdp'; b = B / R rows per replica; L layers, Hkv / nq KV / query heads of D, H
hidden, I the MLP width (MoE: top-k x moe_intermediate_size), V the vocabulary rows):
  weights  = Σ_w bytes(w, p) / (its shards over 'tensor')       the sampler's copy in the rollout layout
                                                                 (`Layout.place_state`; the trainer keeps its own)
  kv       = 2·L·b·(Hkv/T)·C·D·c + b·C                           k, v [L, B, Hkv, C, D] split (data, tensor) + the
                                                                 bool mask [B, C] split over data
  pool     = 2·L·N·(Hkv/T)·S·D·c                                 the prefix cache's pool of N = prefix_cache_slots
                                                                 slots of S = C tokens (whole on every replica)
  decode   = b·(nq/T)·C·12 + b·C + 2·b·(V/T)·4                   one layer's attention over the cache (three
                                                                 float32 buffers per score: scores, exponentials,
                                                                 probabilities, as XLA's CPU backend holds them for
                                                                 float32 and bfloat16 alike), the [b, 1, C] mask, the
                                                                 step's float32 logits (vocabulary over 'tensor')
                                                                 and their sampling copy
  prefill  = b·P·C·((nq/T)·12 + 1)                               the dense cache attention of P queries over C
             + b·P·c·(3H + 2·(nq + nkv)·D/T + 3·I/T) + 2·b·(V/T)·4   slots (`attention.cache_attention`: scores as
                                                                 above, the [b, P, C] mask) and one layer's
                                                                 activations (the vision tower not counted)
  reshard  = weights                                             `set_model` places the new copy while the old one
                                                                 is still the sampler's
Phases (training = `estimate.Plan`; its parameters and AdamW state are live throughout):
  train    = training.total + weights + pool                     the sampler keeps its copy and pool between rollouts
  reshard  = training.params + training.optimizer + 2·weights + pool
  rollout  = training.params + training.optimizer + weights + kv + pool + max(decode, prefill)
  fits when the largest phase <= the chip's HBM.
No rollout layout (rollout.mesh unset, or tensor 0: the sampler of today) samples the trainer's own arrays (no copy,
no reshard) on one device: its KV cache, the whole batch's, is created on device 0 (b = B, T = 1), and each step
gathers a layer's weights and the vocabulary there (`gathers`: one layer's parameters, the embedding and lm_head,
in p) - the figures are device 0's.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_collections

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.plan import estimate as estimate_lib
from osvl_jax.rollout import limits as limits_lib
from osvl_jax.rollout.embedded import decode_batch, layout as layout_lib, prefill_inputs

# The sampler's prompt and cache bucket: `factory.make_engine` leaves JaxSampler's default.
BUCKET = 128
# Bytes live per attention score over the cache: three float32 buffers (module docstring `decode`).
SCORE_BYTES = 12


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The rollout's shapes (module docstring): `episodes` of a step, `running` of them at once, `rows` B of one
  batch (`running` padded to a power of two; before padding to the replicas), `cache_len` C, `prefill_len` P,
  `cache_dtype`, `pool_slots` N, `max_len` the sampler's context (max_total_tokens + max_new_tokens)."""
  episodes: int
  running: int
  rows: int
  cache_len: int
  prefill_len: int
  cache_dtype: jnp.dtype
  pool_slots: int
  max_len: int


def rollout_shapes(config: ml_collections.ConfigDict) -> Shapes:
  """The `Shapes` of `config`'s GRPO rollouts (module docstring).

  Raises:
    ValueError: from `limits.Limits.from_config` (a budget out of range).
  """
  r, g = config.rollout, config.grpo
  episodes = int(g.prompts_per_step) * int(g.num_generations)
  concurrency = limits_lib.Limits.from_config(r).max_concurrency
  running = min(episodes, concurrency) if concurrency else episodes
  max_len = int(r.max_total_tokens) + int(r.max_new_tokens)
  cache_len = prefill_inputs.length_rung(max_len, BUCKET, max_len)
  slots = int(r.get('prefix_cache_slots') or 0)
  prompt = (int(r.get('max_prompt_tokens') or r.max_new_tokens) if slots else int(r.max_total_tokens))
  return Shapes(episodes=episodes, running=running, rows=decode_batch.next_pow2(running), cache_len=cache_len,
                prefill_len=prefill_inputs.length_rung(min(prompt, max_len), BUCKET, max_len),
                cache_dtype=estimate_lib.dtypes(config)[0], pool_slots=slots, max_len=max_len)


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
  """Per-chip bytes of the rollout phase on one layout (module docstring) and the phases with the trainer.

  Attributes:
    tensor, replicas: the layout (T, R); `layout` False: no rollout layout (one device, T = R = 1).
    rows: B padded to a multiple of R; rows_per_replica: b.
    weights, kv, pool, decode, prefill, reshard: the module docstring's terms; gathers: the one-device sampler's
      layer and vocabulary gathers (0 on a layout).
    train, reshard_phase, rollout: the phases' totals; hbm: the chip's bytes.
  """
  layout: bool
  tensor: int
  replicas: int
  rows: int
  rows_per_replica: int
  weights: int
  kv: int
  pool: int
  decode: int
  prefill: int
  gathers: int
  train: int
  reshard_phase: int
  rollout: int
  hbm: int

  @property
  def reshard(self) -> int:
    """Bytes per chip the reshard adds for a moment: the sampler's old copy of the weights beside the new one."""
    return self.weights

  @property
  def sampler(self) -> int:
    """The sampler's bytes during a rollout: weights + kv + pool + gathers + max(decode, prefill)."""
    return self.weights + self.kv + self.pool + self.gathers + max(self.decode, self.prefill)

  @property
  def peak(self) -> int:
    """Bytes per chip of the largest phase (training step, reshard, rollout)."""
    return max(self.train, self.reshard_phase, self.rollout)

  @property
  def fits(self) -> bool:
    """Whether training and rollouts fit the chip together: peak <= hbm."""
    return self.peak <= self.hbm

  def rows_that_fit(self) -> int:
    """The most rows (a multiple of R) whose rollout phase fits the chip at these context lengths (KV, decode and
    prefill grow with the rows; the rest does not), at most what the training and reshard phases leave; 0 when none
    does."""
    per_row = (self.kv + max(self.decode, self.prefill)) / self.rows_per_replica
    free = self.hbm - (self.rollout - self.kv - max(self.decode, self.prefill))
    if self.train > self.hbm or self.reshard_phase > self.hbm or free < per_row:
      return 0
    return int(free // per_row) * self.replicas


def _per_chip(table: dict) -> int:
  """Σ per-chip bytes of an `estimate.param_bytes` table."""
  return sum(per_chip for _, per_chip, _ in table.values())


def estimate(config: ml_collections.ConfigDict, training: estimate_lib.Plan, sizes: dict[str, int] | None, chip: str,
             shapes: Shapes | None = None, arch: config_lib.Qwen3VLConfig | None = None,
             training_sizes: dict[str, int] | None = None) -> RolloutPlan:
  """The `RolloutPlan` of `config`'s rollouts on the rollout layout `sizes` ({'tensor': T, 'data': R}; None: no
  layout, the sampler on one device beside the trainer's mesh `training_sizes`), with the trainer's `training`
  plan live beside it, on `chip`.

  Raises:
    ValueError: T not dividing the KV heads (the sampler refuses it, `Layout.check_model`); from `hbm_bytes`.
  """
  arch = arch or estimate_lib.architecture(config)
  shapes = shapes or rollout_shapes(config)
  t = arch.text
  c = jnp.dtype(shapes.cache_dtype).itemsize
  model = estimate_lib.abstract_model(config, arch)
  if sizes is None:
    tensor, replicas = 1, 1
    table = estimate_lib.param_bytes(model, sharding.abstract_mesh(training_sizes or training.mesh),
                                     sharding.rules_from_config(config))
    weights, gathers = 0, _gathers(table, t.num_hidden_layers)
  else:
    tensor, replicas = int(sizes['tensor']), int(sizes['data'])
    if t.num_key_value_heads % tensor:
      raise ValueError(f'rollout.mesh.tensor={tensor} does not divide the model\'s num_key_value_heads='
                       f'{t.num_key_value_heads}: the KV cache splits its heads over the tensor axis')
    mesh = sharding.abstract_mesh({'data': replicas, 'tensor': tensor})
    weights, gathers = _per_chip(estimate_lib.param_bytes(model, mesh, layout_lib.DECODE_RULES)), 0
  rows = -(-shapes.rows // replicas) * replicas
  b, cache_len, prefill_len = rows // replicas, shapes.cache_len, shapes.prefill_len
  kv_heads, heads = t.num_key_value_heads // tensor, t.num_attention_heads // tensor
  kv = 2 * t.num_hidden_layers * b * kv_heads * cache_len * t.head_dim * c + b * cache_len
  pool = 2 * t.num_hidden_layers * shapes.pool_slots * kv_heads * cache_len * t.head_dim * c
  logits = 2 * b * -(-t.table_rows // tensor) * 4
  decode = b * heads * cache_len * SCORE_BYTES + b * cache_len + logits
  width = t.num_experts_per_tok * t.moe_intermediate_size if arch.is_moe else t.intermediate_size
  layer = c * (3 * t.hidden_size + 2 * (t.num_attention_heads + t.num_key_value_heads) * t.head_dim // tensor
               + 3 * width // tensor)
  prefill = b * prefill_len * cache_len * (heads * SCORE_BYTES + 1) + b * prefill_len * layer + logits
  live = training.params + training.optimizer
  sampler = weights + kv + pool + gathers + max(decode, prefill)
  return RolloutPlan(layout=sizes is not None, tensor=tensor, replicas=replicas, rows=rows, rows_per_replica=b,
                     weights=weights, kv=kv, pool=pool, decode=decode, prefill=prefill, gathers=gathers,
                     train=training.total + weights + pool, reshard_phase=live + 2 * weights + pool,
                     rollout=live + sampler, hbm=estimate_lib.hbm_bytes(chip))


def _gathers(table: dict, layers: int) -> int:
  """One decoder layer's parameters and the vocabulary matrices whole (the one-device sampler's working set on the
  trainer's FSDP layout), in the parameter dtype."""
  total = 0
  for path, (whole, _, _) in table.items():
    if path.startswith('language_model.layers.0.'):
      total += whole
    elif path.startswith('language_model.layers.') and not path.split('.')[2].isdigit():
      total += whole // layers   # stacked [L, ...] (model.scan_layers): one layer's slice
    elif path in ('language_model.embed_tokens.embedding', 'lm_head.kernel'):
      total += whole
  return total


def tensor_choices(arch: config_lib.Qwen3VLConfig, chips: int) -> list[int]:
  """Tensor degrees a rollout layout on `chips` may take, ascending: divisors of both the chips and the KV heads."""
  heads = arch.text.num_key_value_heads
  return [d for d in range(1, chips + 1) if chips % d == 0 and heads % d == 0]


def smallest_fitting(config: ml_collections.ConfigDict, training: estimate_lib.Plan, chips: int, chip: str,
                     shapes: Shapes | None = None, arch: config_lib.Qwen3VLConfig | None = None
                     ) -> RolloutPlan | None:
  """The plan of the smallest tensor degree (replicas over the rest of the chips) whose phases fit `chip`, or None
  when none does (this estimate's own choice; `layout.auto_tensor` decides a run's `rollout.mesh.tensor = -1`)."""
  arch = arch or estimate_lib.architecture(config)
  for tensor in tensor_choices(arch, chips):
    p = estimate(config, training, {'tensor': tensor, 'data': chips // tensor}, chip, shapes, arch)
    if p.fits:
      return p
  return None


def configured_sizes(config: ml_collections.ConfigDict, chips: int, training: estimate_lib.Plan, chip: str,
                     arch: config_lib.Qwen3VLConfig, shapes: Shapes | None = None
                     ) -> tuple[dict[str, int] | None, str]:
  """(sizes, how they were chosen) of `config.rollout.mesh` on `chips`: None for no layout (unset, empty, or
  tensor 0: the sampler on one device); tensor -1 (auto) as `layout.auto_tensor` sizes it for the run
  (`factory.rollout_mesh`: max_concurrency rows of max_total_tokens + max_new_tokens tokens, the prefix-cache slots
  shared), with `chip`'s HBM as the device's memory - where no degree fits, the largest degree, which the run
  refuses; else `layout.mesh_sizes` of the section.

  Raises:
    ValueError: from `layout.mesh_sizes`, naming the rollout.mesh field.
  """
  mesh = config.rollout.get('mesh')
  given = dict(mesh.items()) if mesh else {}
  tensor, data = given.get('tensor', 1), given.get('data', -1)
  if not given or tensor == 0:
    return None, 'none (rollout.mesh unset or tensor 0): the sampler runs on one device'
  if tensor != -1:
    return layout_lib.mesh_sizes(given, chips), 'rollout.mesh'
  shapes = shapes or rollout_shapes(config)
  largest = max(t for t in tensor_choices(arch, chips) if data == -1 or data * t <= chips)
  model = estimate_lib.abstract_model(config, arch)
  kv_per_row = layout_lib.kv_bytes_per_token(arch.text, shapes.cache_dtype) * shapes.max_len
  rows = int(config.rollout.get('max_concurrency') or shapes.running)
  try:
    chosen = int(layout_lib.auto_tensor(layout_lib.weight_bytes(model), kv_per_row, rows,
                                        estimate_lib.hbm_bytes(chip), chips, arch.text.num_key_value_heads, data,
                                        shapes.pool_slots))
    how = 'rollout.mesh.tensor=-1 (layout.auto_tensor)'
  except ValueError as e:   # the run would stop here, naming the field
    chosen, how = largest, f'the largest degree; the run refuses it: {e}'
  return layout_lib.mesh_sizes({**given, 'tensor': chosen}, chips), how


def describe(p: RolloutPlan) -> str:
  """'tensor=T data=R', or 'one device (no rollout layout)'."""
  return f'tensor={p.tensor} data={p.replicas}' if p.layout else 'one device (no rollout layout)'


def report(p: RolloutPlan, shapes: Shapes, chip: str, how: str, best: RolloutPlan | None) -> list[str]:
  """The rollout section of `python -m osvl_jax.plan`, ending with
  `rollout_gb_per_chip=<sampler> kv_gb_per_chip=<kv> peak_gb_per_chip=<largest phase> fits=<true|false>`."""
  gb = estimate_lib.GB
  lines = [f'rollout: {shapes.episodes} episodes, {shapes.rows} rows decoded together (padded to {p.rows}), '
           f'cache {shapes.cache_len} tokens/row in {jnp.dtype(shapes.cache_dtype).name}, prefill '
           f'{shapes.prefill_len} tokens/row, prefix-cache slots {shapes.pool_slots}',
           f'rollout layout: {describe(p)}; {how}' + ('' if p.layout else
                                                      '; its KV cache whole on device 0 (the figures are its)'),
           f"{'per chip':<42}{'GB (1e9 B)':>12}"]
  rows = [('rollout weights (the sampler\'s copy)', p.weights), ('kv cache', p.kv), ('prefix-cache pool', p.pool),
          ('decode step temporaries', p.decode), ('prefill temporaries', p.prefill),
          ('layer + vocabulary gathers (no layout)', p.gathers), ('reshard transient (old copy)', p.reshard),
          ('phase: training step + sampler buffers', p.train), ('phase: reshard', p.reshard_phase),
          ('phase: rollout + trainer state', p.rollout), (f'{chip} HBM ({estimate_lib.HBM_GIB[chip]} GiB)', p.hbm)]
  lines += [f'{name:<42}{value / gb:>12.3f}' for name, value in rows]
  lines.append(f'rows that fit at these lengths: {p.rows_that_fit()}')
  lines.append('smallest tensor degree that fits: ' + (f'{describe(best)} (peak {best.peak / gb:.3f} GB, '
                                                       f'{best.rows_that_fit()} rows fit)' if best else 'none'))
  lines.append(f'rollout_gb_per_chip={p.sampler / gb:.3f} kv_gb_per_chip={p.kv / gb:.3f} '
               f'peak_gb_per_chip={p.peak / gb:.3f} fits={str(p.fits).lower()}')
  return lines

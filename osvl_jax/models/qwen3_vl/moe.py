"""Qwen3-VL-MoE sparse block in Flax NNX (HF `Qwen3VLMoeTextSparseMoeBlock`, `Qwen3VLMoeTextTopKRouter`,
`Qwen3VLMoeTextExperts`): a top-k router and E SwiGLU experts run as grouped (ragged) matmuls over tokens sorted
by expert.

Routing per device (expert parallelism). Under a mesh set with `jax.set_mesh` / `sharding.use_mesh` (more than one
device, traced call) the experts run inside `jax.shard_map`: the tokens stay split over the axes of the logical
'batch' / 'length' axes (by default ('data', 'fsdp')), the expert weights stay split over the axes of 'experts'
('expert') and, where the rules split it and the tokens are not split along it, the intermediate dim over the axes
of 'mlp' ('tensor'); the remaining weight dims ('embed' over 'fsdp') are all-gathered in the compute dtype, as FSDP
gathers every weight (the backward reduce-scatters their gradients). Each device sorts only its own tokens' k
assignments and runs the grouped matmuls over its local experts (E / expert of them); assignments to experts held
elsewhere get routing weight 0. A `psum` over the expert (and intermediate) axes then adds the partial outputs.

Why a psum and not an all-to-all: where the batch is not split over 'expert' (the default rules: ('data',
'fsdp')), every device of an 'expert' group already holds the same tokens; each computes the part of every token's
output that its experts own, and the sum over the group is the whole output (one [tokens, hidden] all-reduce per
layer over 'expert'). Where the rules do split the batch over 'expert' (the 30B-A3B configs: ('data', 'fsdp',
'expert')), the group's tokens are first all-gathered along it and the summed outputs reduce-scattered back (the
same sum, as a reduce-scatter): each device then routes ep x its own tokens (ep = the 'expert' size), of which ~1/ep
go to its experts. A dropless all-to-all dispatch (`jax.lax.ragged_all_to_all`) would route only the assignments
of local experts, but needs a static receive buffer of the worst case (every token to one device) or a capacity
that drops tokens (HF drops none); it is not implemented.

Without a mesh (or on a one-device mesh, or called eagerly) the same grouped matmuls run over all E experts and
all tokens (the reference path; HF parity tests run it). The per-device buffers are [N_local * k, ...] with N_local
the tokens of one batch shard, where the global path holds [N * k, ...] for the whole batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl.config import TextConfig

TOKEN_AXES = ('batch', 'length', None)   # logical axes of the block's tokens [B, T, hidden] and routes [B, T, k]


def _argsort(key):
  """`jnp.argsort(key, stable=True)` of int [M] -> int32 [M], typed as varying over the mesh axes `key` varies over
  inside `jax.shard_map`: jax 0.10.2's argsort output drops them, and a gather by an order typed invariant gets a
  transpose that psums the cotangents of rows sorted differently on each device (wrong gradients for the tokens)."""
  order = jnp.argsort(key, stable=True)
  missing = tuple(sorted(jax.typeof(key).manual_axis_type.varying - jax.typeof(order).manual_axis_type.varying))
  return jax.lax.pcast(order, missing, to='varying') if missing else order


def routed_experts(x, top_index, top_weight, gate_up, down, first_expert=0):
  """Grouped SwiGLU experts over the tokens sorted by expert (`jax.lax.ragged_dot`), for the experts
  first_expert .. first_expert + E_l - 1 held in `gate_up` / `down`; assignments to other experts contribute 0.

  Args:
    x: [N, hidden] tokens (compute dtype); top_index: int32 [N, k] chosen experts (global ids); top_weight: [N, k]
      their routing weights.
    gate_up: [E_l, hidden, 2*I_l] (gate = first I_l columns, up = last I_l); down: [E_l, I_l, hidden].
    first_expert: global id of local expert 0 (int or int32 scalar).

  Returns:
    [N, hidden] in the weights' dtype: sum over j with top_index[:, j] local of
    top_weight[:, j] * down(silu(gate(x)) * up(x)) of that expert (HF `Qwen3VLMoeTextExperts.forward`).
  """
  n, k = top_index.shape
  e = gate_up.shape[0]
  local = top_index.reshape(-1) - first_expert                            # [N*k]
  held = (local >= 0) & (local < e)
  key = jnp.where(held, local, e)                                         # other experts' assignments sort last
  order = _argsort(key)
  token = order // k
  group_sizes = jnp.bincount(key, length=e + 1)[:e].astype(jnp.int32)
  xs = x[token].astype(gate_up.dtype)                                     # [N*k, hidden] grouped by expert
  gate, up = jnp.split(jax.lax.ragged_dot(xs, gate_up, group_sizes), 2, axis=-1)
  ys = jax.lax.ragged_dot(jax.nn.silu(gate) * up, down, group_sizes)
  weight = jnp.where(held, top_weight.reshape(-1), 0)[order]
  ys = ys * weight[:, None].astype(ys.dtype)
  return jnp.zeros((n, x.shape[-1]), ys.dtype).at[token].add(ys)


def _axes(entry) -> tuple[str, ...]:
  """Mesh axes of one PartitionSpec entry."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


class Experts(nnx.Module):
  """The E expert SwiGLU MLPs as stacked weights (HF `Qwen3VLMoeTextExperts`).

  `gate_up_proj`: [E, hidden, 2*I] (gate = first I columns, up = last I), `down_proj`: [E, I, hidden]; this is the
  hub checkpoint layout (transformers>=5 keeps the transpose, see `weights.py`).
  """

  def __init__(self, config: TextConfig, *, rngs, dtype, param_dtype):
    e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
    init = nnx.initializers.normal(0.02)
    self.gate_up_proj = nnx.Param(init(rngs.params(), (e, h, 2 * i), param_dtype))
    self.down_proj = nnx.Param(init(rngs.params(), (e, i, h), param_dtype))
    self.dtype = dtype

  def __call__(self, x, top_index, top_weight):
    """x [B, T, hidden], top_index int32 [B, T, k], top_weight [B, T, k] -> [B, T, hidden] (compute dtype).

    Per device under a (multi-device) mesh set around the traced call, else over the whole batch (module
    docstring).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1 or not isinstance(x, jax.core.Tracer):
      return self._whole_batch(x, top_index, top_weight)
    return self._per_device(mesh, x, top_index, top_weight)

  def _whole_batch(self, x, top_index, top_weight):
    """`routed_experts` over all tokens and all E experts; x [B, T, hidden] -> [B, T, hidden]."""
    b, t, h = x.shape
    k = top_index.shape[-1]
    out = routed_experts(x.reshape(-1, h), top_index.reshape(-1, k), top_weight.reshape(-1, k),
                         self.gate_up_proj[...].astype(self.dtype), self.down_proj[...].astype(self.dtype))
    return out.reshape(b, t, h)

  def _per_device(self, mesh, x, top_index, top_weight):
    """`jax.shard_map` of `routed_experts` over the tokens' batch shards and the experts' shards (module
    docstring); x [B, T, hidden] -> [B, T, hidden]."""
    rules = sharding.current_rules()
    gate_up, down = self.gate_up_proj[...], self.down_proj[...]
    token_spec = sharding.logical_to_spec(TOKEN_AXES, x.shape, mesh, rules)
    gu_spec = sharding.logical_to_spec(sharding.logical_axes('mlp.experts.gate_up_proj', 3), gate_up.shape, mesh,
                                       rules)
    down_spec = sharding.logical_to_spec(sharding.logical_axes('mlp.experts.down_proj', 3), down.shape, mesh,
                                         rules)
    # Which axes split what is decided on the axes of size > 1; collectives also name the size-1 axes the specs
    # carry, so that every output is typed invariant along the axes out_specs leaves out.
    live = lambda entry: tuple(a for a in _axes(entry) if mesh.shape[a] > 1)
    token_axes = {a for entry in token_spec for a in live(entry)}
    expert_axes = _axes(gu_spec[0])
    # Token dims split over an expert axis are gathered along it first (and the outputs reduce-scattered back).
    token_gathers = [(dim, tuple(a for a in live(entry) if a in expert_axes)) for dim, entry in enumerate(token_spec)]
    token_gathers = [(dim, axes) for dim, axes in token_gathers if axes]
    # The intermediate dim stays split (tensor-parallel experts) where down_proj's is and the tokens are whole along
    # it; gate_up_proj's [gate | up] columns are then gathered and each device slices its gate and up blocks.
    inner_axes = _axes(down_spec[1]) if not token_axes & set(live(down_spec[1])) else ()
    summed = tuple(a for a in expert_axes + inner_axes if a not in token_axes)
    # The weights enter split over their expert axes (and down_proj's intermediate dim over inner_axes) only: the
    # other dims ('embed' over 'fsdp', gate_up's intermediate) are gathered by GSPMD at the shard_map boundary, after
    # the cast to the compute dtype, as FSDP gathers every weight. Inside, they are then invariant along those
    # axes, so the output varies only where the tokens do, whatever the rules split the tokens over (an
    # all_gather inside would type it varying along 'fsdp' even where the tokens are whole along it).
    gu_in = jax.sharding.PartitionSpec(gu_spec[0], None, None)
    down_in = jax.sharding.PartitionSpec(down_spec[0], down_spec[1] if inner_axes else None, None)
    gate_up, down = gate_up.astype(self.dtype), down.astype(self.dtype)

    def local(x, top_index, top_weight, gate_up, down):
      if inner_axes:
        width, start = down.shape[1], jax.lax.axis_index(inner_axes) * down.shape[1]
        half = gate_up.shape[2] // 2
        gate_up = jnp.concatenate([jax.lax.dynamic_slice_in_dim(gate_up, start, width, axis=2),
                                   jax.lax.dynamic_slice_in_dim(gate_up, half + start, width, axis=2)], axis=2)
      for dim, axes in token_gathers:
        x, top_index, top_weight = (jax.lax.all_gather(a, axes, axis=dim, tiled=True)
                                    for a in (x, top_index, top_weight))
      first = jax.lax.axis_index(expert_axes) * gate_up.shape[0] if expert_axes else 0
      b, t, h = x.shape
      k = top_index.shape[-1]
      out = routed_experts(x.reshape(-1, h), top_index.reshape(-1, k), top_weight.reshape(-1, k), gate_up, down,
                           first).reshape(b, t, h)
      out = jax.lax.psum(out, summed) if summed else out
      for dim, axes in reversed(token_gathers):
        out = jax.lax.psum_scatter(out, axes, scatter_dimension=dim, tiled=True)
      return out

    return jax.shard_map(local, in_specs=(token_spec, token_spec, token_spec, gu_in, down_in),
                         out_specs=token_spec)(x, top_index, top_weight, gate_up, down)


class SparseMoeBlock(nnx.Module):
  """Top-k mixture of experts (HF `Qwen3VLMoeTextSparseMoeBlock` + `Qwen3VLMoeTextTopKRouter`): router logits and
  softmax in float32 (the paper's "router in float32", Megatron's `moe_router_dtype`; HF computes the logits in the
  compute dtype, which is the same in a float32 model), top-k, renormalised over the k chosen (`norm_topk_prob`),
  the weights then cast to the compute dtype. `gate.kernel` is [hidden, E] (stored in the parameter dtype)."""

  def __init__(self, config: TextConfig, *, rngs, dtype, param_dtype):
    self.top_k = config.num_experts_per_tok
    self.norm_topk_prob = config.norm_topk_prob
    self.gate = nnx.Linear(config.hidden_size, config.num_experts, use_bias=False, dtype=jnp.float32,
                           param_dtype=param_dtype, rngs=rngs)
    self.experts = Experts(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

  def __call__(self, x, router_mask=None):
    """x [B, T, hidden] -> [B, T, hidden] (x's dtype); with `router_mask` (float32 [B, T], 1 on the tokens the
    router losses count) also this layer's `router_stats` (out, stats)."""
    b, t, h = x.shape
    logits = self.gate(x.reshape(-1, h)).reshape(b, t, -1)                 # float32 [B, T, E]
    probs = jax.nn.softmax(logits, axis=-1)
    top_weight, top_index = jax.lax.top_k(probs, self.top_k)
    if self.norm_topk_prob:
      top_weight = top_weight / top_weight.sum(-1, keepdims=True)
    out = self.experts(x, top_index, top_weight.astype(x.dtype)).astype(x.dtype)
    if router_mask is None:
      return out
    return out, router_stats(logits, probs, top_index, router_mask)


# ----------------------------------------------------------------------------------------------------------------
# Router losses: auxiliary load balancing (HF `load_balancing_loss_func`, Switch Transformer) and z-loss (ST-MoE)
# ----------------------------------------------------------------------------------------------------------------

def router_stats(logits, probs, top_index, mask) -> dict:
  """One MoE layer's sums for the router losses, over the tokens of `mask` (HF `load_balancing_loss_func`'s
  per-layer reductions with its attention mask).

  Args:
    logits: float32 [B, T, E] router logits; probs: float32 [B, T, E] their softmax; top_index: int32 [B, T, k]
      the chosen experts; mask: float32 [B, T], 1 on counted tokens (0 on padding).
  Returns:
    {'tokens': float32 [E] Σ mask · (times expert e is among a token's top k) (no gradient),
     'probs': float32 [E] Σ mask · probs[..., e], 'z': float32 [] Σ mask · logsumexp(logits)^2,
     'rows': float32 [] Σ mask}. `text.Qwen3VLText` stacks them over the L sparse layers ([L, E], [L]).
  """
  e = logits.shape[-1]
  mask = mask.astype(jnp.float32)
  chosen = jax.nn.one_hot(top_index, e, dtype=jnp.float32).sum(-2)          # [B, T, E], fused into the sum
  lse = jax.nn.logsumexp(logits, axis=-1)
  return {'tokens': jax.lax.stop_gradient(jnp.sum(chosen * mask[..., None], axis=(0, 1))),
          'probs': jnp.sum(probs * mask[..., None], axis=(0, 1)),
          'z': jnp.sum(jnp.square(lse) * mask), 'rows': jnp.sum(mask)}


# How the router losses of the sparse layers combine. 'per_layer': Megatron-Core's (the official 30B-A3B GRPO run,
# verl's Megatron backend), one loss per sparse layer, summed over the layers (each layer's coefficient-weighted
# loss is added to the objective); 'pooled': transformers' (HF `load_balancing_loss_func`), one loss over the
# statistics pooled over layers and tokens. Near uniform routing the per-layer form presses each layer L / k times
# harder (aux) and L times harder (z) than the pooled one (L = 48, k = 8 for Qwen3-VL-30B-A3B: 6x, 48x).
ROUTER_LOSS_FORMS = ('per_layer', 'pooled')


def _form(form: str) -> str:
  if form not in ROUTER_LOSS_FORMS:
    raise ValueError(f'router_loss_form={form!r}: expected one of {ROUTER_LOSS_FORMS}')
  return form


def load_balancing_loss(stats: dict, form: str = 'per_layer') -> jax.Array:
  """The auxiliary load-balancing loss (Switch Transformer eq. 4-6) from `router_stats` stacked over the L sparse
  layers ('tokens', 'probs' float32 [L, E], 'rows' [L]):

    'per_layer' (Megatron-Core `switch_load_balancing_loss_func`, summed over the layers):
        Σ_l E · Σ_e (tokens_le / Σ_e' tokens_le') · (probs_le / rows_l),
      each layer's share of its top-k assignments routed to e (tokens / (k · rows), Megatron's division by k)
      times e's mean router probability; uniform routing gives 1 per layer, L in all.
    'pooled' (HF `load_balancing_loss_func`, transformers 5, qwen3_vl_moe): with R = Σ_l rows_l,
        E · Σ_e (Σ_l tokens_le / R) · (Σ_l probs_le / R),
      the statistics pooled over layers and tokens (not a mean of per-layer losses); HF does not divide by k:
      uniform routing gives k.

  A layer (or a batch) without a counted token adds 0 (HF would divide by zero).
  Returns float32 []. Raises ValueError: an unknown `form`.
  """
  e = stats['tokens'].shape[-1]
  if _form(form) == 'pooled':
    rows = jnp.maximum(jnp.sum(stats['rows']), 1.0)
    return e * jnp.sum((jnp.sum(stats['tokens'], 0) / rows) * (jnp.sum(stats['probs'], 0) / rows))
  assignments = jnp.maximum(jnp.sum(stats['tokens'], -1, keepdims=True), 1.0)    # k · rows_l, [L, 1]
  rows = jnp.maximum(stats['rows'], 1.0)[:, None]
  return e * jnp.sum((stats['tokens'] / assignments) * (stats['probs'] / rows))


def z_loss(stats: dict, form: str = 'per_layer') -> jax.Array:
  """Router z-loss (ST-MoE, Zoph et al. 2022, eq. 5) from `router_stats` stacked over the L sparse layers ('z',
  'rows' [L]): 'per_layer' (Megatron-Core `z_loss_func`, summed over the layers) Σ_l z_l / rows_l, each layer's
  mean over its counted tokens of logsumexp(router logits)^2; 'pooled' (HF `SwitchTransformers`
  `router_z_loss_func` over the pooled layers) Σ_l z_l / Σ_l rows_l, the mean over counted tokens and layers.

  Returns float32 [] (a layer without a counted token adds 0). Raises ValueError: an unknown `form`.
  """
  if _form(form) == 'pooled':
    return jnp.sum(stats['z']) / jnp.maximum(jnp.sum(stats['rows']), 1.0)
  return jnp.sum(stats['z'] / jnp.maximum(stats['rows'], 1.0))

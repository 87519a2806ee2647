"""The MoE router losses in the trainers' losses (PAPER.md Official run settings, MoE row: aux 0.01, z 1e-3):
SFT's loss is L_SFT + 0.01 aux + 1e-3 z and GRPO's −J + the micro-batch's row share of the same, with aux and z
recomputed here in float64 from the router logits of the forward pass (captured in an eager run), in both forms:
'per_layer' (the default; Megatron-Core's `switch_load_balancing_loss_func` / `z_loss_func` per sparse layer,
summed over the layers, as the official run's coefficients mean them) and 'pooled' (transformers'
`load_balancing_loss_func`: attention mask, top-k counts, layers pooled; the ST-MoE z-loss over layers and tokens);
the padding tokens do not count. Coefficients 0, or a dense model, trace the program of a step without router
losses. (The router statistics themselves are held to transformers in tests/models/test_moe.py.)"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import moe, rope
from osvl_jax.rl import losses
from osvl_jax.train import grpo_update, placement, policy, sft

MOE = {'num_experts': 4, 'num_experts_per_tok': 2, 'moe_intermediate_size': 32}   # = Qwen3VLConfig.tiny_moe()
COEFS = policy.RouterLoss(0.01, 1e-3)                     # the default form: 'per_layer'
POOLED = policy.RouterLoss(0.01, 1e-3, 'pooled')
B, T, K = 4, 12, 4


def _model(kind: str = 'moe'):
  text = {'num_hidden_layers': 2, 'vocab_size': 2048, **(MOE if kind == 'moe' else {})}   # a small table: fast init
  model = checkpoints.build_model(ml_collections.ConfigDict({'model': {'name': 'tiny', 'text': text}}), seed=0)
  if kind == 'moe':
    for layer in model.language_model.layers:   # a sharper router: far from uniform routing (x50 would saturate
      layer.mlp.gate.kernel[...] = layer.mlp.gate.kernel[...] * 10.0   # float32 probs to 0: top-k ties)
  return model


def _batch() -> dict:
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 1000, (B, T)).astype(np.int32)
  mask = np.ones((B, T), bool)
  mask[1, -5:] = False    # right padding
  mask[3, :4] = False     # left padding
  pos, _ = rope.get_rope_index(ids, None, mask)
  loss_positions = np.array([[4, 5, 6, 7], [2, 3, 4, 5], [8, 9, 9, 9], [5, 6, 7, 8]], np.int32)
  completion = np.ones((B, K), bool)
  completion[2, 2:] = False
  return {'input_ids': ids, 'attention_mask': mask, 'position_ids': np.asarray(pos), 'loss_positions': loss_positions,
          'loss_targets': np.take_along_axis(ids, loss_positions + 1, axis=1), 'completion_mask': completion,
          'loss_mask': completion.astype(np.float32), 'advantages': rng.normal(0, 1, B).astype(np.float32),
          'old_logprobs': (-7.0 + rng.normal(0, 0.3, (B, K))).astype(np.float32)}


def _layer_sums(logits: list[np.ndarray], mask: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray, float, float]]:
  """float64 (top-k counts [E], router probability sums [E], Σ logsumexp², real tokens) of each sparse layer's router
  logits [B, T, E] over the tokens of `mask`."""
  m = mask.reshape(-1).astype(np.float64)
  e = logits[0].shape[-1]
  out = []
  for layer in logits:
    x = np.asarray(layer, np.float64).reshape(-1, e)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    p = np.exp(x - lse[:, None])
    top = np.argsort(-p, axis=-1, kind='stable')[:, :k]
    out.append((np.bincount(top.reshape(-1), weights=np.repeat(m, k), minlength=e), (p * m[:, None]).sum(0),
                float((lse ** 2 * m).sum()), m.sum()))
  return out


def _reference(logits: list[np.ndarray], mask: np.ndarray, k: int, form: str = 'pooled') -> tuple[float, float]:
  """float64 (aux, z). 'pooled': transformers' `load_balancing_loss_func` with the attention mask (top-k assignment
  counts and probabilities summed over layers and real tokens, divided by layers x real tokens; E · Σ_e f_e P_e),
  and the mean over layers and real tokens of logsumexp(logits)^2. 'per_layer': Megatron-Core's losses of each
  layer, summed: E / (k N²) · Σ_e counts_e · probs_e and the mean over its N real tokens of logsumexp²."""
  layers = _layer_sums(logits, mask, k)
  e = logits[0].shape[-1]
  if form == 'per_layer':
    return (sum(e / (k * n * n) * float(np.sum(c * p)) for c, p, _, n in layers),
            sum(z / n for _, _, z, n in layers))
  counts, probs = sum(c for c, _, _, _ in layers), sum(p for _, p, _, _ in layers)
  rows = sum(n for _, _, _, n in layers)
  return float(e * np.sum(counts / rows * probs / rows)), sum(z for _, _, z, _ in layers) / rows


GRPO = dict(eps_low=0.2, eps_high=0.28, beta=0.0, aggregation='seq_mean_token_mean', clip_ratio_c=None)


@pytest.fixture(scope='module')
def setup():
  """(model, batch, reference aux, reference z, the losses): the router logits of the forward pass, the task losses
  and the SFT / GRPO losses with the coefficients (GRPO's micro-batch as half of its mini-batch: num_sequences =
  2B), all from one jitted call (one compile); the references are of the default 'per_layer' form, the 'pooled'
  ones in out['pooled_ref']."""
  model, batch = _model(), placement.device_batch(_batch())
  n_seq, n_tok = jnp.float32(2 * B), jnp.float32(batch['loss_mask'].sum())
  captured = []
  original = moe.router_stats

  def capture(logits, probs, top_index, mask):
    captured.append(logits)
    return original(logits, probs, top_index, mask)

  @nnx.jit
  def run(model, batch):
    logprobs = policy.loss_logprobs(model, batch)   # the task losses without router terms
    out = {'sft_base': losses.sft_loss(logprobs, batch['completion_mask']),
           'grpo_base': losses.grpo_loss(logprobs, batch['old_logprobs'], batch['advantages'], batch['loss_mask'],
                                         num_sequences=n_seq, num_tokens=n_tok),
           'sft': sft.loss_fn(model, batch, COEFS), 'sft_pooled': sft.loss_fn(model, batch, POOLED),
           'grpo': grpo_update.loss_fn(model, batch, n_seq, n_tok, **GRPO, router_coefs=COEFS)}
    return list(captured[:2]), out   # the first forward's router logits (2 layers), as outputs of this trace

  moe.router_stats = capture
  try:
    logits, out = run(model, batch)
  finally:
    moe.router_stats = original
  logits = [np.asarray(x) for x in logits]
  assert len(logits) == 2 and logits[0].shape == (B, T, 4)
  mask = np.asarray(batch['attention_mask'])
  aux, z = _reference(logits, mask, MOE['num_experts_per_tok'], 'per_layer')
  pooled = _reference(logits, mask, MOE['num_experts_per_tok'], 'pooled')
  assert aux > 2.1 and z > 1.0          # unbalanced routing (uniform: 1 per layer, 2 in all)
  assert pooled[0] > 2.1                # (uniform: k = 2)
  assert abs(aux - _reference(logits, np.ones((B, T)), 2, 'per_layer')[0]) > 1e-3   # the padding would change it
  assert abs(aux - pooled[0]) > 1e-2    # the forms differ on this batch; z by L = 2 (every layer counts all tokens)
  assert z == pytest.approx(2 * pooled[1], rel=1e-12)
  return model, batch, aux, z, dict(jax.device_get(out), pooled_ref=pooled)


def test_sft_loss_adds_the_per_layer_router_losses_summed_over_the_sparse_layers(setup):
  model, batch, aux, z, out = setup
  (base, base_metrics), (loss, metrics) = out['sft_base'], out['sft']
  assert 'router_aux_loss' not in jax.eval_shape(lambda b: sft.loss_fn(model, b), batch)[1]   # coefficients 0
  assert float(metrics['router_aux_loss']) == pytest.approx(aux, rel=1e-5)
  assert float(metrics['router_z_loss']) == pytest.approx(z, rel=1e-5)
  assert float(loss) == pytest.approx(float(base) + COEFS[0] * aux + COEFS[1] * z, rel=1e-6)
  assert float(metrics['loss']) == float(loss) and float(metrics['nll_sum']) == float(base_metrics['nll_sum'])


def test_the_pooled_switch_gives_transformers_one_loss_over_the_pooled_layers(setup):
  _, _, _, _, out = setup
  (base, _), (loss, metrics) = out['sft_base'], out['sft_pooled']
  aux, z = out['pooled_ref']
  assert float(metrics['router_aux_loss']) == pytest.approx(aux, rel=1e-5)
  assert float(metrics['router_z_loss']) == pytest.approx(z, rel=1e-5)
  assert float(loss) == pytest.approx(float(base) + POOLED.aux * aux + POOLED.z * z, rel=1e-6)
  with pytest.raises(ValueError, match=r"router_loss_form='megatron': expected one of \('per_layer', 'pooled'\)"):
    moe.load_balancing_loss({'tokens': np.ones((1, 4))}, 'megatron')


def test_grpo_loss_adds_the_micro_batchs_share_of_the_router_losses(setup):
  """This micro-batch is half of its mini-batch (num_sequences = 2B): its router terms and metrics weigh 1/2, so
  the two halves of a step sum to the row-weighted mean."""
  _, _, aux, z, out = setup
  (base, base_metrics), (loss, metrics) = out['grpo_base'], out['grpo']
  assert float(metrics['router_aux_loss']) == pytest.approx(aux / 2, rel=1e-5)
  assert float(metrics['router_z_loss']) == pytest.approx(z / 2, rel=1e-5)
  assert float(loss) == pytest.approx(float(base) + (COEFS[0] * aux + COEFS[1] * z) / 2, rel=1e-5)
  assert float(metrics['pg_objective']) == float(base_metrics['pg_objective'])
  assert grpo_update.STEP_REDUCTIONS['router_aux_loss'] == 'mean'   # optimizer steps averaged, as the loss
  cfg = ml_collections.ConfigDict({'eps_low': 0.2, 'eps_high': 0.28, 'beta': 0.0, 'router_z_loss_coef': 1e-3})
  assert grpo_update.make_grad_fn(cfg) is grpo_update._grad_fn(0.2, 0.28, 0.0, 'seq_mean_token_mean', None, 1.0,
                                                               policy.RouterLoss(0.0, 1e-3, 'per_layer'))


def test_zero_coefficients_or_a_dense_model_trace_the_step_without_router_losses(setup):
  model, batch, _, _, _ = setup
  jaxpr = lambda m, coefs: str(jax.make_jaxpr(lambda b: sft.loss_fn(m, b, coefs))(batch))
  dense = _model('dense')
  assert jaxpr(dense, COEFS) == jaxpr(dense, (0.0, 0.0))
  assert jaxpr(model, COEFS) != jaxpr(model, (0.0, 0.0))
  assert policy.router_loss_coefs(None) == (0.0, 0.0, 'per_layer')
  assert policy.router_loss_coefs(ml_collections.ConfigDict({'router_aux_loss_coef': 0.01})) == (0.01, 0.0,
                                                                                                 'per_layer')
  assert policy.router_loss_coefs(ml_collections.ConfigDict({'router_loss_form': 'pooled'})).form == 'pooled'

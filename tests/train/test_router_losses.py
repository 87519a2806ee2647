"""The MoE router losses in the trainers' losses (PAPER.md Official run settings, MoE row: aux 0.01, z 1e-3):
SFT's loss is L_SFT + 0.01 aux + 1e-3 z and GRPO's −J + the micro-batch's row share of the same, with aux and z
recomputed here in float64 from the router logits of the forward pass (captured in an eager run), as transformers'
`load_balancing_loss_func` (attention mask, top-k counts, layers pooled) and the ST-MoE z-loss define them; the
padding tokens do not count. Coefficients 0, or a dense model, trace the program of a step without router losses.
(The router statistics themselves are held to transformers in tests/models/test_moe.py.)"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import moe, rope
from osvl_jax.rl import losses
from osvl_jax.train import grpo_update, policy, sft

MOE = {'num_experts': 4, 'num_experts_per_tok': 2, 'moe_intermediate_size': 32}   # = Qwen3VLConfig.tiny_moe()
COEFS = (0.01, 1e-3)
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


def _reference(logits: list[np.ndarray], mask: np.ndarray, k: int) -> tuple[float, float]:
  """float64 (aux, z) from each sparse layer's router logits [B, T, E]: transformers' `load_balancing_loss_func`
  with the attention mask (top-k assignment counts and probabilities summed over layers and real tokens, divided
  by layers x real tokens; E · Σ_e f_e P_e), and mean over layers and real tokens of logsumexp(logits)^2."""
  m = mask.reshape(-1).astype(np.float64)
  e = logits[0].shape[-1]
  counts, probs, z = np.zeros(e), np.zeros(e), 0.0
  for layer in logits:
    x = np.asarray(layer, np.float64).reshape(-1, e)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    p = np.exp(x - lse[:, None])
    top = np.argsort(-p, axis=-1, kind='stable')[:, :k]
    counts += np.bincount(top.reshape(-1), weights=np.repeat(m, k), minlength=e)
    probs += (p * m[:, None]).sum(0)
    z += float((lse ** 2 * m).sum())
  rows = len(logits) * m.sum()
  return float(e * np.sum(counts / rows * probs / rows)), z / rows


GRPO = dict(eps_low=0.2, eps_high=0.28, beta=0.0, aggregation='seq_mean_token_mean', clip_ratio_c=None)


@pytest.fixture(scope='module')
def setup():
  """(model, batch, reference aux, reference z, the losses): the router logits of the forward pass, the task losses
  and the SFT / GRPO losses with the coefficients (GRPO's micro-batch as half of its mini-batch: num_sequences =
  2B), all from one jitted call (one compile)."""
  model, batch = _model(), policy.device_batch(_batch())
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
           'sft': sft.loss_fn(model, batch, COEFS),
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
  aux, z = _reference(logits, mask, MOE['num_experts_per_tok'])
  assert aux > 2.1 and z > 1.0          # unbalanced routing (uniform: aux = k = 2)
  assert abs(aux - _reference(logits, np.ones((B, T)), 2)[0]) > 1e-3   # the padding would change it
  return model, batch, aux, z, jax.device_get(out)


def test_sft_loss_adds_the_router_losses_over_the_real_tokens(setup):
  model, batch, aux, z, out = setup
  (base, base_metrics), (loss, metrics) = out['sft_base'], out['sft']
  assert 'router_aux_loss' not in jax.eval_shape(lambda b: sft.loss_fn(model, b), batch)[1]   # coefficients 0
  assert float(metrics['router_aux_loss']) == pytest.approx(aux, rel=1e-5)
  assert float(metrics['router_z_loss']) == pytest.approx(z, rel=1e-5)
  assert float(loss) == pytest.approx(float(base) + COEFS[0] * aux + COEFS[1] * z, rel=1e-6)
  assert float(metrics['loss']) == float(loss) and float(metrics['nll_sum']) == float(base_metrics['nll_sum'])


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
                                                               (0.0, 1e-3))   # the config's coefficients


def test_zero_coefficients_or_a_dense_model_trace_the_step_without_router_losses(setup):
  model, batch, _, _, _ = setup
  jaxpr = lambda m, coefs: str(jax.make_jaxpr(lambda b: sft.loss_fn(m, b, coefs))(batch))
  dense = _model('dense')
  assert jaxpr(dense, COEFS) == jaxpr(dense, (0.0, 0.0))
  assert jaxpr(model, COEFS) != jaxpr(model, (0.0, 0.0))
  assert policy.router_loss_coefs(None) == (0.0, 0.0)
  assert policy.router_loss_coefs(ml_collections.ConfigDict({'router_aux_loss_coef': 0.01})) == (0.01, 0.0)

"""The GRPO update schedule: mini-batches of whole groups, PPO epochs, micro-batches, old log-probs computed once,
clip statistics, train–inference mismatch and TIS (osvl_jax/train/grpo_update.py; DESIGN.md §6).

A rollout batch of B = 2 prompts × G = 2 real trajectories (tokenizer, an image per question, a crop image on one
row), rows interleaved (p0, p1, p0, p1) so that grouping by prompt_id is exercised, through the tiny Qwen3-VL.
"""

import pathlib
import sys

import jax
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.rl import losses
from osvl_jax.train import grpo_batch, grpo_update, policy, update_rows
from tools import base

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets (batching.bucket_sizes)

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 16, 'height': 16}})
RIGHT = tj.render_assistant_text('It is Agra.', response='Agra')
WRONG = tj.render_assistant_text('It is Delhi, a city of the north.', response='Delhi')
LR = 3e-3  # large: the first step moves the policy enough that the clip acts on the second


def _trajectory(g: int, i: int) -> tj.Trajectory:
  tokenizer = tj.load_tokenizer()
  builder = tj.TrajectoryBuilder(tokenizer, tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start(f'Which city is shown, case {g}?', np.full((32, 32, 3), 40 * g, np.uint8))
  if g == 1 and i == 1:
    builder.append_assistant_text(CROP)
    builder.append_observation(base.ToolResult(ok=True, text='Cropped.', images=[np.zeros((32, 32, 3), np.uint8)]))
  builder.append_assistant_text(RIGHT if (g + i) % 2 == 0 else WRONG)
  return builder.finish(prompt_id=f'p{g}', sample_index=i, answers=['Agra'])


def _cfg(**kw):
  base_cfg = dict(alpha=0.8, num_generations=2, fatal_mode='mask_clamp', delta=1e-6, eps_low=0.2, eps_high=0.28,
                  beta=0.0, aggregation='seq_mean_token_mean', length_buckets=LENGTH_BUCKETS, loss_bucket=16,
                  mini_batch_prompts=0, ppo_epochs=1, micro_batch_size=0, tis_cap=None)
  return ml_collections.ConfigDict(dict(base_cfg, **kw))


@pytest.fixture(scope='module')
def setup():
  trajectories = [_trajectory(g, i) for i in range(2) for g in range(2)]  # rows: p0, p1, p0, p1
  batch, grid, _, _ = grpo_batch.prepare_batch(trajectories, _cfg())
  batch.pop('rewards'), batch.pop('fatal_steps')
  assert np.all(batch['advantages'] != 0)
  model = model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0))
  return model, batch, grid, [t.prompt_id for t in trajectories]


def _fresh(model, tx=None):
  """A copy of `model` and its optimizer: the trainer's AdamW at LR, or `tx`."""
  model = nnx.clone(model)
  return model, nnx.Optimizer(model, tx or policy.make_tx(LR, 10, warmup_steps=0, grad_clip=1.0), wrt=nnx.Param)


def _sgd():
  """Plain SGD: the step is −lr · g, so equal gradients give equal parameters (AdamW's g / (|g| + ε) would blow
  float rounding of near-zero gradients up to a whole step)."""
  return optax.sgd(1.0)


def _params(model):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))]


def _eq12_loss(new, old, adv, mask, eps_low=0.2, eps_high=0.28, weights=None):
  """−J of Eq. 12 in numpy (float64): per-row token mean of min(ρÂ, clip(ρ)Â) (× TIS weight), mean over rows."""
  new, old, mask = (np.asarray(x, np.float64) for x in (new, old, mask))
  ratio = np.exp(np.where(mask > 0, new - old, 0.0))
  adv = np.asarray(adv, np.float64)[:, None]
  surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - eps_low, 1 + eps_high) * adv)
  if weights is not None:
    surrogate = surrogate * weights
  row = (surrogate * mask).sum(1) / np.maximum(mask.sum(1), 1)
  low = np.sum((mask > 0) & (ratio < 1 - eps_low) & (adv < 0))
  high = np.sum((mask > 0) & (ratio > 1 + eps_high) & (adv > 0))
  return -row.mean(), low / mask.sum(), high / mask.sum()



def _logprobs(model, batch: dict, grid: tuple, temperature=1.0):
  """`grpo_update.logprob_fn` on a host batch, placed as the update places it (no mesh: `default_place`)."""
  return grpo_update.logprob_fn(model, grpo_update.default_place(model.config.vision)(
      grpo_update.with_grid(batch, grid)), np.float32(temperature))

def test_mini_batch_rows_keep_groups_whole():
  assert [r.tolist() for r in update_rows.mini_batch_rows(['a', 'b', 'a', 'b'], 1)] == [[0, 2], [1, 3]]
  assert [r.tolist() for r in update_rows.mini_batch_rows(['a', 'b', 'a', 'b'], 0)] == [[0, 1, 2, 3]]
  # a prompt drawn twice is one group of 2G: it stays whole
  assert [r.tolist() for r in update_rows.mini_batch_rows(['c', 'a', 'a', 'c', 'a', 'a'], 1)] == [[0, 3],
                                                                                                  [1, 2, 4, 5]]


def test_take_rows_carries_each_rows_images(setup):
  _, batch, grid, _ = setup
  part, part_grid = update_rows.take_rows(batch, grid, [3, 0])
  # grids in row-major order: row 0 q-image, row 1 q-image, row 2 q-image, row 3 q-image + crop
  assert len(grid) == 5 and part_grid == (grid[3], grid[4], grid[0])
  patches = [int(np.prod(g)) for g in grid]
  starts = np.cumsum([0] + patches)
  want = np.concatenate([batch['pixel_values'][starts[3]:starts[5]], batch['pixel_values'][starts[0]:starts[1]]])
  np.testing.assert_array_equal(part['pixel_values'], want)
  np.testing.assert_array_equal(part['position_ids'], batch['position_ids'][:, [3, 0]])
  np.testing.assert_array_equal(part['loss_mask'], batch['loss_mask'][[3, 0]])


@pytest.mark.parametrize('temperature', [1.0, 0.7])
def test_two_mini_batches_two_steps_first_on_policy_second_clipped_as_eq12(setup, temperature):
  """At the rollout temperature T (grpo.temperature) π_old and π_θ are both log_softmax(logits / T): the first
  step is exactly on policy, the second is Eq. 12 on tempered log-probs."""
  model0, batch, grid, pids = setup
  update = grpo_update.make_update_fn(_cfg(mini_batch_prompts=1, temperature=temperature))
  model, optimizer = _fresh(model0)
  out, steps = update(model, optimizer, batch, grid, pids)
  assert len(steps) == out['optimizer_steps'] == out['mini_batches'] == 2
  first, second = steps
  assert first['clip_frac'] == first['clip_frac_low'] == first['clip_frac_high'] == 0.0  # ρ ≡ 1
  assert abs(first['approx_kl']) < 1e-6 and first['ratio_mean'] == pytest.approx(1.0, abs=1e-6)
  assert second['clip_frac'] > 0 and abs(second['approx_kl']) > 1e-3

  # By hand: the policy after the first step alone (group p0 = rows 0, 2), then Eq. 12 on rows 1, 3 with
  # π_old = the initial policy.
  rows0, rows1 = np.array([0, 2]), np.array([1, 3])
  model1, optimizer1 = _fresh(model0)
  part0, grid0 = update_rows.take_rows(batch, grid, rows0)
  _, only_first = update(model1, optimizer1, part0, grid0, [pids[r] for r in rows0])
  assert only_first[0]['grad_norm'] == pytest.approx(first['grad_norm'], rel=1e-5)  # the same first step
  part1, grid1 = update_rows.take_rows(batch, grid, rows1)
  old = np.asarray(_logprobs(model0, part1, grid1, temperature))
  new = np.asarray(_logprobs(model1, part1, grid1, temperature))
  want, low, high = _eq12_loss(new, old, part1['advantages'], part1['loss_mask'])
  assert second['loss'] == pytest.approx(want, rel=1e-4, abs=1e-6)
  assert second['clip_frac_low'] == pytest.approx(low, abs=1e-6)
  assert second['clip_frac_high'] == pytest.approx(high, abs=1e-6)
  # the rollout-step record: step losses averaged, ratio_max the largest, grad norms averaged
  assert out['loss'] == pytest.approx((first['loss'] + second['loss']) / 2, rel=1e-6)
  assert out['ratio_max'] == max(first['ratio_max'], second['ratio_max'])
  assert out['grad_norm'] == pytest.approx((first['grad_norm'] + second['grad_norm']) / 2, rel=1e-6)
  assert out['grad_norm_max'] == max(first['grad_norm'], second['grad_norm']) > 0


def test_whole_batch_one_epoch_is_the_one_step_update(setup):
  model0, batch, grid, pids = setup
  model, optimizer = _fresh(model0, _sgd())
  out, steps = grpo_update.make_update_fn(_cfg())(model, optimizer, batch, grid, pids)
  assert len(steps) == 1 and out['clip_frac'] == 0.0

  # the one-step update written out (jitted, as the trainer's): old log-probs from the same weights, one step on −J
  ref, ref_opt = _fresh(model0, _sgd())
  full = grpo_update.default_place(model0.config.vision)(grpo_update.with_grid(batch, grid))  # the trainer's layout
  old = nnx.jit(lambda m: policy.loss_logprobs(m, full))(ref)  # the batch a closed-over constant

  @nnx.jit
  def step(m, opt):
    loss_fn = lambda m: losses.grpo_loss(policy.loss_logprobs(m, full), old, full['advantages'],
                                         full['loss_mask'])[0]
    loss, grads = nnx.value_and_grad(loss_fn)(m)
    opt.update(m, grads)
    return loss, optax.tree.norm(grads)

  loss, norm = step(ref, ref_opt)
  # ρ = 1: −mean Â ≈ 0 (groups centred), a difference of near-equal terms: compared against their size (mean |Â|).
  scale = float(np.mean(np.abs(batch['advantages'])))
  assert steps[0]['loss'] == pytest.approx(float(loss), abs=1e-5 * scale)
  assert steps[0]['grad_norm'] == pytest.approx(float(norm), rel=1e-5)
  # The two programs sum the gradient in another order (another fusion, another machine): each parameter's SGD step
  # −g is compared against the size of that leaf's step (float32 sums: ~1e-6 relative), plus the rounding of the
  # parameter itself (a few ulps of its largest value).
  for a, b, p0 in zip(_params(model), _params(ref), _params(model0)):
    size = np.abs(b - p0).max()
    np.testing.assert_allclose(a - p0, b - p0, rtol=0, atol=1e-5 * size + 4 * np.spacing(np.abs(p0).max()))


def test_two_epochs_give_twice_the_steps_and_micro_batches_the_same_update(setup):
  model0, batch, grid, pids = setup
  model, optimizer = _fresh(model0)
  out, steps = grpo_update.make_update_fn(_cfg(mini_batch_prompts=1, ppo_epochs=2))(model, optimizer, batch,
                                                                                     grid, pids)
  assert len(steps) == out['optimizer_steps'] == 4 and out['mini_batches'] == 2
  assert abs(steps[2]['approx_kl']) > 1e-3  # epoch 2 starts off-policy: π_old stays the rollout-time policy

  plain, plain_opt = _fresh(model0, _sgd())
  _, plain_steps = grpo_update.make_update_fn(_cfg(mini_batch_prompts=1))(plain, plain_opt, batch, grid, pids)
  micro, micro_opt = _fresh(model0, _sgd())
  out, micro_steps = grpo_update.make_update_fn(_cfg(mini_batch_prompts=1, micro_batch_size=1))(
      micro, micro_opt, batch, grid, pids)
  assert out['micro_batches'] == 2
  # The loss is a difference of near-equal terms ρ_it Â_i (groups are centred): it is compared against the size of
  # those terms (≈ mean |Â|), not against itself; float32 sums of them differ by ~1e-7 of it between machines.
  scale = float(np.mean(np.abs(batch['advantages'])))
  for p, m in zip(plain_steps, micro_steps):
    assert m['loss'] == pytest.approx(p['loss'], abs=1e-5 * scale)
    assert m['grad_norm'] == pytest.approx(p['grad_norm'], rel=1e-5)
    # ρ = exp(log π − log π_old): its relative error is the absolute error of a difference of log-probs of size
    # ~|log p| ≈ 12 (float32: ~1e-6 each), so both are compared at 1e-4 relative, 1e-6 absolute (on-policy ≈ 0).
    assert m['ratio_mean'] == pytest.approx(p['ratio_mean'], rel=1e-4)
    assert m['approx_kl'] == pytest.approx(p['approx_kl'], rel=1e-4, abs=1e-6)
  for a, b in zip(_params(plain), _params(micro)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_tis_weights_the_first_steps_loss_by_min_ratio_cap(setup):
  model0, batch, grid, pids = setup
  old = np.asarray(_logprobs(model0, batch, grid))
  # engine log-probs: π_old / π_rollout = 3 on even tokens (capped at C = 2), 0.5 on odd ones; row 3 unknown (0s)
  shift = np.where(np.arange(old.shape[1]) % 2 == 0, -np.log(3.0), np.log(2.0))[None, :]
  rollout = np.where(batch['completion_mask'], old + shift, 0.0).astype(np.float32)
  rollout[3] = 0.0
  model, optimizer = _fresh(model0)
  out, steps = grpo_update.make_update_fn(_cfg(mini_batch_prompts=1, tis_cap=2.0))(
      model, optimizer, dict(batch, rollout_logprobs=rollout), grid, pids)
  mask = batch['loss_mask']
  weights = np.where(np.arange(old.shape[1]) % 2 == 0, 2.0, 0.5)[None, :] * np.ones_like(old)
  rows0 = [0, 2]  # the first mini-batch: ρ ≡ 1, so −J = −mean_i Â_i · mean_t w_it
  want, _, _ = _eq12_loss(old[rows0], old[rows0], batch['advantages'][rows0], mask[rows0], weights=weights[rows0])
  # −J sums terms Â_i · w_it of size ~|Â| · mean w that nearly cancel (Â centred per group): the tolerance is a
  # float32 rounding of those terms, not of their small difference (which would depend on summation order).
  scale = float(np.mean(np.abs(batch['advantages'][rows0]))) * 1.25
  assert abs(want) > 100 * 1e-5 * scale  # TIS moves the loss far beyond the tolerance (unweighted −mean Â ≈ 0)
  assert steps[0]['loss'] == pytest.approx(want, abs=1e-5 * scale)
  on = (mask > 0)[:3]
  assert out['logprob_mismatch_tokens'] == on.sum()
  ratio = np.where(np.arange(old.shape[1]) % 2 == 0, 3.0, 0.5)[None, :] * np.ones((3, old.shape[1]))
  assert out['logprob_mismatch_ratio_max'] == pytest.approx(3.0, rel=1e-5)
  assert out['logprob_mismatch_ratio_std'] == pytest.approx(np.std(ratio[on]), rel=1e-4)
  assert out['tis_capped_frac'] == pytest.approx(np.mean(ratio[on] > 2.0))


def test_tis_weights_reach_the_gradient(setup):
  """With π_old / π_rollout = 0.5 on every token (under the cap), TIS weights every token's loss by 0.5: the first
  step's gradient is exactly half the untempered one's (its norm too), whatever the summation order."""
  model0, batch, grid, pids = setup
  old = np.asarray(_logprobs(model0, batch, grid))
  rollout = np.where(batch['completion_mask'], old + np.log(2.0), 0.0).astype(np.float32)
  runs = {}
  for cap in (None, 2.0):
    model, optimizer = _fresh(model0, _sgd())
    out, steps = grpo_update.make_update_fn(_cfg(tis_cap=cap))(
        model, optimizer, dict(batch, rollout_logprobs=rollout), grid, pids)
    runs[cap] = steps[0]
  assert runs[2.0]['grad_norm'] == pytest.approx(0.5 * runs[None]['grad_norm'], rel=1e-4)
  assert runs[None]['grad_norm'] > 0


def test_the_mismatch_alarm_stops_the_update_before_any_optimizer_step(setup):
  """A rollout batch whose engine log-probs are off by ln 2 on every token (mean |Δ| = 0.69) stops the update at
  `grpo.max_logprob_mismatch=0.5`, naming the figure, with the parameters untouched; when those rows are stale
  (rolled out by an earlier version) the figure is logged and the step taken; one on-policy row of them trips it."""
  model0, batch, grid, pids = setup
  old = np.asarray(_logprobs(model0, batch, grid))
  rollout = np.where(batch['completion_mask'], old + np.log(2.0), 0.0).astype(np.float32)
  model, optimizer = _fresh(model0, _sgd())
  before = _params(model)
  with pytest.raises(grpo_update.MismatchAlarm, match=r'logprob_mismatch_abs_mean=0.693\d* .* exceeds '
                                                      r'grpo.max_logprob_mismatch=0.5'):
    grpo_update.make_update_fn(_cfg(max_logprob_mismatch=0.5))(model, optimizer, dict(batch, rollout_logprobs=rollout),
                                                              grid, pids)
  assert all(np.array_equal(a, b) for a, b in zip(before, _params(model)))
  # The trainer names the rows rolled out by the weights being updated: stale rows' gap is policy lag, not alarm.
  stale = dict(batch, rollout_logprobs=rollout, on_policy_rows=np.zeros(len(pids), bool))
  out, _ = grpo_update.make_update_fn(_cfg(max_logprob_mismatch=0.5))(model, optimizer, stale, grid, pids)
  assert out['logprob_mismatch_abs_mean'] == pytest.approx(np.log(2.0), rel=1e-4)
  assert out['logprob_mismatch_on_policy_tokens'] == 0
  assert not all(np.array_equal(a, b) for a, b in zip(before, _params(model)))  # the step was taken
  one = np.arange(len(pids)) == 0
  with pytest.raises(grpo_update.MismatchAlarm, match=r'logprob_mismatch_on_policy_abs_mean=0.693'):
    grpo_update.make_update_fn(_cfg(max_logprob_mismatch=0.5))(
        model, optimizer, dict(stale, on_policy_rows=one, rollout_logprobs=np.where(
            batch['completion_mask'], np.asarray(_logprobs(model, batch, grid)) + np.log(2.0), 0.0).astype(
                np.float32)), grid, pids)


def test_mismatch_metrics_and_tis_weights_on_hand_made_logprobs():
  old = np.log(np.array([[0.5, 0.25, 0.9], [0.5, 0.5, 0.5], [0.1, 0.2, 0.3]], np.float32))
  rollout = np.log(np.array([[0.25, 0.5, 0.9], [0.5, 0.125, 1.0], [1.0, 1.0, 1.0]], np.float32))
  rollout[2] = 0.0  # an engine without log-probs
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]], np.float32)
  batch = {'input_ids': np.zeros((3, 4)), 'rollout_logprobs': rollout, 'completion_mask': mask > 0}
  known = grpo_update.rollout_logprob_rows(batch)
  assert known.tolist() == [True, True, False]
  m = grpo_update.mismatch_metrics(old, rollout, known, mask, tis_cap=2.5)
  # tokens: ratios 2, 0.5 (row 0); 1, 4, 0.5 (row 1); |Δ log p| = ln2, ln2, 0, ln4, ln2 -> 5 ln2 / 5 = ln 2
  ratios = np.array([2.0, 0.5, 1.0, 4.0, 0.5])
  assert m['logprob_mismatch_tokens'] == 5
  assert m['logprob_mismatch_abs_mean'] == pytest.approx(np.log(2.0), rel=1e-6)
  assert m['logprob_mismatch_ratio_max'] == pytest.approx(4.0, rel=1e-6)
  assert m['logprob_mismatch_ratio_mean'] == pytest.approx(1.6, rel=1e-6)
  assert m['logprob_mismatch_ratio_std'] == pytest.approx(np.std(ratios), rel=1e-6)
  assert m['tis_capped_frac'] == pytest.approx(0.2)  # only the 4
  w = grpo_update.tis_weights(old, rollout, known, mask, 2.5)  # masked and unknown tokens: 1
  np.testing.assert_allclose(w, [[2.0, 0.5, 1.0], [1.0, 2.5, 0.5], [1.0, 1.0, 1.0]], rtol=1e-6)


@pytest.mark.parametrize('field, value, match', [
    ('mini_batch_prompts', 3, 'grpo.mini_batch_prompts=3 does not divide grpo.prompts_per_step=4'),
    ('mini_batch_prompts', -1, 'grpo.mini_batch_prompts=-1'),
    ('ppo_epochs', 0, 'grpo.ppo_epochs=0'),
    ('tis_cap', -1.0, 'grpo.tis_cap=-1.0'), ('max_staleness', -1, 'grpo.max_staleness=-1'),
    ('micro_batch_size', 3, 'grpo.micro_batch_size=3 does not divide a mini-batch of 8'),
])
def test_check_update_config_names_the_field(field, value, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  grpo_update.check_update_config(c)  # the demo passes
  c.grpo.prompts_per_step, c.grpo.num_generations, c.grpo.mini_batch_prompts = 4, 4, 2
  grpo_update.check_update_config(c)  # 2 mini-batches of 2 prompts × 4 samples
  c.grpo.tis_cap = 2.0
  grpo_update.check_update_config(c)
  c.grpo[field] = value
  with pytest.raises(ValueError, match=match):
    grpo_update.check_update_config(c)


def test_update_refuses_prompt_ids_of_another_length_and_beta_without_reference(setup):
  model0, batch, grid, pids = setup
  model, optimizer = _fresh(model0, _sgd())
  with pytest.raises(ValueError, match='prompt_ids has 3 entries for a batch of 4 rows'):
    grpo_update.make_update_fn(_cfg())(model, optimizer, batch, grid, pids[:3])
  with pytest.raises(ValueError, match='grpo.beta=0.1 needs ref_model'):
    grpo_update.make_update_fn(_cfg(beta=0.1))(model, optimizer, batch, grid, pids)


def _two_per_row(batch):
  """A packed row budget that holds the batch's two longest trajectories: its 4 rows pack into 2 rows."""
  tokens = np.asarray(batch['attention_mask']).sum(1)
  return int(np.sort(tokens)[-2:].sum())


def test_pack_batch_concatenates_rows_and_unpacks_back(setup):
  """update_rows.pack_batch: packed row r is its trajectories' real tokens one after the other (segment ids j + 1,
  positions as collated), their loss entries concatenated with loss_positions shifted by the row offset, each
  loss token carrying its trajectory's advantage and Σ loss_mask; images in packed order; unpack_loss_values
  writes a packed [R, K] back to the trajectories' rows."""
  _, batch, grid, _ = setup
  tokens = np.asarray(batch['attention_mask']).sum(1)
  n_loss = np.asarray(batch['completion_mask']).sum(1)
  rows = [[3, 0], [2], []]
  length, k = int(tokens[3] + tokens[0]) + 5, int(n_loss[3] + n_loss[0]) + 3
  packed, packed_grid = update_rows.pack_batch(batch, grid, rows, length, k)
  assert packed_grid == update_rows.take_rows(batch, grid, [3, 0, 2])[1]
  t3 = int(tokens[3])
  np.testing.assert_array_equal(packed['input_ids'][0, :t3], batch['input_ids'][3, :t3])
  np.testing.assert_array_equal(packed['input_ids'][0, t3:t3 + tokens[0]], batch['input_ids'][0, :tokens[0]])
  np.testing.assert_array_equal(packed['attention_mask'][0], np.repeat([1, 2, 0], [t3, tokens[0], 5]))
  np.testing.assert_array_equal(packed['position_ids'][:, 0, t3:t3 + tokens[0]],
                                batch['position_ids'][:, 0, :tokens[0]])
  assert not packed['attention_mask'][2].any() and not packed['completion_mask'][2].any()
  n3 = int(n_loss[3])
  np.testing.assert_array_equal(packed['loss_positions'][0, n3:n3 + n_loss[0]],
                                batch['loss_positions'][0, :n_loss[0]] + t3)
  np.testing.assert_array_equal(packed['advantages'][0, :n3], np.full(n3, batch['advantages'][3]))
  np.testing.assert_array_equal(packed['sequence_tokens'][0, n3:n3 + n_loss[0]],
                                np.full(n_loss[0], batch['loss_mask'][0].sum()))
  out = np.zeros_like(batch['loss_mask'])
  update_rows.unpack_loss_values(packed['loss_mask'], rows, n_loss, out)
  np.testing.assert_array_equal(out[[0, 2, 3]], batch['loss_mask'][[0, 2, 3]])
  with pytest.raises(ValueError, match='over the budget'):
    update_rows.pack_batch(batch, grid, [[3, 0, 2]], length, k)


@pytest.mark.parametrize('aggregation', ['seq_mean_token_mean'])
def test_packed_update_is_the_unpacked_update(setup, aggregation):
  """grpo.pack_rows: the 4 trajectories packed two per row into one-row micro-batches give π_old, the losses, clip
  statistics, sequence and token counts, gradient norms and parameters of the unpacked update, over two epochs (the
  second off-policy, the clip acting). Eq. 12's per-trajectory means are the aggregation packing must take apart;
  every aggregation's packed loss is checked on hand-made arrays in tests/rl/test_losses.py."""
  model0, batch, grid, pids = setup
  length = _two_per_row(batch)
  packing = update_rows.Packing(1, length, length)
  parts = update_rows.pack_parts(batch, grid, np.arange(4), packing)
  assert len(parts) == 2 and all(len(rows[0]) == 2 for _, _, rows in parts)
  place = grpo_update.default_place(model0.config.vision)
  packed_old = grpo_update.batch_logprobs(model0, batch, grid, 0, place, packing=packing)
  plain_old = grpo_update.batch_logprobs(model0, batch, grid, 0, place)
  on = np.asarray(batch['completion_mask'])
  np.testing.assert_allclose(packed_old[on], plain_old[on], atol=2e-5, rtol=0)   # log-probs ~ -12: ~15 ulps

  cfg = dict(aggregation=aggregation, ppo_epochs=2)
  plain, plain_opt = _fresh(model0, _sgd())
  out_p, steps_p = grpo_update.make_update_fn(_cfg(**cfg))(plain, plain_opt, batch, grid, pids)
  packed, packed_opt = _fresh(model0, _sgd())
  out_k, steps_k = grpo_update.make_update_fn(_cfg(**cfg, pack_rows=1, length_buckets=(length,)))(
      packed, packed_opt, batch, grid, pids)
  assert out_k['micro_batches'] == 2 and out_p['micro_batches'] == 1 and len(steps_k) == len(steps_p) == 2
  for p, k in zip(steps_p, steps_k):
    # The loss sums ρ_it Â_i: near 0 on policy (groups centred: compared against mean |Â|), far from it once SGD
    # at lr 1 has moved π_θ (compared against itself).
    scale = max(float(np.mean(np.abs(batch['advantages']))), abs(p['loss']))
    assert k['loss'] == pytest.approx(p['loss'], abs=1e-5 * scale)
    assert k['grad_norm'] == pytest.approx(p['grad_norm'], rel=1e-5)
    assert (k['num_tokens'], k['num_sequences_with_tokens']) == (p['num_tokens'], p['num_sequences_with_tokens'])
    for key in ('clip_frac', 'clip_frac_low', 'clip_frac_high'):
      assert k[key] == pytest.approx(p[key], abs=1e-6)
    assert k['ratio_mean'] == pytest.approx(p['ratio_mean'], rel=1e-4)
  assert steps_p[1]['clip_frac'] > 0
  for a, b, p0 in zip(_params(packed), _params(plain), _params(model0)):
    size = np.abs(b - p0).max()
    np.testing.assert_allclose(a - p0, b - p0, rtol=0, atol=1e-5 * size + 4 * np.spacing(np.abs(p0).max()))


@pytest.mark.parametrize('threshold', [None, 0.5])
def test_non_finite_engine_logprobs_stop_the_update_naming_the_row(setup, threshold):
  """A NaN (or infinite) engine log-prob on a completion token is no mismatch figure (NaN > 0.5 is False, so the
  alarm stayed quiet and the step was taken): the update refuses the batch, naming the row and the value, before any
  optimizer step, whether or not the alarm is on."""
  model0, batch, grid, pids = setup
  old = np.asarray(_logprobs(model0, batch, grid))
  rollout = np.where(batch['completion_mask'], old, 0.0).astype(np.float32)
  token = int(np.flatnonzero(batch['completion_mask'][2])[3])
  rollout[2, token] = np.nan
  model, optimizer = _fresh(model0, _sgd())
  before = _params(model)
  with pytest.raises(ValueError, match=rf"rollout_logprobs: nan at loss position {token} of row 2 \(prompt_id 'p0'; "
                                       r'1 such tokens'):
    grpo_update.make_update_fn(_cfg(max_logprob_mismatch=threshold))(
        model, optimizer, dict(batch, rollout_logprobs=rollout), grid, pids)
  assert all(np.array_equal(a, b) for a, b in zip(before, _params(model)))
  # Off the completion tokens (padding), a NaN is never read: the update runs.
  rollout[2, token] = old[2, token]
  rollout[0, -1] = np.inf if not batch['completion_mask'][0, -1] else rollout[0, -1]
  grpo_update.make_update_fn(_cfg(max_logprob_mismatch=threshold))(
      model, optimizer, dict(batch, rollout_logprobs=rollout), grid, pids)
  assert not all(np.array_equal(a, b) for a, b in zip(before, _params(model)))


def test_the_mismatch_alarm_rings_on_a_nan_figure():
  with pytest.raises(grpo_update.MismatchAlarm, match='logprob_mismatch_abs_mean=nan'):
    grpo_update.check_mismatch({'logprob_mismatch_abs_mean': float('nan'), 'logprob_mismatch_tokens': 3}, 0.5)
  grpo_update.check_mismatch({'logprob_mismatch_abs_mean': float('nan'), 'logprob_mismatch_tokens': 3}, None)

"""Trainer plumbing: token-exact batches, SFT learning, resume-from-workdir identity, one GRPO step."""

import dataclasses
import json
import pathlib
import sys
import types

import datasets
import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.train import batching, data as train_data, grpo_batch, metrics, placement, policy, policy_config, sft
from tools import env as tools_env

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

SEARCH = tj.render_assistant_text('Find the place.', tool_call={'name': 'text_search',
                                                                 'arguments': {'query': 'Taj Mahal', 'top_k': 1}})
ANSWER = tj.render_assistant_text('It is Agra.', response='Agra')


def _episodes(script, n=2):
  """n real episodes of a scripted policy (the assistant turns `script`) on a 64x64 image, text_search available."""
  tokenizer = tj.load_tokenizer()
  env = tools_env.ToolEnv({'enabled': ('text_search',)})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  rng = np.random.default_rng(0)
  items = [{'prompt_id': f'q{i}', 'question': 'Which city is this?', 'answers': ['Agra'],
            'image': rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)} for i in range(n)]
  engine = engine_lib.ScriptedEngine(list(script), tokenizer)
  return agent_loop.run_episodes(engine, env, lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                 items, num_generations=1, max_turns=4)


@pytest.fixture(scope='module')
def trajectories():
  """Two real two-step episodes (text_search then response) with a 64x64 image, from a scripted policy."""
  return _episodes([SEARCH, ANSWER])


def test_collate_gathers_exactly_the_emitted_next_tokens(trajectories):
  batch = batching.collate(trajectories, length_multiple=128, loss_multiple=32)
  for i, traj in enumerate(trajectories):
    emitted = np.nonzero(traj.gen_mask)[0]
    n = len(emitted)
    assert batch['completion_mask'][i].sum() == n
    np.testing.assert_array_equal(batch['loss_positions'][i, :n], emitted - 1)
    np.testing.assert_array_equal(batch['loss_targets'][i, :n], traj.token_ids[emitted])
    np.testing.assert_array_equal(batch['loss_step'][i, :n], traj.step_of_token[emitted])
    np.testing.assert_array_equal(batch['input_ids'][i, :len(traj.token_ids)], traj.token_ids)
    assert not batch['attention_mask'][i, len(traj.token_ids):].any()
  np.testing.assert_array_equal(batch['pixel_values'],
                                np.concatenate([t.images[0].pixel_values for t in trajectories]))
  # Positions against the HF reference (transformers' Qwen3-VL get_rope_index; see models/qwen3_vl/parity.py).
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=import-outside-toplevel
  hf = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**Qwen3VLConfig.tiny().to_hf_dict()))
  ids = torch.tensor(batch['input_ids'], dtype=torch.long)
  expected, _ = hf.model.get_rope_index(ids, (ids == tj.IMAGE_PAD_ID).int(),
                                        torch.tensor(batch['image_grid_thw'], dtype=torch.long),
                                        attention_mask=torch.tensor(batch['attention_mask'].astype(np.int64)))
  np.testing.assert_array_equal(batch['position_ids'], expected.numpy())
  assert batch['input_ids'].shape[1] % 128 == 0 and batch['loss_positions'].shape[1] % 32 == 0


def test_collate_rejects_a_fixed_length_below_the_batch(trajectories):
  with pytest.raises(ValueError, match='fixed length'):
    batching.collate(trajectories, length=16)


def _write_sft_dataset(trajectories, out: pathlib.Path):
  folder = out / 'sft'
  datasets.Dataset.from_list([t.to_record() for t in trajectories], features=tj.record_features()).save_to_disk(
      str(folder))
  (folder / 'counts.json').write_text(json.dumps({'kept': len(trajectories)}))


def _config(data_dir, steps):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.data.dir = str(data_dir)
  c.sft.update(steps=steps, batch_size=2, lr=3e-3, warmup_steps=1, log_every=1, ckpt_every=2)
  return c


def _params(model):
  return jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))


def test_sft_loss_falls_and_a_resumed_run_equals_an_uninterrupted_one(trajectories, tmp_path):
  _write_sft_dataset(trajectories, tmp_path / 'data')
  straight = sft.train(_config(tmp_path / 'data', 4), tmp_path / 'straight')
  losses = [r['loss'] for r in metrics.read_metrics(tmp_path / 'straight', 'sft')]
  assert len(losses) == 4 and losses[-1] < losses[0]
  # Eq. 8 at init: the mean NLL of a random tiny model over emitted tokens is about log(vocab).
  assert abs(losses[0] - np.log(151936)) < 0.5

  sft.train(_config(tmp_path / 'data', 2), tmp_path / 'resumed')  # "killed" after step 2
  resumed = sft.train(_config(tmp_path / 'data', 4), tmp_path / 'resumed')
  assert [r['step'] for r in metrics.read_metrics(tmp_path / 'resumed', 'sft')] == [1, 2, 3, 4]
  for a, b in zip(_params(straight), _params(resumed)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_sft_with_scan_layers_and_remat_follows_the_same_losses(trajectories, tmp_path):
  _write_sft_dataset(trajectories, tmp_path / 'data')
  sft.train(_config(tmp_path / 'data', 2), tmp_path / 'plain')
  switched = _config(tmp_path / 'data', 2)
  switched.model.update(scan_layers=True, remat=True)
  model = sft.train(switched, tmp_path / 'scan')
  assert model.language_model.scan_layers and model.language_model.remat
  plain = [r['loss'] for r in metrics.read_metrics(tmp_path / 'plain', 'sft')]
  scan = [r['loss'] for r in metrics.read_metrics(tmp_path / 'scan', 'sft')]
  np.testing.assert_allclose(scan, plain, rtol=1e-5)


def test_sft_gradient_accumulation_is_the_step_taken_at_once(trajectories):
  """sft.micro_batch_size (the paper's batch of 256 on fewer rows): one-row micro-batches of rows with different
  numbers of supervised tokens sum to the loss, token count, gradient and its norm of the 4-row step taken at once
  (each micro-batch normalised by the step's tokens; a mean of per-micro-batch means would differ)."""
  tokenizer = tj.load_tokenizer()
  env = tools_env.ToolEnv({'enabled': ('text_search',)})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  short = agent_loop.run_episodes(
      engine_lib.ScriptedEngine([ANSWER], tokenizer), env,
      lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
      [{'prompt_id': f's{i}', 'question': 'Name the city.', 'answers': ['Agra']} for i in range(2)],
      num_generations=1, max_turns=2)
  rows = [trajectories[0], short[0], trajectories[1], short[1]]
  counts = [batching.num_loss_tokens(t) for t in rows]
  assert counts[0] > 2 * counts[1]
  config = _config('unused', 2)
  config.sft.update(batch_size=4, micro_batch_size=1)
  config.model.text.num_hidden_layers = 1   # three programs to compile: one layer is enough for a sum
  sft.check_config(config)
  mesh = sharding.make_mesh()
  length, num_loss = batching.padded_sizes(rows)
  model, optimizer = policy.create(config, mesh, 'sft')
  place = lambda part: placement.host_batch(part, mesh, length, num_loss, vision_config=model.config.vision)
  with sharding.use_mesh(mesh):
    at_once = nnx.jit(lambda m, b: nnx.value_and_grad(sft.loss_fn, has_aux=True)(m, b))
    (loss, whole), grads = jax.device_get(at_once(model, place(rows)))
    grad_step = sft.make_grad_step(config.sft)   # the one make_step uses (one per router setting)
    parts = [jax.device_get(grad_step(model, place([r]), np.float32(sum(counts)), np.float32(0.25))[0])
             for r in rows]
    parts = jax.tree.map(lambda *g: np.sum(g, axis=0), *parts)   # on the host (float32)
    out = jax.device_get(sft.make_step(config.sft, place)(model, optimizer, rows))   # the trainer's step
  assert out['num_tokens'] == whole['num_tokens'] == sum(counts)
  # A sum of 4 float32 parts vs one: relative to the terms' size (the loss ~ log V ~ 12; the gradient's norm).
  np.testing.assert_allclose([out['loss'], out['nll_sum']], [loss, whole['nll_sum']], rtol=1e-5)
  whole_g, parts_g = jax.tree.leaves(grads), jax.tree.leaves(parts)
  np.testing.assert_allclose(out['grad_norm'], np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in whole_g)),
                             rtol=1e-5)
  scale = max(np.abs(g).max() for g in whole_g)
  assert max(np.abs(a - b).max() for a, b in zip(whole_g, parts_g)) <= 1e-5 * scale


def _sized(name, tokens, loss, patches):
  """A record with only what `batching.pack` reads: token count, emitted tokens (gen_mask), image grids."""
  gen = np.zeros(tokens, bool)
  gen[1:loss + 1] = True
  images = [types.SimpleNamespace(grid_thw=(1, 2, patches // 2))] if patches else []
  return types.SimpleNamespace(prompt_id=name, sample_index=0, token_ids=np.zeros(tokens, np.int32), gen_mask=gen,
                               images=images)


def test_pack_is_first_fit_decreasing_within_every_budget():
  """batching.pack by hand: longest first, each into the first row with room for its tokens, loss tokens and
  patches; rows list their trajectories in input order; a trajectory over a budget on its own is refused."""
  t = [_sized('a', 60, 10, 4), _sized('b', 50, 40, 4), _sized('c', 45, 5, 4), _sized('d', 30, 5, 0),
       _sized('e', 20, 5, 4)]
  # a -> row 0; b: 110 tokens with a -> row 1; c: 95 tokens and 45 loss with b -> row 1; d: 90 with a -> row 0;
  # e: 110 with row 0, 115 with row 1 -> row 2.
  assert batching.pack(t, 100, 64) == [[0, 3], [1, 2], [4]]
  # K = 44: c's 5 loss tokens do not fit beside b's 40 -> row 2; e joins c (65 tokens, 10 loss).
  assert batching.pack(t, 100, 44) == [[0, 3], [1], [2, 4]]
  # 4 patches per row: c cannot join b's image -> row 2; d (no image) joins a; e fits beside no image-holding row.
  assert batching.pack(t, 100, 64, patches_per_row=4) == [[0, 3], [1], [2], [4]]
  with pytest.raises(ValueError, match=r"trajectory 'b' .sample 0. has 40 loss tokens, over the packed row budget of "
                                       r'39'):
    batching.pack(t, 100, 39)
  with pytest.raises(ValueError, match=r"trajectory 'a' .sample 0. has 60 tokens, over the packed row budget of 59"):
    batching.pack(t, 59, 64)


def test_packed_rows_give_every_trajectory_its_unpacked_logprobs(trajectories):
  """Packing changes no real log-prob: three trajectories (images included) packed into one row have, at their loss
  positions, the log-probs of the same trajectories one per padded row; positions restart at each trajectory; the
  segment ids number the trajectories of the row."""
  data = [trajectories[0], _episodes([ANSWER], n=1)[0], trajectories[1]]
  lengths = [len(t.token_ids) for t in data]
  counts = [batching.num_loss_tokens(t) for t in data]
  config = _config('unused', 2)
  mesh = sharding.make_mesh()
  model, _ = policy.create(config, mesh, 'sft')
  vision = model.config.vision
  packed = placement.host_batch(data, mesh, sum(lengths) + 7, sum(counts) + 5, vision_config=vision, rows=[[0, 1, 2]])
  plain = placement.host_batch(data, mesh, max(lengths), max(counts), vision_config=vision)
  seg = np.asarray(packed['attention_mask'])[0]
  np.testing.assert_array_equal(seg, np.repeat([1, 2, 3, 0], lengths + [7]))
  with sharding.use_mesh(mesh):
    fn = nnx.jit(policy.loss_logprobs)
    got, want = np.asarray(fn(model, packed))[0], np.asarray(fn(model, plain))
  offset, n = 0, 0
  for i, (length, count) in enumerate(zip(lengths, counts)):
    np.testing.assert_array_equal(np.asarray(packed['position_ids'])[:, 0, offset:offset + length],
                                  np.asarray(plain['position_ids'])[:, i, :length])
    # Log-probs ~ -12 (log V at init): 2e-5 is ~15 float32 ulps of them (another attention block order).
    np.testing.assert_allclose(got[n:n + count], want[i, :count], atol=2e-5, rtol=0)
    offset, n = offset + length, n + count
  assert not np.asarray(packed['completion_mask'])[0, n:].any()


def test_sft_packed_step_is_the_unpacked_step(trajectories):
  """sft.pack_rows (dynamic batch size): a step whose three trajectories are packed into two one-row micro-batches
  (two trajectories share a row, the other has one with padding) has the loss, token count, gradient and norm of
  the unpacked step taken at once (Eq. 8 over the step's tokens), and `pack_budget`'s bounds hold any full row."""
  data = [trajectories[0], _episodes([ANSWER], n=1)[0], trajectories[1]]
  lengths = [len(t.token_ids) for t in data]
  counts = [batching.num_loss_tokens(t) for t in data]
  config = _config('unused', 2)
  config.sft.update(batch_size=3, pack_rows=1)
  config.model.text.num_hidden_layers = 1
  sft.check_config(config)
  mesh = sharding.make_mesh()
  model, optimizer = policy.create(config, mesh, 'sft')
  vision = model.config.vision
  budget = batching.Bucket(lengths[0] + lengths[1], counts[0] + counts[1], 32)
  assert batching.pack(data, budget.length, budget.num_loss, 32) == [[0, 1], [2]]
  place = lambda part, rows: placement.host_batch(part, mesh, budget.length, budget.num_loss, vision_config=vision,
                                               patches_per_shard=budget.patches, rows=rows)
  with sharding.use_mesh(mesh):
    at_once = nnx.jit(lambda m, b: nnx.value_and_grad(sft.loss_fn, has_aux=True)(m, b))
    (loss, whole), grads = jax.device_get(at_once(model, placement.host_batch(data, mesh, max(lengths), max(counts),
                                                                           vision_config=vision)))
    grad_step = sft.make_grad_step(config.sft)   # the packed step's micro-batches, summed on the host
    parts = [jax.device_get(grad_step(model, place(part, rows), np.float32(sum(counts)), np.float32(len(part) / 3))[0])
             for part, rows in (([data[0], data[1]], [[0, 1]]), ([data[2]], [[0]]))]
    parts = jax.tree.map(lambda *g: np.sum(g, axis=0), *parts)
    out = jax.device_get(sft.make_packed_step(config.sft, place, budget, 32)(model, optimizer, data))
  whole_g, parts_g = jax.tree.leaves(grads), jax.tree.leaves(parts)
  scale = max(np.abs(g).max() for g in whole_g)
  assert max(np.abs(a - b).max() for a, b in zip(whole_g, parts_g)) <= 1e-5 * scale
  assert out['micro_batches'] == out['packed_rows'] == 2
  assert out['num_tokens'] == whole['num_tokens'] == sum(counts)
  np.testing.assert_allclose([out['loss'], out['nll_sum']], [loss, whole['nll_sum']], rtol=1e-5)
  whole_norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in jax.tree.leaves(grads)))
  np.testing.assert_allclose(out['grad_norm'], whole_norm, rtol=1e-5)
  # The bounds of an unset budget: K and P hold any row of T tokens (the largest share per token, times T).
  bucket = batching.pack_budget(data, (), rows_per_shard=2)
  t = -(-max(lengths) // 256) * 256
  k = min(t, -(-int(np.ceil(max(c / n for c, n in zip(counts, lengths)) * t)) // 64) * 64)
  p = -(-int(np.ceil(max(16 / n for n in lengths) * t)) // 4) * 4 * 2
  assert bucket == batching.Bucket(t, k, p)
  assert batching.pack_budget(data, (4096,), max_loss_tokens=700, patches_per_shard=64) == (4096, 700, 64)


def test_sft_refuses_a_dataset_made_with_another_system_prompt(trajectories, tmp_path):
  """One system prompt per run: the dataset's build_config.json names the instructions its trajectories were
  rendered with; SFT under another config.system_prompt stops before building anything, naming the field."""
  _write_sft_dataset(trajectories, tmp_path / 'data')
  (tmp_path / 'data' / 'build_config.json').write_text(json.dumps({'system_prompt': 'agent_system_v2'}))
  config = _config(tmp_path / 'data', 2)
  assert config.system_prompt == config.data.system_prompt == 'builder_default'
  with pytest.raises(ValueError, match=r"config.system_prompt='builder_default' .* is not the system prompt the "
                                       r'dataset .* was made with'):
    sft.train(config, tmp_path / 'w')
  assert not (tmp_path / 'w' / 'sft_ckpt').exists()
  assert policy_config.checkpoint_meta(config)['system_prompt'] == {'name': 'builder_default',
                                                                     'text': tj.DEFAULT_INSTRUCTIONS}
  config.system_prompt = 'agent_system_v2'   # the dataset's: accepted (data.system_prompt follows the reference)
  assert config.data.system_prompt == 'agent_system_v2'
  policy_config.check_system_prompt(config, tj.system_prompt_text('agent_system_v2'), 'the dataset')


def test_sft_buckets_fix_one_shape_per_length_bucket(trajectories):
  """sft.length_buckets: one (T, K, P) per configured bucket some trajectory fits, K and P holding every trajectory
  of at most T tokens (P = the fullest row's patches x the rows per shard, or the fixed budget); a batch takes the
  smallest that holds it; a trajectory over the largest is refused naming it."""
  short = _episodes([ANSWER], n=1)[0]             # one step: shorter, fewer loss tokens
  data = list(trajectories) + [short]
  per_row = [sum(int(np.prod(i.grid_thw)) for i in t.images) for t in data]
  assert per_row == [16, 16, 16]   # one 64x64 image each: a 4x4 patch grid
  n_short, n_long = len(short.token_ids), len(trajectories[0].token_ids)
  k_short, k_long = batching.num_loss_tokens(short), batching.num_loss_tokens(trajectories[0])
  assert n_short < n_long and k_short < k_long
  up = lambda n, m: -(-n // m) * m
  assert batching.sft_buckets(data, (), rows_per_shard=2) == [
      batching.Bucket(up(n_long, 256), up(k_long, 64), 32)]                    # () = one bucket, the longest
  buckets = batching.sft_buckets(data, (n_short, n_long, n_long + 100), rows_per_shard=3)
  assert buckets == [batching.Bucket(n_short, min(n_short, up(k_short, 64)), 48),
                     batching.Bucket(n_long, min(n_long, up(k_long, 64)), 48),
                     batching.Bucket(n_long + 100, up(k_long, 64), 48)]
  assert batching.sft_buckets(data, (n_long,), patches_per_shard=64)[0].patches == 64
  # sft.max_loss_tokens: K from the config (at most T) for every bucket; a trajectory emitting more is refused.
  assert [b.num_loss for b in batching.sft_buckets(data, (n_short, n_long), max_loss_tokens=k_long)] == [
      min(n_short, k_long), k_long]
  with pytest.raises(ValueError, match=f"SFT trajectory 'q0' .sample 0. has {k_long} loss tokens, over "
                                       f'sft.max_loss_tokens={k_long - 1}'):
    batching.sft_buckets(data, (n_long,), max_loss_tokens=k_long - 1)
  assert batching.sft_buckets(data, (n_short - 1, n_long)) == batching.sft_buckets(data, (n_long,))  # none fits
  assert batching.pick_bucket(buckets, [short]) == buckets[0]
  assert batching.pick_bucket(buckets, [short, trajectories[1]]) == buckets[1]
  with pytest.raises(ValueError, match=f"trajectory 'q0' .sample 0. has {n_long} tokens, over the largest length bucket "
                                       f'{n_long - 1}'):
    batching.sft_buckets(data, (n_short, n_long - 1))
  assert batching.sft_buckets([dataclasses.replace(t, images=[]) for t in data], (n_long,))[0].patches == 0
  # The placed batch of each bucket has its shape, whatever rows it holds.
  mesh = sharding.make_mesh()
  vision = config_lib.Qwen3VLConfig.tiny().vision
  cfg = ml_collections.ConfigDict({'batch_size': 2, 'length_buckets': (n_short, n_long)})
  place = sft.placer(cfg, data, mesh, sharding.LOGICAL_RULES, vision)
  for rows, bucket in (([short, short], 0), ([trajectories[0], short], 1), (list(trajectories), 1)):
    want = sft.buckets(cfg, data, mesh, sharding.LOGICAL_RULES, vision)[bucket]
    placed = place(rows)
    assert placed['input_ids'].shape == (2, want.length) and placed['loss_targets'].shape == (2, want.num_loss)
    assert placed['pixel_values'].shape[:2] == (1, want.patches)


def test_batch_indices_are_seeded_epochs():
  first_epoch = np.concatenate([train_data.batch_indices(s, 2, 6, seed=0) for s in range(3)])
  assert sorted(first_epoch.tolist()) == list(range(6))
  np.testing.assert_array_equal(train_data.batch_indices(4, 2, 6, seed=0), train_data.batch_indices(4, 2, 6, seed=0))


BAD = tj.render_assistant_text('Try a tool.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
WRONG = tj.render_assistant_text('It is Delhi.', response='Delhi')


def test_grpo_batch_masks_post_fatal_tokens_and_clamps_fatal_advantages():
  """One group of G = 4 built by a scripted policy: right answer, wrong answer, fatal at step 0, fatal at step 1."""
  tokenizer = tj.load_tokenizer()
  env = tools_env.ToolEnv({'enabled': ('text_search',)})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  scripts = {'right': [SEARCH, ANSWER], 'wrong': [SEARCH, WRONG], 'fatal0': [BAD, BAD, BAD],
             'fatal1': [SEARCH, BAD, BAD, BAD]}

  def policy(step, context):
    text = tokenizer.decode(context.prompt_ids.tolist())
    return scripts[next(k for k in scripts if f'case {k}?' in text)][step]

  image = np.zeros((64, 64, 3), np.uint8)
  items = [{'prompt_id': 'p', 'question': f'case {k}?', 'answers': ['Agra'], 'image': image} for k in scripts]
  trajs = agent_loop.run_episodes(engine_lib.ScriptedEngine(policy, tokenizer), env,
                                  lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()), items,
                                  num_generations=1, max_turns=6)
  assert [t.fatal_step for t in trajs] == [None, None, 0, 1]
  cfg = demo_config.get_config().grpo
  cfg.num_generations = 4
  batch, _, scores, stats = grpo_batch.prepare_batch(trajs, cfg)

  # Eq. 9 by hand: r = r_fmt * (0.8 r_acc + 0.2 r_query); fatal0 has an empty prefix (r = 0).
  assert [s['r_fmt'] for s in scores] == [1.0, 1.0, 0.0, 1.0]
  assert [s['r_acc'] for s in scores] == [1.0, 0.0, 0.0, 0.0]
  for s in scores:
    assert s['reward'] == pytest.approx(s['r_fmt'] * (0.8 * s['r_acc'] + 0.2 * s['r_query']))
  # Eq. 11 by hand: group-normalised with the unbiased std, fatal samples below the mean clamped to 0.
  r = np.array([s['reward'] for s in scores])
  r_tilde = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  assert r_tilde[2] < 0 and r_tilde[3] < 0
  np.testing.assert_allclose(batch['advantages'], [r_tilde[0], r_tilde[1], 0.0, 0.0], rtol=1e-5, atol=1e-6)
  assert stats['num_fatal'] == 2 and stats['num_fatal_clamped'] == 2
  # Eq. 10: emitted tokens of steps >= f_i carry no loss; everything the policy emitted before them does.
  mask, valid, step_of = batch['loss_mask'], batch['completion_mask'], batch['loss_step']
  np.testing.assert_array_equal(mask[:2], valid[:2].astype(np.float32))
  assert mask[2].sum() == 0
  np.testing.assert_array_equal(mask[3], (valid[3] & (step_of[3] < 1)).astype(np.float32))
  assert mask[3].sum() > 0

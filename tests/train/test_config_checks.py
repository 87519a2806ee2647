"""Every stage checks its whole config before it reads or writes anything (data, sft, grpo, the demo's eval), and
the step counts the configs allow (steps = 1, warmup_steps = 0) run."""

import pathlib
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from data_pipeline import build
from osvl_jax import demo
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import grpo, grpo_batch, policy, policy_config, sft

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402


def _set(config, path, value):
  section, field = path.rsplit('.', 1)
  node = config
  for key in section.split('.'):
    node = node[key]
  node[field] = value


@pytest.mark.parametrize('path, value, match', [
    ('sft.steps', 0, 'sft.steps=0'), ('sft.steps', -3, 'sft.steps=-3'), ('sft.batch_size', 0, 'sft.batch_size=0'),
    ('sft.lr', 0.0, 'sft.lr=0.0'), ('sft.lr', float('nan'), 'sft.lr'),
    ('sft.warmup_steps', 650, 'sft.warmup_steps=650 must be < sft.steps=650'),
    ('sft.warmup_steps', -1, 'sft.warmup_steps=-1'), ('sft.grad_clip', 0.0, 'sft.grad_clip'),
    ('sft.weight_decay', -0.1, 'sft.weight_decay'), ('sft.log_every', 0, 'sft.log_every'),
    ('sft.ckpt_every', 0, 'sft.ckpt_every'), ('image.min_pixels', 0, 'image.min_pixels=0'),
    ('image.max_pixels', 1024, 'image.min_pixels=4096 > image.max_pixels=1024'),
    ('model.name', 'huge', 'model.name'), ('mesh.fsdp', 0, 'mesh.fsdp=0'), ('mesh.tensor', -2, 'mesh.tensor=-2'),
    ('mesh.expert', 4096, 'mesh.expert'), ('mesh.pipeline', 2, 'mesh.pipeline: unknown mesh axis'),
    ('sft.router_aux_loss_coef', -0.01, 'sft.router_aux_loss_coef=-0.01'),
    ('sft.router_z_loss_coef', -1.0, 'sft.router_z_loss_coef=-1.0'),
    ('sft.router_loss_form', 'megatron', r"sft.router_loss_form='megatron': expected one of \('per_layer', 'pooled'\)"),
    ('sft.adam_b2', 1.0, 'sft.adam_b2=1.0'), ('sft.min_lr_ratio', 1.5, 'sft.min_lr_ratio=1.5'),
    ('sft.length_buckets', (4096, 2048), r'sft.length_buckets=\(4096, 2048\) must be increasing ints >= 1'),
    ('sft.length_buckets', (2048, 2048), 'sft.length_buckets'), ('sft.length_buckets', (0, 64), 'sft.length_buckets'),
    ('sft.length_buckets', (True, 64), 'sft.length_buckets'),
    ('sft.pack_rows', -1, 'sft.pack_rows=-1'),
    ('sft.max_loss_tokens', -64, 'sft.max_loss_tokens=-64'),
])
def test_sft_check_config_names_the_field(path, value, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  sft.check_config(c)  # the neighbour: the demo config passes
  _set(c, path, value)
  with pytest.raises(ValueError, match=match):
    sft.check_config(c)


def test_sft_pack_rows_refuses_micro_batches_beside_it_and_rows_that_do_not_split():
  """sft.pack_rows sets the packed micro-batch's rows: an sft.micro_batch_size beside it is refused (one meaning of
  a micro-batch), and so are rows that do not split over the mesh's batch shards; its neighbours pass."""
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.sft.pack_rows = 3
  sft.check_config(c)                 # one device: any row count splits
  c.sft.micro_batch_size = 1
  with pytest.raises(ValueError, match='sft.pack_rows=3 packs .* leave sft.micro_batch_size=1 at 0'):
    sft.check_config(c)
  c.sft.micro_batch_size = 0
  c.mesh.fsdp = 2
  with pytest.raises(ValueError, match='sft.pack_rows=3 does not split over the 2 data x fsdp devices'):
    sft.check_config(c)
  c.sft.pack_rows = 4
  sft.check_config(c)


def test_sft_check_config_refuses_data_rendered_with_another_pixel_budget():
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.data = build.default_config()   # no longer references image.min_pixels / max_pixels
  sft.check_config(c)                # the same values: fine
  c.data.max_pixels = 256 * 256
  with pytest.raises(ValueError, match='data.min_pixels/max_pixels'):
    sft.check_config(c)


@pytest.mark.parametrize('path, value, match', [
    ('grpo.steps', 0, 'grpo.steps=0'), ('grpo.num_generations', 1, 'grpo.num_generations=1: must be >= 2'),
    ('grpo.prompts_per_step', 0, 'grpo.prompts_per_step'), ('grpo.lr', -1e-4, 'grpo.lr'),
    ('grpo.eps_low', 1.0, 'grpo.eps_low'), ('grpo.eps_high', -0.1, 'grpo.eps_high'), ('grpo.beta', -1.0, 'grpo.beta'),
    ('grpo.alpha', 1.5, 'grpo.alpha'), ('grpo.delta', 0.0, 'grpo.delta'), ('grpo.std_ddof', 2, 'grpo.std_ddof'),
    ('grpo.clip_ratio_c', 0.5, 'grpo.clip_ratio_c'), ('grpo.temperature', 0.0, 'grpo.temperature'),
    ('grpo.top_p', 1.5, 'grpo.top_p'), ('grpo.ckpt_every', 0, 'grpo.ckpt_every'),
    ('grpo.micro_batch_size', -2, 'grpo.micro_batch_size'), ('mesh.fsdp', 99, 'mesh.fsdp'),
    ('grpo.fatal_mode', 'bogus', 'bogus'), ('rollout.max_turns', 0, 'rollout.max_turns'),
    ('rollout.max_new_tokens', 0, 'rollout.max_new_tokens'), ('rollout.fatal_k', 0, 'rollout.fatal_k'),
    ('rollout.max_total_tokens', 64, 'rollout.max_total_tokens=64 < rollout.max_new_tokens=128'),
    ('grpo.router_aux_loss_coef', -1.0, 'grpo.router_aux_loss_coef=-1.0'),
    ('grpo.router_z_loss_coef', -1e-3, 'grpo.router_z_loss_coef=-0.001'),
    ('grpo.router_loss_form', 'hf', "grpo.router_loss_form='hf'"), ('grpo.adam_b2', -0.9, 'grpo.adam_b2=-0.9'),
    ('grpo.min_lr_ratio', -0.1, 'grpo.min_lr_ratio=-0.1'),
    ('grpo.length_buckets', (), r'grpo.length_buckets=\(\) must be increasing ints >= 1'),
    ('grpo.length_buckets', (4096, 2048), 'grpo.length_buckets'), ('grpo.length_buckets', (2.5e3,), 'grpo.length_b'),
    ('grpo.length_buckets', (1024, 2048), 'the largest is below rollout.max_total_tokens=4096'),
    ('grpo.pack_rows', -1, 'grpo.pack_rows=-1'),
])
def test_grpo_check_config_names_the_field(path, value, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  grpo.check_config(c)
  _set(c, path, value)
  with pytest.raises(ValueError, match=match):
    grpo.check_config(c)


def test_grpo_pack_rows_refuses_micro_batches_beside_it_and_rows_that_do_not_split():
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.pack_rows = 3
  grpo.check_config(c)
  c.grpo.micro_batch_size = 4
  with pytest.raises(ValueError, match='grpo.pack_rows=3 packs .* leave grpo.micro_batch_size=4 at 0'):
    grpo.check_config(c)
  c.grpo.update(micro_batch_size=0, num_generations=4)
  c.mesh.fsdp = 2
  with pytest.raises(ValueError, match='grpo.pack_rows=3 .* is not a multiple of the 2 data x fsdp devices'):
    grpo.check_config(c)
  c.grpo.pack_rows = 2
  grpo.check_config(c)


@pytest.mark.parametrize('path, value, match', [
    ('num_items', 0, 'data.num_items=0'), ('num_items', -5, 'data.num_items=-5'), ('top_k', 0, 'data.top_k'),
    ('max_retries', -1, 'data.max_retries'), ('hop_choices', (), 'data.hop_choices'),
    ('hop_probs', (0.5, 0.5), 'data.hop_probs'), ('hop_probs', (0.5, 0.6, -0.1), 'data.hop_probs'),
    ('min_pixels', 0, 'data.min_pixels'),
])
def test_data_check_config_names_the_field(path, value, match):
  c = build.default_config()
  build.check_config(c)
  c[path] = value
  with pytest.raises(ValueError, match=match):
    build.check_config(c)


@pytest.mark.parametrize('path, value, match', [
    ('grpo.fatal_mode', 'bogus', 'bogus'), ('eval.num_prompts', 0, 'eval.num_prompts'),
    ('data.num_items', 0, 'data.num_items'), ('sft.batch_size', 0, 'sft.batch_size'),
])
def test_demo_checks_every_stage_before_the_first_and_writes_nothing(tmp_path, path, value, match, monkeypatch):
  """`--config.grpo.fatal_mode=bogus` fails before the data stage (which would take minutes), and nothing is
  written: no workdir, no data, checkpoints, metrics.jsonl or tb/."""
  monkeypatch.setattr(build, 'build_dataset', lambda *a, **k: pytest.fail('the data stage ran'))
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  demo.check_config(c)
  _set(c, path, value)
  with pytest.raises(ValueError, match=match):
    demo.run(c, tmp_path / 'demo')
  assert not (tmp_path / 'demo').exists()


def test_mesh_sizes_resolve_one_minus_one_and_refuse_what_does_not_fit_the_devices():
  sizes = lambda multi_host=False, **kw: sharding.mesh_sizes(kw, 8, multi_host)
  assert sizes(fsdp=-1) == {'data': 1, 'fsdp': 8, 'tensor': 1, 'expert': 1}
  assert sizes(data=2, fsdp=-1) == {'data': 2, 'fsdp': 4, 'tensor': 1, 'expert': 1}
  assert sizes(fsdp=2, tensor=4) == {'data': 1, 'fsdp': 2, 'tensor': 4, 'expert': 1}
  assert sizes() == {'data': 1, 'fsdp': 1, 'tensor': 1, 'expert': 1}  # one process: the first device only
  for kw, match in (({'fsdp': -1, 'data': -1}, 'only one axis may be -1'), ({'fsdp': 3, 'data': -1}, 'mesh.data=-1'),
                    ({'fsdp': 16}, 'mesh.fsdp'), ({'tensor': 0}, 'mesh.tensor=0'), ({'data': True}, 'mesh.data'),
                    ({'fsdp': 2, 'multi_host': True}, 'mesh.fsdp: .* must hold them all')):
    with pytest.raises(ValueError, match=match):
      sizes(**kw)
  mesh = sharding.mesh_from_config({'fsdp': -1})
  assert mesh.axis_names == sharding.MESH_AXES and mesh.shape['fsdp'] == jax.device_count()


def test_sharding_rules_override_the_logical_rules_by_name():
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.sharding_rules = (('embed', None), ('mlp', ('fsdp', 'tensor')))
  rules = dict(sharding.rules_from_config(c))
  assert rules['embed'] is None and rules['mlp'] == ('fsdp', 'tensor') and rules['batch'] == ('data', 'fsdp')
  sft.check_config(c)
  c.sharding_rules = (('embed', 'pipeline'),)
  with pytest.raises(ValueError, match='sharding_rules'):
    sft.check_config(c)


def test_sft_with_batch_size_zero_names_the_field_and_writes_nothing(tmp_path):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.sft.batch_size = 0
  with pytest.raises(ValueError, match='sft.batch_size=0'):
    sft.train(c, tmp_path)
  assert list(tmp_path.iterdir()) == []
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.num_generations = 1
  with pytest.raises(ValueError, match='grpo.num_generations=1'):
    grpo.train(c, tmp_path)
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('steps, warmup', [(1, 0), (2, 0), (2, 1), (450, 20)])
def test_schedule_runs_for_every_step_count_the_configs_allow(steps, warmup):
  schedule = policy.make_schedule(1e-3, steps, warmup)
  lrs = [float(schedule(i)) for i in range(steps)]
  assert lrs[warmup] == pytest.approx(1e-3)           # peak right after the warmup (at once without one)
  assert all(lr >= 1e-4 - 1e-12 for lr in lrs[warmup:])
  if warmup:
    assert lrs[0] == 0.0


@pytest.mark.parametrize('steps, warmup', [(0, 0), (1, 1), (3, 5), (2, -1)])
def test_schedule_refuses_step_counts_optax_cannot_decay(steps, warmup):
  with pytest.raises(ValueError, match='steps'):
    policy.make_schedule(1e-3, steps, warmup)


def _small_vocab_policy(monkeypatch):
  """`checkpoints.build_model` replaced by the tiny model with a 512-token vocabulary (cheap); returns the builder."""
  cfg = config_lib.Qwen3VLConfig.tiny()
  small = lambda config, seed=0, workdir=None: model_lib.Qwen3VLModel(
      type(cfg)(**{**cfg.__dict__, 'text': type(cfg.text)(**{**cfg.text.__dict__, 'vocab_size': 512})}),
      rngs=nnx.Rngs(seed))
  from osvl_jax import checkpoints
  monkeypatch.setattr(checkpoints, 'build_model', small)
  return small


def test_grpo_policy_with_one_step_takes_its_update(tmp_path, monkeypatch):
  """`--config.grpo.steps=1` crashed in optax's cosine schedule (decay_steps=0); now its one update moves the
  parameters (and without warmup the first update is not at lr = 0)."""
  small = _small_vocab_policy(monkeypatch)
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.steps = 1
  c.model.hf_path = ''
  from osvl_jax import checkpoints
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, small(c), None, {'stage': 'sft'})
  model, optimizer, _, start = grpo.init_policy(c, tmp_path, sharding.mesh_from_config(c.mesh))
  assert start == 0
  before = jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))
  grads = jax.tree.map(jax.numpy.ones_like, nnx.state(model, nnx.Param))
  policy.apply_grads(model, optimizer, grads)
  after = jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))
  assert any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_grpo_refuses_an_sft_checkpoint_of_another_system_prompt_and_rolls_out_with_its_own(tmp_path, monkeypatch):
  """One system prompt per run: the SFT checkpoint's meta names the instructions it was trained with; GRPO under
  another config.system_prompt stops at initialisation, naming the field; its rollouts render config's prompt."""
  small = _small_vocab_policy(monkeypatch)
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.hf_path = ''
  trained = demo_config.get_config()
  trained.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  trained.system_prompt = 'agent_system_v2'
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.train import rollouts
  from osvl_jax import checkpoints
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, small(c), None, policy_config.checkpoint_meta(trained))
  with pytest.raises(ValueError, match=r"config.system_prompt='builder_default' .* the SFT checkpoint"):
    grpo.init_policy(c, tmp_path, sharding.mesh_from_config(c.mesh))
  c.system_prompt = 'agent_system_v2'
  model, _, _, start = grpo.init_policy(c, tmp_path, sharding.mesh_from_config(c.mesh))
  assert start == 0
  builder = rollouts.RolloutRunner(c, model).make_builder()
  assert builder.system_prompt == traj_lib.system_prompt_text('agent_system_v2')


OFFICIAL_CALL = ('<think>Search for it.</think>\n<tool_call>{"name": "text_search", "arguments": {"q": "Taj Mahal '
                 'Agra", "hl": "en"}}</tool_call>')


def test_grpo_rollouts_parse_and_run_a_call_in_the_official_tool_schema_profile():
  """`tools.tool_schema='official'`: the rollout's builder renders the official schemas and parses the policy's
  `text_search{q, hl}` in that profile, the call it checks is the one the tool env runs (`rollout.factory`)."""
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.rollout import engine as engine_lib
  from osvl_jax.train import rollouts
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.hf_path = ''
  c.tools.enabled, c.tools.tool_schema = ('text_search',), 'official'
  runner = rollouts.RolloutRunner(c, model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0)))
  assert runner.make_builder().profile == 'official'
  runner.engine = engine_lib.ScriptedEngine(
      [OFFICIAL_CALL, traj_lib.render_assistant_text('Found it.', response='Agra')], runner.tokenizer)
  image = np.zeros((64, 64, 3), np.uint8)
  (traj,) = runner.run([{'prompt_id': 'q', 'question': 'Which city?', 'image': image, 'answers': ['Agra']}], 1,
                       1.0, 1.0, 0)
  step = traj.steps[0]
  # parsed in the official profile: `q` is the query, `hl` (the official search's language) is not an argument of
  # ours (the 'osvl' profile keeps it, and the official-profile env then refuses the call)
  assert (step.action.name, step.action.arguments) == ('text_search', {'query': 'Taj Mahal Agra'})
  assert step.result.ok and 'Taj Mahal' in step.result.text and step.format_ok
  assert traj.stop_reason == 'response' and traj.final_response == 'Agra'


def test_sft_length_buckets_may_be_empty_and_grpo_reads_them_back():
  """The neighbours of the refusals: sft.length_buckets () is one bucket (the longest trajectory); a list is read
  as the tuple of its ints."""
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.sft.length_buckets = ()
  sft.check_config(c)
  c.grpo.length_buckets = [2048, 4096]
  assert grpo_batch.check_budgets(c)[0] == (2048, 4096)

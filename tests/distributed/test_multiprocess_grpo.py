"""Two JAX processes on one machine (jax.distributed on 127.0.0.1, 4 simulated CPU devices each) run GRPO against
a real `python -m osvl_jax.serve --tiny` worker (rollout.engine='sglang'), and make the update that one process
makes from the same rollout batches.

The job is the real entry point, `python -m osvl_jax.train.grpo`, started as a pod starts it (one process per host,
told its coordinator, count and index through the environment, `osvl_jax.distributed`). Process 0 alone rolls out
(its background thread: max_staleness 1) and scores; the batch is broadcast; both processes update on the 8-device
mesh (fsdp 4 across the hosts x tensor 2); publishing gathers the parameters on both and exports on process 0.
"""

import json
import pickle
import shutil
import sys
import time

import datasets
import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import sharding, weights
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.train import grpo, grpo_batch, grpo_update, metrics, policy
from tests.distributed import conftest
from tests.serve.conftest import healthy_server

STEPS = 3  # resumed at step 1: steps 2 and 3 run
SERVER_FLAGS = ('--max_len=512', '--bucket=64')  # after the serve conftest's TINY_FLAGS: the last value wins

# The job's config: the demo's, shrunk (the tiny model's 2 text layers, as the server's, 1 prompt x G = 4 per step, 2 turns of 8 tokens in 480) and
# pointed at the test's server, dataset and SFT checkpoint (π_ref). A random policy earns equal rewards (zero
# advantages), so the gradient is the KL term's (beta > 0): the job resumes from a GRPO checkpoint whose policy is
# not π_ref, so every update has a large gradient that depends on the batch (at π = π_ref it would be float noise,
# which Adam would scale up to whole learning-rate steps). fatal_mode 'none' keeps every completion token in the
# loss (a random policy's first step is already fatal).
CONFIG_PY = '''
import sys
sys.path.insert(0, {configs!r})
import demo
import ml_collections


def get_config():
  c = demo.get_config()
  c.model.text = ml_collections.ConfigDict()  # the server's architecture (`serve --tiny`): it refuses others
  c.model.vocab = 'full'
  c.data.dir = {data!r}
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64  # the tiny server's image processor
  c.tools.enabled = ('text_search',)
  c.mesh.update(fsdp=4, tensor=2)
  c.rollout.update(max_turns=2, max_new_tokens=8, max_total_tokens=480, engine='sglang', urls={url!r},
                   weights_dtype='float32', weights_keep=2)
  c.grpo.update(steps={steps}, prompts_per_step=1, num_generations=4, ckpt_every={steps}, max_staleness=1,
                init_from={init!r}, lr=0.01, beta=0.5)
  c.grpo.length_buckets = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
  c.grpo.max_loss_tokens, c.grpo.loss_bucket = 0, 16
  c.grpo.fatal_mode = 'none'
  c.grpo.dump_rollouts = True
  return c
'''


def _prompts_dataset(root) -> None:
  """An `items` split of two prompts with 64x64 images (absolute image paths) and the `rl` split naming both (no
  SFT trajectory of them), as the data pipeline writes them."""
  rng = np.random.default_rng(0)
  records = []
  for i in range(2):
    path = root / f'q{i}.png'
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    records.append({'prompt_id': f'q{i}', 'question': 'Which city is this?', 'answers': ['Agra'],
                    'image_path': str(path), 'rejected': False})
  folder = root / 'data' / 'items'
  datasets.Dataset.from_list(records).save_to_disk(str(folder))
  (folder / 'counts.json').write_text(json.dumps({'kept': len(records)}))
  folder = root / 'data' / 'rl'
  datasets.Dataset.from_list([{'prompt_id': r['prompt_id'], 'reason': 'held_out'} for r in records]).save_to_disk(
      str(folder))
  (folder / 'counts.json').write_text(json.dumps({'prompts': len(records)}))


def _load_config(path):
  namespace = {}
  exec(compile(path.read_text(), str(path), 'exec'), namespace)  # what config_flags does with --config=path
  return namespace['get_config']()


@pytest.fixture(scope='module')
def server(tmp_path_factory):
  log = tmp_path_factory.mktemp('server') / 'w.log'
  with healthy_server(log, *SERVER_FLAGS) as url:
    yield url


def _params(model) -> dict:
  return {'.'.join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.timeout(900)
def test_two_processes_run_grpo_against_a_server_with_the_one_process_update(server, tmp_path):
  _prompts_dataset(tmp_path)
  config_file = tmp_path / 'grpo_config.py'
  config_file.write_text(CONFIG_PY.format(configs=str(conftest.REPO / 'configs'), data=str(tmp_path / 'data'),
                                          url=server, steps=STEPS, init=str(tmp_path / 'init')))
  c = _load_config(config_file)
  one_device = sharding.mesh_from_config(None)
  checkpoints.save(checkpoints.manager(tmp_path / 'init', 'sft_ckpt'), 1,
                  policy.create_model(c, one_device, seed=5), None, {'stage': 'sft'})  # π_ref (and not the server's)
  model, optimizer = policy.create(c, one_device, 'grpo')  # seed 0: another policy
  checkpoints.save(checkpoints.manager(tmp_path / 'start', 'grpo_ckpt'), 1, model, optimizer, {'stage': 'grpo'})
  pod, single = tmp_path / 'pod', tmp_path / 'single'
  shutil.copytree(tmp_path / 'start', pod)
  shutil.copytree(tmp_path / 'start', single)
  outputs = conftest.wait_processes(conftest.start_processes(
      ['-m', 'osvl_jax.train.grpo', f'--config={config_file}', f'--workdir={pod}'], 2, 4))
  assert all('grpo: resumed at step 1' in out for out in outputs)  # both processes restored the one-process ckpt

  # The server serves the last published version; process 0 alone exported (keep = 2) and wrote the metrics.
  assert sc.SGLangEngine(server, max_new_tokens=8).model_info()['weight_version'] == str(STEPS)
  assert sorted(p.name for p in (pod / 'weights').iterdir()) == ['v00000002', 'v00000003']
  rows = metrics.read_metrics(pod, 'grpo')
  assert [r['step'] for r in rows] == [2, 3] and [r['weight_version'] for r in rows] == [2, 3]
  assert [r['policy_versions'] for r in rows] == [[1], [1]]  # batch 3 rolled out during step 2 (process 0)
  assert all(r['batch_shards'] == 4 and r['unmasked_tokens'] > 0 and r['mean_turns'] >= 1 for r in rows)
  assert sorted(p.name for p in (pod / 'rollouts').iterdir()) == ['00000002.pkl', '00000003.pkl']

  # One process, one device, the same rollout batches from the same checkpoints: the same update.
  model, optimizer, _, start = grpo.init_policy(c, single, one_device)
  ref_model = grpo.init_reference(c, single, one_device)
  assert start == 1
  initial = _params(model)
  update = grpo_update.make_update_fn(c.grpo)
  expected = []
  for step in range(start + 1, STEPS + 1):
    rollout_batch = pickle.loads((pod / 'rollouts' / f'{step:08d}.pkl').read_bytes())
    trajectories = rollout_batch['trajectories']
    assert len(trajectories) == 4
    batch, grid, _, _ = grpo_batch.prepare_batch(trajectories, c.grpo, scores=rollout_batch['scores'])
    batch.pop('rewards'), batch.pop('fatal_steps')
    batch['on_policy_rows'] = np.array([t.policy_version == step - 1 for t in trajectories])  # as the trainer
    expected.append(update(model, optimizer, batch, grid, [t.prompt_id for t in trajectories], ref_model)[0])
  assert all(e['kl'] > 0.1 and e['grad_norm'] > 0.1 for e in expected)  # the KL term acts
  # Step 2 starts from the same parameters on both sides: only float32 summation order differs (rel 1e-5). Step 3
  # starts after one Adam step, whose per-element steps agree only to 1e-2 of the movement (see the parameter check
  # below), so its metrics may differ by up to 1e-2 of how much the step moved them (measured: 3e-5 relative once,
  # depending on the sampled rollouts).
  for key in ('loss', 'kl', 'grad_norm'):
    got, want = [r[key] for r in rows], [e[key] for e in expected]
    assert got[0] == pytest.approx(want[0], rel=1e-5), key
    assert abs(got[1] - want[1]) <= 1e-5 * abs(want[1]) + 1e-2 * abs(want[1] - want[0]), (key, got, want)
  pod_model = policy.create_model(c, one_device, seed=1)
  assert checkpoints.restore(checkpoints.manager(pod, 'grpo_ckpt'), pod_model)['step'] == STEPS
  want, got = _params(model), _params(pod_model)
  assert want.keys() == got.keys()
  # What the servers loaded last is that checkpoint (gathered over both hosts, exported in float32 by process 0).
  exported = _params(weights.load_hf_folder(pod / 'weights' / 'v00000003')[0])
  assert exported.keys() == got.keys() and all(np.array_equal(exported[k], got[k]) for k in got)
  assert sum(np.linalg.norm(want[k] - initial[k]) for k in want) > 1.0  # two Adam steps of lr 0.01 moved it
  # Each parameter's two updates agree to 1% of how far they moved it (measured: <= 1.2e-3; a wrong batch or
  # gradient on a host flips O(1) of the element steps). Not 1e-5 like the losses above: Adam divides each gradient
  # element by its own magnitude, so float32 reduction-order noise in a near-cancelling element (8 sharded devices
  # vs 1) becomes a visible part of that element's step.
  for name in want:
    assert np.linalg.norm(got[name] - want[name]) <= 1e-2 * np.linalg.norm(want[name] - initial[name]), name


def test_check_config_refuses_the_embedded_engine_in_a_multi_process_job(monkeypatch):
  sys.path.insert(0, str(conftest.REPO / 'configs'))
  import demo  # pylint: disable=g-import-not-at-top
  c = demo.get_config()
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  with pytest.raises(ValueError, match=r"rollout.engine='embedded' with 2 processes.*rollout.engine='sglang'"):
    grpo.check_config(c, '/tmp/w')
  c.rollout.update(engine='sglang', urls='http://127.0.0.1:9')
  c.mesh.fsdp, c.grpo.num_generations = -1, 8  # a multi-host mesh holds every device (8 in this test run)
  grpo.check_config(c, '/tmp/w')  # servers: accepted


@pytest.mark.timeout(400)
def test_a_dataset_fault_on_process_0_stops_every_process_at_once(server, tmp_path):
  """Only process 0 reads the prompts; a dataset without the `rl` split (a build from before it) stops both
  processes with the reason, instead of leaving process 1 in the first collective until the shutdown times out."""
  _prompts_dataset(tmp_path)
  shutil.rmtree(tmp_path / 'data' / 'rl')
  config_file = tmp_path / 'grpo_config.py'
  config_file.write_text(CONFIG_PY.format(configs=str(conftest.REPO / 'configs'), data=str(tmp_path / 'data'),
                                          url=server, steps=STEPS, init=str(tmp_path / 'init')))
  c = _load_config(config_file)
  model, optimizer = policy.create(c, sharding.mesh_from_config(None), 'grpo')
  checkpoints.save(checkpoints.manager(tmp_path / 'pod', 'grpo_ckpt'), 1, model, optimizer, {'stage': 'grpo'})
  t0 = time.monotonic()
  procs = conftest.start_processes(['-m', 'osvl_jax.train.grpo', f'--config={config_file}',
                                    f'--workdir={tmp_path / "pod"}'], 2, 4)
  with pytest.raises(AssertionError, match='failed') as failed:
    conftest.wait_processes(procs, timeout=300)
  assert all(p.returncode not in (0, None) for p in procs) and time.monotonic() - t0 < 240
  assert 'RL prompts' in str(failed.value) and "the `rl` split" in str(failed.value)

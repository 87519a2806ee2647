"""GRPO against a real `python -m osvl_jax.serve --tiny` worker (rollout.engine='sglang'): the trainer publishes
version 0 (the SFT policy) before the first rollout and version s + 1 after step s's update; max_staleness 0 keeps
every batch on-policy, 1 rolls batch s + 1 out (with version s) while step s updates."""

import pathlib
import sys

import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.train import data, grpo, metrics, policy
from tests.serve.conftest import healthy_server
from tests.serve.test_weight_publish import trainer_logprobs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets: T on a ladder (batching.bucket_sizes)

STEPS = 3
SERVER_FLAGS = ('--max_len=512', '--bucket=64')  # after conftest's TINY_FLAGS: the last value wins


def _config(url: str = 'http://127.0.0.1:9', max_staleness: int = 0) -> ml_collections.ConfigDict:
  """The demo config shrunk to `osvl_jax.serve --tiny`'s model and pixel budget: 1 prompt x G = 2 per step."""
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.text = ml_collections.ConfigDict()  # exactly Qwen3VLConfig.tiny(), the server's architecture
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64
  c.tools.enabled = ('text_search',)
  c.rollout.update(max_turns=2, max_new_tokens=8, max_total_tokens=480, engine='sglang', urls=url,
                   weights_dtype='float32', weights_keep=2)
  c.grpo.update(steps=STEPS, prompts_per_step=1, num_generations=2, ckpt_every=STEPS, max_staleness=max_staleness)
  c.grpo.length_buckets, c.grpo.max_loss_tokens, c.grpo.loss_bucket = LENGTH_BUCKETS, 0, 16
  # A random policy earns equal rewards (zero advantages, zero policy gradient); AdamW's decoupled weight decay
  # still moves every parameter at every step, so each published version holds different weights.
  c.grpo.lr, c.grpo.weight_decay = 0.05, 1.0
  return c


@pytest.fixture(scope='module')
def server(tmp_path_factory):
  """One tiny worker (initial weights: Qwen3VLConfig.tiny() at nnx.Rngs(0)) for the module."""
  log = tmp_path_factory.mktemp('server') / 'w.log'
  with healthy_server(log, *SERVER_FLAGS) as url:
    yield url


@pytest.fixture
def workdir(tmp_path, monkeypatch):
  return make_workdir(tmp_path, monkeypatch)


def make_workdir(tmp_path, monkeypatch):
  """An SFT checkpoint that is not the server's initial weights (seed 5), and two prompts with 64x64 images."""
  c = _config()
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1,
                  policy.create_model(c, sharding.mesh_from_config(c.mesh), seed=5), None, {'stage': 'sft'})
  rng = np.random.default_rng(0)
  items = [{'prompt_id': f'q{i}', 'question': 'Which city is this?', 'answers': ['Agra'],
            'image': rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)} for i in range(2)]
  monkeypatch.setattr(data, 'load_prompts', lambda config, workdir: items)
  return tmp_path


def _run(server_url, workdir, max_staleness):
  model = grpo.train(_config(server_url, max_staleness), workdir)
  rows = metrics.read_metrics(workdir, 'grpo')
  engine = sc.SGLangEngine(server_url, max_new_tokens=8, temperature=0.0)
  assert engine.model_info()['weight_version'] == str(STEPS)
  assert sorted(p.name for p in (workdir / 'weights').iterdir()) == ['v00000002', 'v00000003']  # keep = 2
  assert [r['step'] for r in rows] == [1, 2, 3] and [r['weight_version'] for r in rows] == [1, 2, 3]
  assert all(r['stale_dropped'] == 0 and r['groups_dropped'] == 0 for r in rows)
  # every step trained on real turns (a 261-token prompt + a turn and its error reply fit 480, not 320)
  assert all(r['mean_turns'] >= 1 and r['unmasked_tokens'] > 0 for r in rows), rows
  # the step's phases (seconds) are timed apart and fit inside it; on-policy the rollout is one of them (step 1's
  # publish_seconds also holds the initial publish, before the loop)
  phases = ('rollout_seconds', 'score_seconds', 'update_seconds', 'publish_seconds')
  assert all(min(r[k] for k in phases) >= 0 for r in rows), rows
  if not max_staleness:
    assert all(sum(r[k] for k in phases) <= r['step_seconds'] for r in rows[1:]), rows
  return model, rows, engine


def test_on_policy_grpo_against_a_server_ends_with_the_trainers_weights(server, workdir):
  model, rows, engine = _run(server, workdir, max_staleness=0)
  # Step s rolls out with version s (published before it), then updates: staleness 0 throughout.
  assert [r['policy_versions'] for r in rows] == [[0], [1], [2]]
  assert [(r['staleness_mean'], r['staleness_max']) for r in rows] == [(0.0, 0)] * 3
  # The server now serves the trainer's final policy (float32 export): same log-probs of a greedy continuation.
  prompt = np.random.default_rng(3).integers(100, 150000, size=11).astype(np.int32)
  gen = engine.generate([(prompt, [])])[0]
  assert gen.weight_version == str(STEPS)
  served = np.asarray(gen.logprobs)
  np.testing.assert_allclose(served, trainer_logprobs(model, prompt, np.asarray(gen.ids)), atol=1e-4)
  # ... which are neither the server's initial weights' nor the SFT checkpoint's (the publishes mattered).
  initial = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))
  assert np.abs(served - trainer_logprobs(initial, prompt, np.asarray(gen.ids))).max() > 1e-3
  sft_model = policy.create_model(_config(), sharding.mesh_from_config(None), seed=5)
  assert np.abs(served - trainer_logprobs(sft_model, prompt, np.asarray(gen.ids))).max() > 1e-5


def test_one_step_async_grpo_trains_on_batches_one_version_behind(server, workdir):
  _, rows, _ = _run(server, workdir, max_staleness=1)
  # Batch 0 is rolled out with version 0 before any update; batch s >= 1 was rolled out with version s - 1 while
  # step s - 1 updated, and is trained on from version s: staleness 1.
  assert [r['policy_versions'] for r in rows] == [[0], [0], [1]]
  assert [(r['staleness_mean'], r['staleness_max']) for r in rows] == [(0.0, 0), (1.0, 1), (1.0, 1)]


def test_embedded_engine_async_and_a_resume_that_rolls_out_afresh(workdir):
  """The in-process JaxSampler reports the published version too. A run stopped after step 2 (its prefetched
  batch 3 is lost) resumes by rolling out batch 3 with version 2: on-policy again."""
  c = _config(max_staleness=1)
  c.rollout.engine = 'embedded'
  c.grpo.steps = 2
  grpo.train(c, workdir)
  c.grpo.steps = STEPS
  grpo.train(c, workdir)
  rows = metrics.read_metrics(workdir, 'grpo')
  assert [r['step'] for r in rows] == [1, 2, 3] and [r['weight_version'] for r in rows] == [1, 2, 3]
  assert [r['policy_versions'] for r in rows] == [[0], [0], [2]]
  assert [r['staleness_max'] for r in rows] == [0, 1, 0]
  assert not (workdir / 'weights').exists()  # nothing exported in process


def test_drop_stale_drops_whole_groups_older_than_max_staleness():
  """Version 5, max_staleness 1: a trajectory of version 3 is stale, and takes its group-mate (version 5) along."""
  traj = lambda pid, version: type('T', (), {'prompt_id': pid, 'policy_version': version})()
  batch = [traj('a', 4), traj('a', 5), traj('b', 3), traj('b', 5)]
  kept, stats = grpo.drop_stale(batch, 5, 1)
  assert kept == batch[:2]
  assert stats == {'stale_dropped': 1, 'groups_dropped': 1, 'staleness_mean': 0.75, 'staleness_max': 2}
  assert grpo.drop_stale(batch, 5, 2)[0] == batch


@pytest.mark.parametrize('fields, workdir, match', [
    ({'engine': 'vllm'}, '/tmp/w', 'rollout.engine'),
    ({'engine': 'sglang', 'urls': ()}, '/tmp/w', 'rollout.urls'),
    ({'engine': 'sglang', 'urls': '127.0.0.1:30000'}, '/tmp/w', 'rollout.urls'),
    ({'engine': 'sglang', 'urls': 'http://h:1', 'admin_urls': ('h:2',)}, '/tmp/w', 'rollout.admin_urls'),
    ({'engine': 'sglang', 'urls': 'http://h:1', 'weights_dtype': 'float16'}, '/tmp/w', 'rollout.weights_dtype'),
    ({'engine': 'sglang', 'urls': 'http://h:1', 'weights_keep': 0}, '/tmp/w', 'rollout.weights_keep'),
    ({'engine': 'sglang', 'urls': 'http://h:1'}, 'gs://bkt/run', 'rollout.weights_dir'),
    ({'engine': 'sglang', 'urls': 'http://h:1', 'weights_dir': 'gs://bkt/w'}, '/tmp/w', 'rollout.weights_dir'),
])
def test_check_config_names_the_bad_rollout_engine_field(fields, workdir, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.rollout.update(fields)
  with pytest.raises(ValueError, match=match):
    grpo.check_config(c, workdir)


def test_check_config_accepts_servers_with_a_local_weights_dir():
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  grpo.check_config(c, 'gs://bkt/run')  # the embedded engine exports nothing
  c.rollout.update(engine='sglang', urls=('http://h:1', 'http://h:2'), admin_urls=('http://w:1',))
  grpo.check_config(c, '/tmp/w')
  c.rollout.weights_dir = '/mnt/shared/weights'
  grpo.check_config(c, 'gs://bkt/run')

"""The mesh is built once per run (big_vision): the entry point builds it from `config.mesh` and passes it down to
policy creation, checkpoint restore, the sampler's model and the update; config checks compute with its shape alone
(`sharding.mesh_shape_from_config`). Counted at the one constructor, `sharding.make_mesh`, during tiny SFT and GRPO
runs (the fixtures of test_train.py and test_grpo_serve.py)."""

import jax
import pytest
from flax import nnx

from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import grpo, sft
from tests.train import test_grpo_serve, test_train


@pytest.fixture
def built(monkeypatch):
  """The meshes `sharding.make_mesh` builds from here on (`mesh_from_config` goes through it)."""
  meshes = []
  make = sharding.make_mesh

  def counting(*args, **kwargs):
    meshes.append(make(*args, **kwargs))
    return meshes[-1]

  monkeypatch.setattr(sharding, 'make_mesh', counting)
  return meshes


def _placed_on(model, mesh) -> bool:
  return all(leaf.sharding.mesh == mesh for leaf in jax.tree.leaves(nnx.state(model)) if isinstance(leaf, jax.Array))


def test_checking_a_config_builds_no_mesh(built):
  config = test_train.demo_config.get_config()
  config.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  config.mesh.fsdp = -1   # every device: the demo's batches split over them
  config.sft.batch_size = config.grpo.num_generations = len(jax.devices())
  sft.check_config(config)
  grpo.check_config(config)
  assert built == []
  config.mesh.fsdp = 4096
  with pytest.raises(ValueError, match='mesh.fsdp'):   # the shape is still checked against the devices
    sft.check_config(config)


def test_an_sft_run_builds_its_mesh_once_or_takes_mains(built, tmp_path):
  test_train._write_sft_dataset(test_train._episodes([test_train.SEARCH, test_train.ANSWER]), tmp_path / 'data')
  model = sft.train(test_train._config(tmp_path / 'data', 2), tmp_path / 'a')
  assert len(built) == 1 and _placed_on(model, built[0])
  mesh = sharding.mesh_from_config(None)   # main's
  built.clear()
  model = sft.train(test_train._config(tmp_path / 'data', 2), tmp_path / 'b', mesh)
  assert built == [] and _placed_on(model, mesh)


def test_a_grpo_run_builds_its_mesh_once(built, tmp_path, monkeypatch):
  workdir = test_grpo_serve.make_workdir(tmp_path, monkeypatch)
  built.clear()   # the fixture's SFT checkpoint is not part of the run
  config = test_grpo_serve._config()
  config.rollout.engine = 'embedded'
  config.grpo.update(steps=1, ckpt_every=1, beta=0.04)   # beta > 0: the reference policy is placed on it too
  model = grpo.train(config, workdir)
  assert len(built) == 1 and _placed_on(model, built[0])

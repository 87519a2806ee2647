"""A `gs://` workdir stays a URL from the trainers to orbax's tensorstore spec (never a local folder `gs:`)."""

import pathlib

import ml_collections
import pytest
from orbax.checkpoint._src.serialization import tensorstore_utils

from osvl_jax import checkpoints
from osvl_jax.checkpoints import storage
from osvl_jax.train import data


def test_a_gs_workdir_stays_a_url_and_a_local_one_becomes_absolute():
  assert str(storage.path('gs://bkt/run')) == 'gs://bkt/run'
  assert str(storage.path('gs://bkt/run/')) == 'gs://bkt/run'
  assert str(checkpoints.directory('gs://bkt/run', 'sft_ckpt')) == 'gs://bkt/run/sft_ckpt'
  assert str(checkpoints.directory(storage.path('gs://bkt/run'), 'grpo_ckpt')) == 'gs://bkt/run/grpo_ckpt'
  assert str(pathlib.Path('gs://bkt/run')) == 'gs:/bkt/run'  # the bug this guards against
  assert storage.is_remote('gs://bkt/run') and not storage.is_remote('workdir/gs:')
  assert str(storage.path('rel/dir')) == str(pathlib.Path('rel/dir').resolve())


@pytest.mark.parametrize('use_ocdbt', [True, False])
def test_orbax_hands_the_checkpoint_url_to_tensorstores_gcs_driver(use_ocdbt):
  """The kvstore spec orbax builds for our checkpoint directory: bucket and object path exactly as given."""
  directory = checkpoints.directory('gs://bkt/run', 'sft_ckpt') / '2' / 'params'
  spec = tensorstore_utils.build_kvstore_tspec(str(directory), name='model.embed', use_ocdbt=use_ocdbt)
  kvstore = spec['base'] if use_ocdbt else spec
  assert kvstore['driver'] == 'gcs' and kvstore['bucket'] == 'bkt'
  assert kvstore['path'].startswith('run/sft_ckpt/2/params')


def test_a_gs_workdir_needs_an_explicit_local_dataset():
  config = ml_collections.ConfigDict({'data': {'dir': ''}})
  with pytest.raises(ValueError, match='config.data.dir'):
    data.dataset_dir(config, 'gs://bkt/run')
  config.data.dir = '/data/set'
  assert str(data.dataset_dir(config, 'gs://bkt/run')) == '/data/set'

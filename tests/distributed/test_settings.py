"""When `osvl_jax.distributed.initialize` starts jax.distributed, read from the environment alone."""

import jax
import pytest

from osvl_jax import distributed


@pytest.mark.parametrize('env', [{}, {'OSVL_DISTRIBUTED': '0', 'TPU_WORKER_HOSTNAMES': 'a,b'},
                                 {'TPU_WORKER_HOSTNAMES': 'localhost'},
                                 {'OSVL_COORDINATOR_ADDRESS': 'h:1', 'OSVL_NUM_PROCESSES': '1',
                                  'OSVL_PROCESS_ID': '0'}])
def test_a_single_process_environment_initializes_nothing(env):
  assert distributed.settings(env) is None
  assert distributed.initialize(env) is False  # and does not touch jax.distributed


@pytest.mark.parametrize('env', [{'OSVL_DISTRIBUTED': 'auto'}, {'TPU_WORKER_HOSTNAMES': 't-w-0,t-w-1'},
                                 {'MEGASCALE_NUM_SLICES': '2'}])
def test_a_pod_leaves_the_cluster_to_jax_auto_detection(env):
  assert distributed.settings(env) == {}


def test_explicit_variables_give_coordinator_count_and_index():
  env = {'OSVL_COORDINATOR_ADDRESS': '127.0.0.1:1234', 'OSVL_NUM_PROCESSES': '2', 'OSVL_PROCESS_ID': '1'}
  assert distributed.settings(env) == {'coordinator_address': '127.0.0.1:1234', 'num_processes': 2,
                                       'process_id': 1}
  jax_name = {'JAX_COORDINATOR_ADDRESS': '10.0.0.2:8476', 'OSVL_NUM_PROCESSES': '4', 'OSVL_PROCESS_ID': '3'}
  assert distributed.settings(jax_name)['coordinator_address'] == '10.0.0.2:8476'


@pytest.mark.parametrize('env, match', [
    ({'OSVL_NUM_PROCESSES': '2'}, 'set all three'),
    ({'OSVL_COORDINATOR_ADDRESS': 'h:1', 'OSVL_NUM_PROCESSES': 'two', 'OSVL_PROCESS_ID': '0'}, 'integers'),
    ({'OSVL_COORDINATOR_ADDRESS': 'h:1', 'OSVL_NUM_PROCESSES': '2', 'OSVL_PROCESS_ID': '2'}, 'not in'),
])
def test_incomplete_or_wrong_variables_are_refused(env, match):
  with pytest.raises(ValueError, match=match):
    distributed.settings(env)


def test_one_process_feeds_every_row_and_is_the_writer():
  mesh = jax.sharding.Mesh(jax.devices(), ('data',))
  assert distributed.host_rows(mesh, 8) == slice(0, 8)
  assert distributed.host_rows(None, 3) == slice(0, 3)
  assert distributed.is_main()

"""`python -m osvl_jax.serve --mesh_tensor=T --mesh_data=R` (issue 49): the served sampler runs on a rollout layout
(tensor-parallel T, R replicas) and answers greedy /generate, text and image, with the ids of the unsharded
in-process sampler (log-probs within float tolerance). Needs 8 (simulated) devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8, inherited by the server process)."""

import httpx
import jax
import numpy as np
import pytest

from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.serve import launch
from tests.serve.conftest import NEW, healthy_server


@pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (simulated) devices')
def test_a_server_on_a_mesh_answers_greedy_generate_as_the_unsharded_sampler(tmp_path, reference, tokenizer,
                                                                             contexts):
  assert any(images for _, images in contexts)
  want = reference.generate(contexts)
  with healthy_server(tmp_path / 'serve.log', '--mesh_tensor=2', '--mesh_data=-1', '--prefix_cache_slots=0',
                      timeout=240) as url:
    info = httpx.get(url + '/server_info', timeout=10).json()
    assert (info['tp_size'], info['dp_size']) == (2, 4)
    got = sc.SGLangEngine(url, tokenizer, max_new_tokens=NEW, temperature=0.0).generate(contexts)
  for g, w in zip(got, want, strict=True):
    assert g.ids.tolist() == w.ids.tolist() and g.finish_reason == w.finish_reason
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=1e-5)


def test_bad_mesh_flags_are_refused_naming_the_field():
  with pytest.raises(ValueError, match=r'rollout\.mesh\.data=2 with rollout\.mesh\.tensor=0'):
    launch.build_service(tiny=True, mesh_tensor=0, mesh_data=2)
  with pytest.raises(ValueError, match=r'rollout\.mesh\.tensor=-3'):
    launch.build_service(tiny=True, mesh_tensor=-3)

"""The real Qwen3-VL family configs (8B, 4B config.json; 2B, 30B-A3B, 32B assembled hparams) parse, and the Flax
model's parameter count from abstract shapes equals the transformers model's on the meta device."""

import pytest

pytest.importorskip('torch')
pytest.importorskip('transformers')

from osvl_jax.models.qwen3_vl import params_count  # noqa: E402
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # noqa: E402
from osvl_jax.paths import data_dir  # noqa: E402

FAMILY = params_count.family_hf_dicts(data_dir() / 'qwen' / 'configs')


def test_family_configs_parse_with_their_published_shapes():
  shapes = {name: Qwen3VLConfig.from_hf_dict(d) for name, d in FAMILY.items()}
  assert {n: (c.text.hidden_size, c.text.num_hidden_layers, c.vision.depth) for n, c in shapes.items()} == {
      '8B': (4096, 36, 27), '4B': (2560, 36, 24), '2B': (2048, 28, 24), '30B-A3B': (2048, 48, 27),
      '32B': (5120, 64, 27)}
  moe = shapes['30B-A3B'].text
  assert shapes['30B-A3B'].is_moe and (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (
      128, 8, 768)
  assert shapes['4B'].tie_word_embeddings and shapes['2B'].tie_word_embeddings
  assert not shapes['8B'].tie_word_embeddings and not shapes['32B'].tie_word_embeddings


@pytest.mark.parametrize('name', list(FAMILY))
def test_flax_parameter_count_equals_transformers(name):
  flax_n = params_count.flax_param_count(FAMILY[name])
  assert flax_n == params_count.hf_param_count(FAMILY[name])
  expected_billions = {'8B': 8.77, '4B': 4.44, '2B': 2.13, '30B-A3B': 31.07, '32B': 33.36}[name]
  assert round(flax_n / 1e9, 2) == expected_billions

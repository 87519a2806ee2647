"""Parameter counts without allocation: Flax from `nnx.eval_shape`, transformers from a model on the meta device.

Used by `bench/param_count.py` and `tests/models/test_real_configs.py` to check that the Flax model built from a
real Qwen3-VL config has exactly the parameters of the HF model built from the same config.json.
"""

from __future__ import annotations

import json
import math
import pathlib

import jax
from flax import nnx

from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig, assembled_hf_dict
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel

REAL = {'8B': 'Qwen3-VL-8B-Instruct.config.json', '4B': 'Qwen3-VL-4B-Instruct.config.json'}
ASSEMBLED = {'2B': 'Qwen3-VL-2B-Instruct', '30B-A3B': 'Qwen3-VL-30B-A3B-Instruct', '32B': 'Qwen3-VL-32B-Instruct'}


def family_hf_dicts(root: str | pathlib.Path) -> dict[str, dict]:
  """{'8B', '4B', '2B', '30B-A3B', '32B'} -> HF config dict, from the files in `qwen/configs/`."""
  root = pathlib.Path(root)
  out = {name: json.loads((root / file).read_text()) for name, file in REAL.items()}
  assembled = json.loads((root / 'qwen3_vl_family_hparams.assembled.json').read_text())
  out.update({name: assembled_hf_dict(assembled, key) for name, key in ASSEMBLED.items()})
  return out


def flax_param_count(hf_dict: dict) -> int:
  """Number of parameters of `Qwen3VLModel(Qwen3VLConfig.from_hf_dict(hf_dict))`, from abstract shapes only."""
  config = Qwen3VLConfig.from_hf_dict(hf_dict)
  abstract = nnx.eval_shape(lambda: Qwen3VLModel(config, nnx.Rngs(0)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def hf_param_count(hf_dict: dict) -> int:
  """Number of (deduplicated, i.e. tied counted once) parameters of the transformers model on the meta device."""
  import torch
  import transformers
  # The raw dict goes to transformers (not our `to_hf_dict`), so a field our parser dropped would show up here.
  if 'Moe' in hf_dict['architectures'][0]:
    cfg, cls = transformers.Qwen3VLMoeConfig(**hf_dict), transformers.Qwen3VLMoeForConditionalGeneration
  else:
    cfg, cls = transformers.Qwen3VLConfig(**hf_dict), transformers.Qwen3VLForConditionalGeneration
  with torch.device('meta'):
    model = cls(cfg)
  return sum(p.numel() for p in model.parameters())

"""Parity matrix against transformers (PyTorch): the cases behind `tests/models/test_parity.py` and
`bench/parity.py` (DESIGN.md section 3).

Each case builds the HF reference model from a tiny random config (float32, eager attention), loads the same
weights into the Flax model (through `save_pretrained` + `weights.load_hf_folder`, so the on-disk layout is what
is tested), runs the same inputs through both and returns `CaseResult(ref, got, mask)`: float32 logits
[B, T, V] and the bool [B, T] positions compared (real tokens; padding is excluded because HF and we give
different but irrelevant values there). `max_abs_diff()` is the figure of merit:
  float32 cases <= `TOL` (2e-5); `bf16` (Flax bfloat16 params and compute vs HF float32) <= `BF16_TOL`.

torch / transformers / PIL are imported lazily: this module is only used by tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import tempfile

import jax.numpy as jnp
import numpy as np

from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import weights
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.trajectory import tokens as tokens_lib

TOL = 2e-5
BF16_TOL = 0.05  # max-abs logit difference, bf16 weights+compute vs float32 HF (tiny logits span about +-1)
IMAGE, VSTART, VEND = tokens_lib.IMAGE_PAD_ID, tokens_lib.VISION_START_ID, tokens_lib.VISION_END_ID
IM_START, IM_END = tokens_lib.IM_START_ID, tokens_lib.IM_END_ID
CASES = ('text', 'text_untied', 'one_image', 'multi_image_multi_turn', 'padded_batch', 'moe', 'bf16',
         'scan_multi_image_multi_turn', 'scan_moe')
# `scan_*`: the same inputs through a model built with `scan_layers=True` (stacked layers under `jax.lax.scan`).


@dataclasses.dataclass
class CaseResult:
  ref: np.ndarray     # float32 [B, T, V], transformers
  got: np.ndarray     # float32 [B, T, V], Flax
  mask: np.ndarray    # bool [B, T], positions compared

  def max_abs_diff(self) -> float:
    return float(np.abs(self.got - self.ref)[self.mask].max())


def hf_model(config: Qwen3VLConfig, seed: int = 0):
  """Random-init `transformers.Qwen3VL[Moe]ForConditionalGeneration` (float32, eager attention, eval mode)."""
  import torch
  import transformers
  torch.manual_seed(seed)
  if config.is_moe:
    hf_config = transformers.Qwen3VLMoeConfig(**config.to_hf_dict())
    cls = transformers.Qwen3VLMoeForConditionalGeneration
  else:
    hf_config = transformers.Qwen3VLConfig(**config.to_hf_dict())
    cls = transformers.Qwen3VLForConditionalGeneration
  hf_config._attn_implementation = 'eager'
  return cls(hf_config).eval()


def hf_and_flax(config: Qwen3VLConfig, seed: int = 0, folder: str | pathlib.Path | None = None, dtype=jnp.float32,
                scan_layers: bool = False):
  """(hf model, Flax model) with the same weights, the Flax one read back from `hf.save_pretrained(folder)`."""
  hf = hf_model(config, seed)
  with tempfile.TemporaryDirectory() as tmp:
    folder = pathlib.Path(folder or tmp)
    hf.save_pretrained(folder)
    model, _ = weights.load_hf_folder(folder, dtype=dtype, param_dtype=dtype, scan_layers=scan_layers)
  return hf, model


@functools.cache
def load_images() -> tuple[tuple[np.ndarray, np.ndarray], ...]:
  """((pixel_values [N, 1536] float32, grid [1, 3]), ...) for three real photos of different sizes (HF processor):
  grids (1, 6, 10), (1, 10, 6) and (1, 4, 4)."""
  import transformers
  from PIL import Image

  from osvl_jax.paths import data_dir
  proc = transformers.Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                               min_pixels=32 * 32, max_pixels=160 * 128)
  root = data_dir() / 'images' / 'landmarks'
  taj = np.asarray(Image.open(root / 'taj-mahal.jpg').convert('RGB').resize((200, 150)))
  ben = np.asarray(Image.open(root / 'big-ben.jpg').convert('RGB').resize((90, 160)))
  small = np.asarray(Image.open(root / 'taj-mahal.jpg').convert('RGB').resize((64, 64)))
  per_image = [proc(images=[im], return_tensors='np') for im in (taj, ben, small)]
  return tuple((p['pixel_values'].astype(np.float32), p['image_grid_thw'].astype(np.int64)) for p in per_image)


def image_tokens(grid) -> list[int]:
  """`<|vision_start|> <|image_pad|> * (t*h*w/4) <|vision_end|>` for one [3] grid."""
  return [VSTART] + [IMAGE] * (int(np.prod(grid)) // 4) + [VEND]


def hf_logits(hf, ids, attention_mask=None, pixel_values=None, grid=None) -> np.ndarray:
  """float32 [B, T, V] logits of the transformers model."""
  import torch
  kw = {'input_ids': torch.tensor(ids)}
  if attention_mask is not None:
    kw['attention_mask'] = torch.tensor(np.asarray(attention_mask).astype(np.int64))
  if pixel_values is not None:
    kw.update(pixel_values=torch.tensor(pixel_values), image_grid_thw=torch.tensor(grid),
              mm_token_type_ids=torch.tensor((np.asarray(ids) == IMAGE).astype(np.int32)))
  with torch.no_grad():
    return hf(**kw).logits.float().numpy()


def flax_logits(model, ids, attention_mask=None, pixel_values=None, grid=None) -> np.ndarray:
  """float32 [B, T, V] logits of the Flax model (positions from `rope.get_rope_index`)."""
  pos, _ = rope.get_rope_index(ids, grid, attention_mask)
  hidden, _ = model(ids, pos, attention_mask, pixel_values, grid)
  return np.asarray(model.logits(hidden))


def _pad(rows: list[list[int]], sides: list[str]) -> tuple[np.ndarray, np.ndarray]:
  """ids int64 [B, T] and mask bool [B, T] with each row padded on its side ('left' / 'right') by token 0."""
  length = max(map(len, rows))
  ids = np.zeros((len(rows), length), np.int64)
  mask = np.zeros((len(rows), length), bool)
  for r, (row, side) in enumerate(zip(rows, sides)):
    sl = slice(length - len(row), length) if side == 'left' else slice(0, len(row))
    ids[r, sl], mask[r, sl] = row, True
  return ids, mask


def case_inputs(name: str) -> dict:
  """Inputs of one case: {'ids' [B, T], 'mask' [B, T] bool | None, 'pixel_values' | None, 'grid' | None}."""
  imgs = load_images()
  if name in ('text', 'text_untied'):
    return {'ids': np.random.RandomState(0).randint(0, 151000, size=(2, 11)), 'mask': None,
            'pixel_values': None, 'grid': None}
  if name in ('one_image', 'moe', 'bf16', 'scan_moe'):
    pv, grid = imgs[0]
    ids = np.array([[IM_START, 872, 198] + image_tokens(grid[0]) + [3838, 374, 419, 30, IM_END, 198]])
    return {'ids': ids, 'mask': None, 'pixel_values': pv, 'grid': grid}
  if name in ('multi_image_multi_turn', 'scan_multi_image_multi_turn'):
    # user: img0 text / assistant: text / user: img1 img2 text -- three grids, two user turns.
    (pv0, g0), (pv1, g1), (pv2, g2) = imgs
    row = ([IM_START, 872, 198] + image_tokens(g0[0]) + [3838, 374, 30, IM_END, 198, IM_START, 77091, 198, 40, 1490,
                                                         IM_END, 198, IM_START, 872, 198]
           + image_tokens(g1[0]) + image_tokens(g2[0]) + [3838, 1008, 30, IM_END, 198, IM_START, 77091, 198])
    return {'ids': np.array([row]), 'mask': None, 'pixel_values': np.concatenate([pv0, pv1, pv2]),
            'grid': np.concatenate([g0, g1, g2])}
  if name == 'padded_batch':
    # Row 0 unpadded (2 images, 2 turns), row 1 left-padded (1 image), row 2 right-padded (text only).
    (pv0, g0), (pv1, g1), (pv2, g2) = imgs
    row0 = [IM_START, 872, 198] + image_tokens(g0[0]) + [30, IM_END, 198, IM_START] + image_tokens(g2[0]) + [5, 6]
    row1 = [IM_START, 872] + image_tokens(g1[0]) + [100, 200, 300]
    row2 = [IM_START, 872, 198, 9707, 1879, 30, IM_END, 198, IM_START, 77091]
    ids, mask = _pad([row0, row1, row2], ['left', 'left', 'right'])
    return {'ids': ids, 'mask': mask, 'pixel_values': np.concatenate([pv0, pv2, pv1]),
            'grid': np.concatenate([g0, g2, g1])}
  raise ValueError(f'unknown case {name!r}; known: {CASES}')


def case_config(name: str) -> Qwen3VLConfig:
  if name == 'text_untied':
    return Qwen3VLConfig.tiny(tie_word_embeddings=False)
  if name in ('moe', 'scan_moe'):
    return Qwen3VLConfig.tiny_moe()
  return Qwen3VLConfig.tiny()


@functools.cache
def _models(config: Qwen3VLConfig, bf16: bool = False, scan_layers: bool = False):
  hf, model = hf_and_flax(config, scan_layers=scan_layers)
  if bf16:
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    model = weights.load_hf_state_dict(config, state, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  return hf, model


def run_case(name: str) -> CaseResult:
  """Runs one parity case (models are built once per config and cached)."""
  inputs = case_inputs(name)
  hf, model = _models(case_config(name), name == 'bf16', name.startswith('scan_'))
  ref = hf_logits(hf, inputs['ids'], inputs['mask'], inputs['pixel_values'], inputs['grid'])
  got = flax_logits(model, inputs['ids'], inputs['mask'], inputs['pixel_values'], inputs['grid'])
  mask = np.ones(inputs['ids'].shape, bool) if inputs['mask'] is None else inputs['mask']
  return CaseResult(ref=ref, got=got, mask=mask)

"""HF <-> Flax checkpoint conversion for Qwen3-VL: one mapping table used in both directions.

Each rule pairs a HF parameter name template with a Flax parameter path template (dot-joined
`nnx.state(model)` path) and a transform. `{n}` matches a layer/block index; `{p}` matches one of the rule's
alternatives. HF names follow `Qwen3VLForConditionalGeneration.state_dict()` (transformers >= 4.57 and the hub
checkpoints): `model.visual.*`, `model.language_model.*`, `lm_head.weight`. Older layouts (`visual.*`,
`model.layers.*`) are normalised on load.

Transforms: `LINEAR` transposes torch's [out, in] to Flax's [in, out]; `CONV3D` flattens the [hidden, C, Tp, P, P]
patch-embedding kernel to [C*Tp*P*P, hidden]; `SAME` copies.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from flax import traverse_util

from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel


@dataclasses.dataclass(frozen=True)
class Transform:
  to_flax: Callable[[np.ndarray, Qwen3VLConfig], np.ndarray]
  to_hf: Callable[[np.ndarray, Qwen3VLConfig], np.ndarray]


SAME = Transform(lambda x, c: x, lambda x, c: x)
LINEAR = Transform(lambda x, c: x.T, lambda x, c: x.T)
CONV3D = Transform(
    lambda x, c: x.reshape(x.shape[0], -1).T,
    lambda x, c: x.T.reshape(x.shape[1], c.vision.in_channels, c.vision.temporal_patch_size,
                             c.vision.patch_size, c.vision.patch_size))

_V, _T = 'model.visual', 'model.language_model'
_MERGER = ('norm', 'linear_fc1', 'linear_fc2')

# (HF template, Flax template, transform, alternatives for {p})
RULES: tuple[tuple[str, str, Transform, tuple[str, ...]], ...] = (
    (f'{_V}.patch_embed.proj.weight', 'visual.patch_embed.proj.kernel', CONV3D, ()),
    (f'{_V}.patch_embed.proj.bias', 'visual.patch_embed.proj.bias', SAME, ()),
    (f'{_V}.pos_embed.weight', 'visual.pos_embed.embedding', SAME, ()),
    (f'{_V}.blocks.{{n}}.{{p}}.weight', 'visual.blocks.{n}.{p}.weight', SAME, ('norm1', 'norm2')),
    (f'{_V}.blocks.{{n}}.{{p}}.bias', 'visual.blocks.{n}.{p}.bias', SAME, ('norm1', 'norm2')),
    (f'{_V}.blocks.{{n}}.{{p}}.weight', 'visual.blocks.{n}.{p}.kernel', LINEAR,
     ('attn.qkv', 'attn.proj', 'mlp.linear_fc1', 'mlp.linear_fc2')),
    (f'{_V}.blocks.{{n}}.{{p}}.bias', 'visual.blocks.{n}.{p}.bias', SAME,
     ('attn.qkv', 'attn.proj', 'mlp.linear_fc1', 'mlp.linear_fc2')),
    (f'{_V}.merger.norm.{{p}}', 'visual.merger.norm.{p}', SAME, ('weight', 'bias')),
    (f'{_V}.merger.{{p}}.weight', 'visual.merger.{p}.kernel', LINEAR, ('linear_fc1', 'linear_fc2')),
    (f'{_V}.merger.{{p}}.bias', 'visual.merger.{p}.bias', SAME, ('linear_fc1', 'linear_fc2')),
    (f'{_V}.deepstack_merger_list.{{n}}.norm.{{p}}', 'visual.deepstack_merger_list.{n}.norm.{p}', SAME,
     ('weight', 'bias')),
    (f'{_V}.deepstack_merger_list.{{n}}.{{p}}.weight', 'visual.deepstack_merger_list.{n}.{p}.kernel', LINEAR,
     ('linear_fc1', 'linear_fc2')),
    (f'{_V}.deepstack_merger_list.{{n}}.{{p}}.bias', 'visual.deepstack_merger_list.{n}.{p}.bias', SAME,
     ('linear_fc1', 'linear_fc2')),
    (f'{_T}.embed_tokens.weight', 'language_model.embed_tokens.embedding', SAME, ()),
    (f'{_T}.layers.{{n}}.{{p}}.weight', 'language_model.layers.{n}.{p}.kernel', LINEAR,
     ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj',
      'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj')),
    (f'{_T}.layers.{{n}}.{{p}}.bias', 'language_model.layers.{n}.{p}.bias', SAME,
     ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj')),
    (f'{_T}.layers.{{n}}.{{p}}.weight', 'language_model.layers.{n}.{p}.weight', SAME,
     ('self_attn.q_norm', 'self_attn.k_norm', 'input_layernorm', 'post_attention_layernorm')),
    (f'{_T}.norm.weight', 'language_model.norm.weight', SAME, ()),
    ('lm_head.weight', 'lm_head.kernel', LINEAR, ()),
)


def _compile(template: str, alternatives: tuple[str, ...]) -> re.Pattern:
  pattern = re.escape(template).replace(r'\{n\}', r'(?P<n>\d+)')
  pattern = pattern.replace(r'\{p\}', '(?P<p>' + '|'.join(re.escape(a) for a in alternatives) + ')')
  return re.compile(pattern + '$')


_COMPILED = [(_compile(hf, alts), _compile(fx, alts), hf, fx, tr) for hf, fx, tr, alts in RULES]


def hf_to_flax_name(name: str) -> tuple[str, Transform] | None:
  """Flax path and transform for a HF parameter name (None if no rule matches)."""
  for hf_re, _, _, fx, tr in _COMPILED:
    if m := hf_re.match(name):
      return fx.format(**m.groupdict()), tr
  return None


def flax_to_hf_name(path: str) -> tuple[str, Transform] | None:
  """HF name and transform for a dot-joined Flax parameter path (None if no rule matches)."""
  for _, fx_re, hf, _, tr in _COMPILED:
    if m := fx_re.match(path):
      return hf.format(**m.groupdict()), tr
  return None


def _normalise_hf_name(name: str) -> str:
  """Maps legacy layouts (`visual.*`, `model.layers.*`, `model.embed_tokens`) to `model.visual` /
  `model.language_model`."""
  if name.startswith('visual.'):
    return 'model.' + name
  if name.startswith('model.') and not name.startswith(('model.visual.', 'model.language_model.')):
    return 'model.language_model.' + name[len('model.'):]
  return name


def _flat_params(model: Qwen3VLModel) -> dict[str, object]:
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return {'.'.join(str(k) for k in path): v for path, v in traverse_util.flatten_dict(pure).items()}


def load_hf_state_dict(model_or_config: Qwen3VLModel | Qwen3VLConfig, state_dict: Mapping[str, np.ndarray], *,
                       dtype=jnp.float32, param_dtype=jnp.float32, strict: bool = True) -> Qwen3VLModel:
  """Builds (or fills) a `Qwen3VLModel` from a HF state dict of numpy arrays.

  Args:
    model_or_config: an existing model (updated in place and returned) or a config (model built abstractly,
      no random init).
    state_dict: HF name -> numpy array (any float dtype; cast to `param_dtype`).
    strict: raise on HF tensors without a rule and on model parameters left unfilled. When
      `tie_word_embeddings`, a `lm_head.weight` in the dict is ignored.

  Returns:
    The model with the loaded parameters.
  """
  if isinstance(model_or_config, Qwen3VLConfig):
    config = model_or_config
    model = nnx.eval_shape(lambda: Qwen3VLModel(config, nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype))
  else:
    model, config = model_or_config, model_or_config.config
  targets = _flat_params(model)
  loaded, unknown = {}, []
  for name, value in state_dict.items():
    name = _normalise_hf_name(name)
    hit = hf_to_flax_name(name)
    if hit is None or hit[0] not in targets:
      if not (name == 'lm_head.weight' and config.tie_word_embeddings):
        unknown.append(name)
      continue
    path, tr = hit
    array = tr.to_flax(np.asarray(value), config)
    want = targets[path]
    if tuple(array.shape) != tuple(want.shape):
      raise ValueError(f'{name} -> {path}: shape {array.shape} != {want.shape}')
    loaded[path] = jnp.asarray(array, dtype=want.dtype)
  missing = sorted(set(targets) - set(loaded))
  if strict and (unknown or missing):
    raise ValueError(f'unmapped HF tensors: {unknown[:10]} ({len(unknown)}); missing params: {missing[:10]} '
                     f'({len(missing)})')
  graphdef, state = nnx.split(model)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  flat = traverse_util.flatten_dict(params)
  for path in flat:
    key = '.'.join(str(k) for k in path)
    if key in loaded:
      flat[path] = loaded[key]
  nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(flat))
  if isinstance(model_or_config, Qwen3VLConfig):
    return nnx.merge(graphdef, state)
  nnx.update(model, state)
  return model


def to_hf_state_dict(model: Qwen3VLModel, dtype=None) -> dict[str, np.ndarray]:
  """HF state dict (name -> numpy array) of a model; `lm_head.weight` omitted when tied (as `save_pretrained`).

  Args:
    dtype: optional numpy dtype to cast to (default: keep the parameter dtype).
  """
  out = {}
  for path, value in _flat_params(model).items():
    hit = flax_to_hf_name(path)
    if hit is None:
      raise ValueError(f'no HF name for parameter {path}')
    name, tr = hit
    array = tr.to_hf(np.asarray(jax.device_get(value)), model.config)
    out[name] = array.astype(dtype) if dtype is not None else array
  return out


_SAFETENSORS_DTYPES = {
    'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'BF16': ml_dtypes.bfloat16,
    'I64': np.int64, 'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_,
}


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """Reads a .safetensors file into numpy arrays (memory-mapped; bf16 via ml_dtypes)."""
  path = pathlib.Path(path)
  with open(path, 'rb') as f:
    header_len = int.from_bytes(f.read(8), 'little')
    header = json.loads(f.read(header_len))
  data = np.memmap(path, dtype=np.uint8, mode='r', offset=8 + header_len)
  out = {}
  for name, info in header.items():
    if name == '__metadata__':
      continue
    start, end = info['data_offsets']
    out[name] = data[start:end].view(_SAFETENSORS_DTYPES[info['dtype']]).reshape(info['shape'])
  return out


def load_hf_folder(path: str | pathlib.Path, *, dtype=jnp.float32, param_dtype=jnp.float32
                   ) -> tuple[Qwen3VLModel, Qwen3VLConfig]:
  """Loads a HF Qwen3-VL folder (`config.json` + `*.safetensors`) into a Flax model."""
  path = pathlib.Path(path)
  config = Qwen3VLConfig.from_hf_dict(json.loads((path / 'config.json').read_text()))
  state = {}
  for file in sorted(path.glob('*.safetensors')):
    state.update(read_safetensors(file))
  if not state:
    raise FileNotFoundError(f'no .safetensors files in {path}')
  return load_hf_state_dict(config, state, dtype=dtype, param_dtype=param_dtype), config


def save_hf_folder(model: Qwen3VLModel, path: str | pathlib.Path, dtype=None) -> None:
  """Writes `config.json` + `model.safetensors` that `transformers.Qwen3VLForConditionalGeneration
  .from_pretrained` loads."""
  from safetensors.numpy import save_file  # local: only needed for export
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  (path / 'config.json').write_text(json.dumps(model.config.to_hf_dict(), indent=2))
  tensors = {k: np.ascontiguousarray(v) for k, v in to_hf_state_dict(model, dtype).items()}
  save_file(tensors, str(path / 'model.safetensors'), metadata={'format': 'pt'})

"""HF <-> Flax checkpoint conversion for Qwen3-VL: one mapping table used in both directions.

Each rule pairs a HF parameter name template with a Flax parameter path template (dot-joined
`nnx.state(model)` path) and a transform. `{n}` matches a layer/block index; `{p}` matches one of the rule's
alternatives. HF names follow `Qwen3VLForConditionalGeneration.state_dict()` (transformers >= 4.57 and the hub
checkpoints): `model.visual.*`, `model.language_model.*`, `lm_head.weight`. Older layouts (`visual.*`,
`model.layers.*`) are normalised on load.

Transforms: `LINEAR` transposes torch's [out, in] to Flax's [in, out]; `CONV3D` flattens the [hidden, C, Tp, P, P]
patch-embedding kernel to [C*Tp*P*P, hidden]; `SAME` copies; `EXPERTS` handles the stacked MoE expert weights.

MoE expert layouts (HF `Qwen3VLMoeTextExperts`; transformers' `conversion_mapping.py` entry `qwen3_vl_moe`
transposes dims 1 and 2 on load when the shape differs):
  * hub checkpoints (`Qwen/Qwen3-VL-30B-A3B-*`, transformers 4.57): `gate_up_proj` [E, hidden, 2I],
    `down_proj` [E, I, hidden] -- the Flax layout (`layout='hub'`);
  * transformers>=5 in memory and `save_pretrained`: `gate_up_proj` [E, 2I, hidden], `down_proj` [E, hidden, I]
    (`layout='transformers'`, the default for export, so `to_hf_state_dict` equals `model.state_dict()`).
On load the layout is read from the shapes; only when hidden == 2I (resp. I) is it ambiguous, and then
`expert_layout` (or, for a folder, `config.json`'s `transformers_version`) decides.

A model built with `scan_layers=True` stores the decoder layers stacked (`language_model.layers.<p>` [L, ...]);
conversion sees it through the same per-layer paths (`language_model.layers.{n}.<p>` = stacked[n]).
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

from osvl_jax.models.qwen3_vl import sharding
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

EXPERTS = Transform(lambda x, c: x, lambda x, c: x)   # marker: layout handled by `_experts_to_flax` / `_to_hf`
EXPERT_LAYOUTS = ('hub', 'transformers')

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
    (f'{_T}.layers.{{n}}.mlp.gate.weight', 'language_model.layers.{n}.mlp.gate.kernel', LINEAR, ()),
    (f'{_T}.layers.{{n}}.mlp.experts.{{p}}', 'language_model.layers.{n}.mlp.experts.{p}', EXPERTS,
     ('gate_up_proj', 'down_proj')),
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


def _experts_to_flax(x: np.ndarray, want: tuple[int, ...], layout: str | None, name: str) -> np.ndarray:
  """Stacked expert weight in either HF layout -> Flax layout `want` ([E, hidden, 2I] or [E, I, hidden])."""
  want = tuple(want)
  transposed = (x.shape[0], x.shape[2], x.shape[1])
  if want[1] == want[2]:
    if layout not in EXPERT_LAYOUTS:
      raise ValueError(f'{name}: square expert matrices {x.shape}; pass expert_layout="hub" or "transformers"')
    return x if layout == 'hub' else x.transpose(0, 2, 1)
  if tuple(x.shape) == want:
    return x
  if transposed == want:
    return x.transpose(0, 2, 1)
  raise ValueError(f'{name}: expert weight shape {x.shape} fits neither layout of {want}')


_STACKED_PREFIX = 'language_model.layers.'


def _is_stacked(model: Qwen3VLModel) -> bool:
  return model.language_model.scan_layers


def _flat_params(model: Qwen3VLModel, shapes_only: bool = False) -> dict[str, object]:
  """Dot-joined parameter path -> array (ShapeDtypeStruct with `shapes_only`), stacked layers seen per layer
  (`shapes_only` then slices nothing)."""
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  flat = {'.'.join(str(k) for k in path): v for path, v in traverse_util.flatten_dict(pure).items()}
  if shapes_only:
    flat = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat.items()}
  if not _is_stacked(model):
    return flat
  out = {}
  for key, value in flat.items():
    if not key.startswith(_STACKED_PREFIX):
      out[key] = value
      continue
    rest = key[len(_STACKED_PREFIX):]
    for n in range(value.shape[0]):
      out[f'{_STACKED_PREFIX}{n}.{rest}'] = (jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
                                              if isinstance(value, jax.ShapeDtypeStruct) else value[n])
  return out


def load_hf_state_dict(model_or_config: Qwen3VLModel | Qwen3VLConfig, state_dict: Mapping[str, np.ndarray], *,
                       dtype=jnp.float32, param_dtype=jnp.float32, strict: bool = True,
                       expert_layout: str | None = None, scan_layers: bool = False,
                       mesh: jax.sharding.Mesh | None = None, rules=sharding.LOGICAL_RULES) -> Qwen3VLModel:
  """Builds (or fills) a `Qwen3VLModel` from a HF state dict of numpy arrays.

  Each tensor is converted and put on the device(s) as it is read, so the host holds one converted tensor at a time
  (the dict's values may be memory-mapped, as `read_safetensors`'s): with `mesh`, straight into its
  `NamedSharding` by the model's logical `rules` (each device receives only its shards); without, on the default
  device.

  Args:
    model_or_config: an existing model (updated in place and returned) or a config (model built abstractly,
      no random init).
    state_dict: HF name -> numpy array (any float dtype; cast to `param_dtype`).
    strict: raise on HF tensors without a rule and on model parameters left unfilled. When
      `tie_word_embeddings`, a `lm_head.weight` in the dict is ignored.
    expert_layout: 'hub' | 'transformers' | None (MoE only; needed only when the expert matrices are square, see
      the module docstring).
    scan_layers: layout of the model built from a config (ignored when a model is passed).
    mesh, rules: where to place the parameters (`sharding.state_shardings`); None = the default device.

  Returns:
    The model with the loaded parameters.
  Raises:
    ValueError: a tensor whose shape does not fit its parameter; with `strict`, unmapped tensors or unfilled
      parameters.
  """
  if isinstance(model_or_config, Qwen3VLConfig):
    config = model_or_config
    model = nnx.eval_shape(lambda: Qwen3VLModel(config, nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype,
                                                scan_layers=scan_layers))
  else:
    model, config = model_or_config, model_or_config.config
  targets = _flat_params(model, shapes_only=True)
  graphdef, state = nnx.split(model)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  placement = _placement(mesh, rules)
  loaded, unknown = {}, []
  for name, value in state_dict.items():
    name = _normalise_hf_name(name)
    hit = hf_to_flax_name(name)
    if hit is None or hit[0] not in targets:
      if not (name == 'lm_head.weight' and config.tie_word_embeddings):
        unknown.append(name)
      continue
    path, tr = hit
    want = targets[path]
    if tr is EXPERTS:
      array = _experts_to_flax(np.asarray(value), want.shape, expert_layout, name)
    else:
      array = tr.to_flax(np.asarray(value), config)
    if tuple(array.shape) != tuple(want.shape):
      raise ValueError(f'{name} -> {path}: shape {array.shape} != {want.shape}')
    loaded[path] = placement(path, np.asarray(array, dtype=want.dtype))   # on device(s); the host copy is freed
  missing = sorted(set(targets) - set(loaded))
  if strict and (unknown or missing):
    raise ValueError(f'unmapped HF tensors: {unknown[:10]} ({len(unknown)}); missing params: {missing[:10]} '
                     f'({len(missing)})')
  flat = traverse_util.flatten_dict(params)
  for path, value in flat.items():
    key = '.'.join(str(k) for k in path)
    if key in loaded:
      flat[path] = loaded[key]
    elif _is_stacked(model) and key.startswith(_STACKED_PREFIX):
      rest = key[len(_STACKED_PREFIX):]
      layers = [loaded.get(f'{_STACKED_PREFIX}{n}.{rest}') for n in range(value.shape[0])]
      if all(x is not None for x in layers):
        flat[path] = placement(key, layers)
  nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(flat))
  if isinstance(model_or_config, Qwen3VLConfig):
    return nnx.merge(graphdef, state)
  nnx.update(model, state)
  return model


def _placement(mesh: jax.sharding.Mesh | None, rules) -> Callable:
  """(dot path, host array | list of per-layer device arrays) -> device array, in the path's sharding on `mesh`
  (or on the default device); a list is stacked into the scan_layers parameter at `path`."""
  def place(path, value):
    if isinstance(value, list):
      shape = (len(value),) + tuple(value[0].shape)
      out = sharding.path_sharding(path, shape, mesh, rules) if mesh is not None else None
      return jax.jit(lambda *xs: jnp.stack(xs), out_shardings=out)(*value)
    if mesh is None:
      return jnp.asarray(value)
    return jax.device_put(value, sharding.path_sharding(path, value.shape, mesh, rules))

  return place


def check_exportable(config: Qwen3VLConfig) -> None:
  """Refuses a model an HF checkpoint cannot hold: one with a compact vocabulary (`TextConfig.vocab_ids`; HF
  Qwen3-VL has a row for every id, and zero rows would not give the compact model's distribution).

  Raises:
    ValueError: naming the compact vocabulary.
  """
  if config.text.vocab_ids is not None:
    raise ValueError(f'the model has a compact vocabulary of {len(config.text.vocab_ids)} Qwen ids (model.vocab): an '
                     f'HF checkpoint needs all {config.text.vocab_size} rows; export a model trained with '
                     "model.vocab='full'")


def to_hf_state_dict(model: Qwen3VLModel, dtype=None, expert_layout: str = 'transformers'
                     ) -> dict[str, np.ndarray]:
  """HF state dict (name -> numpy array) of a model; `lm_head.weight` omitted when tied (as `save_pretrained`).

  Args:
    dtype: optional numpy dtype to cast to (default: keep the parameter dtype).
    expert_layout: MoE expert weight layout, 'transformers' (as `save_pretrained` in transformers>=5) or 'hub'.
  Raises:
    ValueError: an unknown `expert_layout`; a compact vocabulary (`check_exportable`).
  """
  check_exportable(model.config)
  if expert_layout not in EXPERT_LAYOUTS:
    raise ValueError(f'expert_layout must be one of {EXPERT_LAYOUTS}')
  out = {}
  for path, value in _flat_params(model).items():
    hit = flax_to_hf_name(path)
    if hit is None:
      raise ValueError(f'no HF name for parameter {path}')
    name, tr = hit
    array = np.asarray(jax.device_get(value))
    if tr is EXPERTS:
      array = array if expert_layout == 'hub' else array.transpose(0, 2, 1)
    else:
      array = tr.to_hf(array, model.config)
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


def load_hf_folder(path: str | pathlib.Path, *, dtype=jnp.float32, param_dtype=jnp.float32,
                   scan_layers: bool = False, mesh: jax.sharding.Mesh | None = None,
                   rules=sharding.LOGICAL_RULES) -> tuple[Qwen3VLModel, Qwen3VLConfig]:
  """Loads a HF Qwen3-VL (or -MoE) folder (`config.json` + `*.safetensors`) into a Flax model. Square MoE expert
  matrices are read in the transformers>=5 layout when `config.json` says `transformers_version` >= 5, else the
  hub layout.

  The model is built abstractly and the safetensors files are memory-mapped: each tensor is read, converted and
  placed (with `mesh`: in its `NamedSharding` by `rules`) in turn, so no full host copy of the model exists.

  Raises:
    FileNotFoundError: no .safetensors file in `path`.
    ValueError: from `load_hf_state_dict`.
  """
  path = pathlib.Path(path)
  raw = json.loads((path / 'config.json').read_text())
  config = Qwen3VLConfig.from_hf_dict(raw)
  version = str(raw.get('transformers_version') or '4')
  layout = 'transformers' if version.split('.')[0].isdigit() and int(version.split('.')[0]) >= 5 else 'hub'
  state = {}
  for file in sorted(path.glob('*.safetensors')):
    state.update(read_safetensors(file))
  if not state:
    raise FileNotFoundError(f'no .safetensors files in {path}')
  model = load_hf_state_dict(config, state, dtype=dtype, param_dtype=param_dtype, expert_layout=layout,
                             scan_layers=scan_layers, mesh=mesh, rules=rules)
  return model, config


def save_hf_folder(model: Qwen3VLModel, path: str | pathlib.Path, dtype=None) -> None:
  """Writes `config.json` + `model.safetensors` that `transformers.Qwen3VLForConditionalGeneration` (or
  `Qwen3VLMoeForConditionalGeneration`) `.from_pretrained` loads.

  Raises:
    ValueError: a compact vocabulary (`check_exportable`), before anything is written.
  """
  from safetensors.numpy import save_file  # local: only needed for export
  check_exportable(model.config)
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  # The tensors are in the transformers>=5 layout (MoE experts); say so for `load_hf_folder`.
  config = {**model.config.to_hf_dict(), 'transformers_version': '5.0.0'}
  (path / 'config.json').write_text(json.dumps(config, indent=2))
  tensors = {k: np.ascontiguousarray(v) for k, v in to_hf_state_dict(model, dtype).items()}
  save_file(tensors, str(path / 'model.safetensors'), metadata={'format': 'pt'})

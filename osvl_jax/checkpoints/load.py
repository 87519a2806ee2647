"""A policy off disk or from config: `load_policy` (a checkpoint or an HF folder) and `build_model` (`config.model`).

The one way the server, export, evaluation and the trainers' reference model get a `Qwen3VLModel`.
"""

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from osvl_jax.checkpoints import resolve as resolve_lib
from osvl_jax.checkpoints import storage
from osvl_jax.checkpoints import store
from osvl_jax.data import pipeline as pipeline_data
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import weights

def build_model(config: ml_collections.ConfigDict, seed: int = 0, workdir: str | os.PathLike | None = None,
                mesh=None, rules=sharding.LOGICAL_RULES) -> model_lib.Qwen3VLModel:
  """The policy named by `config.model`: `hf_path` (an HF Qwen3-VL folder) if set, else `name` ('tiny').
  With `mesh`, an HF folder's weights are placed in their shardings by `rules` as they are read
  (`weights.load_hf_folder`); the tiny model is built on the default device either way.

  `config.model.text` (optional) overrides fields of the tiny text config, e.g. `num_hidden_layers`.
  `config.model.vocab` (optional) its vocabulary (`vocab_ids`; `workdir` finds the dataset of 'dataset').
  `config.model.scan_layers` / `config.model.remat` (optional, default False): run the decoder layers under
  `jax.lax.scan` (stacked parameter layout) / rematerialise each layer in the backward pass (`text.Qwen3VLText`);
  `config.model.attention` the attention kernel (`set_layer_options`).
  `config.model.dtype` / `param_dtype` (optional, default 'float32'): compute and parameter dtypes (the paper
  configs compute in bfloat16 over float32 parameters; the loss's log-softmax is float32 either way).
  Checkpoints keep the layout they were written with: resume with the same `scan_layers`.

  Raises:
    ValueError: for an unknown `config.model.name` or dtype; `vocab_ids`'.
  """
  scan_layers = bool(config.model.get('scan_layers', False))
  dtypes = model_dtypes(config)
  ids = vocab_ids(config, workdir)
  if config.model.get('hf_path'):
    model, _ = weights.load_hf_folder(config.model.hf_path, scan_layers=scan_layers, mesh=mesh, rules=rules, **dtypes)
  elif config.model.name != 'tiny':
    raise ValueError(f"config.model.name={config.model.name!r}: only 'tiny' is built in; set model.hf_path")
  else:
    model_config = config_lib.Qwen3VLConfig.tiny()
    if config.model.get('text'):
      model_config = dataclasses.replace(model_config,
                                         text=dataclasses.replace(model_config.text, **config.model.text.to_dict()))
    if ids is not None:
      model_config = dataclasses.replace(model_config, text=dataclasses.replace(model_config.text, vocab_ids=ids))
    model = model_lib.Qwen3VLModel(model_config, rngs=nnx.Rngs(seed), scan_layers=scan_layers, **dtypes)
  return set_layer_options(model, config)




def vocab_ids(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None = None) -> tuple[int, ...] | None:
  """The compact vocabulary `config.model.vocab` names (`TextConfig.vocab_ids`), sorted and unique; None for the
  full one. `model.vocab`: 'full' (default when absent) | 'dataset' (`<dataset dir>/vocab_ids.json`; the dataset dir
  is `config.data.dir`, else `<workdir>/data`) | a path to such a JSON file (a list of Qwen ids).

  Raises:
    ValueError: naming model.vocab: another value, a missing or unreadable file, not a list of ints, an id outside
      [0, vocab size), 'dataset' without data.dir nor a local workdir, a compact vocabulary with model.hf_path.
  """
  vocab = config.model.get('vocab') or 'full'
  if vocab == 'full':
    return None
  if not isinstance(vocab, str) or (vocab != 'dataset' and not vocab.endswith('.json')):
    raise ValueError(f"model.vocab={vocab!r}: expected 'full', 'dataset' or the path of a .json list of Qwen ids")
  if config.model.get('hf_path'):
    raise ValueError(f'model.vocab={vocab!r}: a compact vocabulary is for the tiny model; model.hf_path keeps its own')
  if vocab == 'dataset':
    data = config.get('data') or {}
    if not data.get('dir') and (workdir is None or storage.is_remote(workdir)):
      raise ValueError("model.vocab='dataset' needs config.data.dir (or a local workdir holding data/)")
    path = pipeline_data.dataset_dir(config, workdir) / pipeline_data.VOCAB_FILE
  else:
    path = pathlib.Path(vocab)
  try:
    ids = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ValueError(f'model.vocab={vocab!r}: cannot read the vocabulary {path}: {e}') from e
  size = int(((config.model.get('text') or {}).get('vocab_size')) or config_lib.TextConfig.vocab_size)
  if (not isinstance(ids, list) or not ids
      or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in ids)):
    raise ValueError(f'model.vocab={vocab!r}: {path} must hold a non-empty JSON list of Qwen ids in [0, {size})')
  return tuple(sorted(set(ids)))


ATTENTION_IMPLS = ('blockwise', 'cudnn')


def set_layer_options(model: model_lib.Qwen3VLModel, config: ml_collections.ConfigDict) -> model_lib.Qwen3VLModel:
  """Sets the decoder's run options (plain attributes, no parameter changes) from `config.model`: `remat`
  (default False) and `attention` (default 'blockwise': `attention.causal_attention`; 'cudnn': cuDNN's fused flash
  attention on NVIDIA GPUs, `attention.fused_causal_attention`). Returns the model.

  Raises:
    ValueError: `config.model.attention` not in ATTENTION_IMPLS.
  """
  impl = config.model.get('attention', 'blockwise')
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f'config.model.attention={impl!r}: expected one of {ATTENTION_IMPLS}')
  model.language_model.remat = bool(config.model.get('remat', False))
  model.language_model.attention_impl = impl
  return model


DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def model_dtypes(config: ml_collections.ConfigDict) -> dict:
  """{'dtype', 'param_dtype'} (jnp dtypes) from `config.model.dtype` / `param_dtype` (default 'float32').

  Raises:
    ValueError: naming the field, for a dtype outside `DTYPES`.
  """
  out = {}
  for field in ('dtype', 'param_dtype'):
    name = str(config.model.get(field) or 'float32')
    if name not in DTYPES:
      raise ValueError(f'model.{field}={name!r} is not one of {sorted(DTYPES)}')
    out[field] = DTYPES[name]
  return out


def is_hf_folder(path: str | os.PathLike) -> bool:
  """True for a local HF model folder (`config.json` beside the weights)."""
  p = pathlib.Path(str(path))
  return p.is_dir() and (p / 'config.json').is_file()


def _checkpoint(ref: str | os.PathLike, workdir, step: int | None, hf_config):
  """(folder, step, manager, make) of a checkpoint reference; make() builds its architecture (random init)."""
  folder, step = resolve_lib.resolve(workdir, str(ref), step)
  mngr = store.manager(folder.parent, folder.name)
  saved = store.read_meta(mngr, step)
  config = resolve_lib.read_config(hf_config, saved)
  make = lambda: model_lib.Qwen3VLModel(config, nnx.Rngs(0), scan_layers=bool(saved.get('scan_layers', False)))
  return folder, step, mngr, make


def policy_shape(ref: str | os.PathLike, workdir: str | os.PathLike | None = None, step: int | None = None,
                 hf_config: str | os.PathLike | None = None, **hf_options) -> model_lib.Qwen3VLModel:
  """The policy `load_policy` would load, abstract (`nnx.eval_shape`: each parameter a `jax.ShapeDtypeStruct`; only
  the checkpoint's meta or the HF folder's config.json is read): what a layout is sized from before any weight is
  placed (`rollout.embedded.layout.rollout_mesh`).

  Args:
    ref, workdir, step, hf_config: as `load_policy`.
    hf_options: for an HF folder, `dtype` / `param_dtype` / `scan_layers` as given to `weights.load_hf_folder`
      (default float32, False: `load_policy`'s); a checkpoint records its own.
  Raises:
    FileNotFoundError / ValueError: as `load_policy` (no such checkpoint; a named reference without `workdir`).
  """
  if is_hf_folder(ref):
    config = config_lib.Qwen3VLConfig.from_hf_dict(json.loads((pathlib.Path(str(ref)) / 'config.json').read_text()))
    return nnx.eval_shape(lambda: model_lib.Qwen3VLModel(config, nnx.Rngs(0), **hf_options))
  return nnx.eval_shape(_checkpoint(ref, workdir, step, hf_config)[3])


def load_policy(ref: str | os.PathLike, workdir: str | os.PathLike | None = None, step: int | None = None,
                hf_config: str | os.PathLike | None = None, mesh=None,
                rules=None) -> tuple[model_lib.Qwen3VLModel, dict]:
  """Loads a policy: an HF folder, or an orbax checkpoint of the project.

  Args:
    ref: an HF folder (`config.json` + `*.safetensors`), or a checkpoint reference (`resolve.resolve`): 'latest' |
      'sft' | 'grpo' (with `workdir`), a `*_ckpt` folder, one step folder of it, or a workdir.
    workdir: the job folder for the named references.
    step: the checkpoint step (None: the latest, or the step folder's).
    hf_config: architecture override (`resolve.read_config`); default: the checkpoint meta's `model_config`.
    mesh, rules: place each weight in its `NamedSharding` on `mesh` by `rules` (default `sharding.LOGICAL_RULES`;
      a rollout layout: `layout.DECODE_RULES`) as it is read, with no whole copy of the model anywhere: an HF
      folder tensor by tensor (`weights.load_hf_folder`), a checkpoint restored by orbax straight into those
      shardings (each device reads its shards). None: unsharded, on the default device.
  Returns:
    (model, meta): the checkpoint's meta with 'step', 'path' (`<folder>/<step>`) and 'folder'; {'path'} for an HF
    folder.
  Raises:
    FileNotFoundError: no such checkpoint / folder.
    ValueError: the checkpoint does not fit the architecture; a named reference without `workdir`.
  """
  rules = rules or sharding.LOGICAL_RULES
  if is_hf_folder(ref):
    model, _ = weights.load_hf_folder(pathlib.Path(str(ref)), mesh=mesh, rules=rules)
    return model, {'path': str(ref)}
  folder, step, mngr, make = _checkpoint(ref, workdir, step, hf_config)
  if mesh is None:
    model = make()
  else:   # abstract parameters carrying their target shardings: orbax reads each shard onto its device
    graphdef, state = nnx.split(nnx.eval_shape(make))
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                         sharding.state_shardings(state, mesh, rules))
    model = nnx.merge(graphdef, state)
  try:
    meta = store.restore(mngr, model, step=step)
  except ValueError as e:   # shape / structure mismatch
    raise ValueError(f'checkpoint {folder} does not fit this architecture (pass hf_config): {e}') from e
  return model, {**meta, 'path': f'{folder}/{step}', 'folder': str(folder)}

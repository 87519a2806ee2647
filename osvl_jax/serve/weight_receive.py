"""Checks a weight update before it replaces the served weights (`/update_weights_from_disk`, DESIGN.md §6b).

A server keeps serving its old weights unless the new ones are the same architecture and finite:

  - `architecture_diff`: every field of the Qwen3-VL config (text, vision and top level: depth, widths, heads,
    experts, rope, token ids, tied head) and the compute dtype equal the served model's, and every parameter has
    the same path, shape and dtype. A deeper, wider or MoE checkpoint for a dense server is refused with a message
    naming what differs (SGLang answers such an update `{"success": false, "message": ...}` too).
  - `nonfinite_params`: one jitted reduction (per-parameter `all(isfinite)`, a bool vector, one host transfer)
    names the parameters holding NaN or Inf.

  - `smoke_forward`: finite weights can still overflow when run (e.g. a layer scaled far up): one forward pass of
    a few text tokens must give finite log-probs, computed in the served model's compute dtype.

`check_update` runs all three and raises `UpdateRefused`; the caller leaves the old weights (and version, and
prefix cache) in place. `load_model` loads an update from a private copy of an HF folder.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

_SHOWN = 4   # differences named in a message at most


class UpdateRefused(ValueError):
  """A weight update that would change the served architecture or holds non-finite values."""


def _config_fields(config, prefix: str = '') -> dict:
  """{'text.hidden_size': 64, ...}: the config's fields, nested dataclasses flattened with dotted names."""
  out = {}
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    if dataclasses.is_dataclass(value):
      out.update(_config_fields(value, f'{prefix}{f.name}.'))
    else:
      out[f'{prefix}{f.name}'] = value
  return out


def _param_specs(model) -> dict:
  """{'path/to/param': (shape, dtype name)} of every `nnx.Param` of `model`."""
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return {'/'.join(map(str, path)): (tuple(v.get_value().shape), str(v.get_value().dtype)) for path, v in flat}


def _name_some(items: list[str]) -> str:
  more = f' (and {len(items) - _SHOWN} more)' if len(items) > _SHOWN else ''
  return '; '.join(items[:_SHOWN]) + more


def architecture_diff(served, new) -> str | None:
  """What differs between the architectures of two `Qwen3VLModel`s, or None when they are the same.

  Returns:
    A message naming up to four differing config fields (served -> new), then, when the configs agree, up to four
    parameters whose path, shape or dtype differ.
  """
  a, b = _config_fields(served.config), _config_fields(new.config)
  a['dtype'], b['dtype'] = str(np.dtype(served.dtype)), str(np.dtype(new.dtype))
  fields = [f'{k}: {a.get(k)!r} -> {b.get(k)!r}' for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
  if fields:
    return f'the update changes the architecture: {_name_some(fields)}'
  pa, pb = _param_specs(served), _param_specs(new)
  params = [f'{k}: missing' if k not in pb else f'{k}: unexpected' if k not in pa
            else f'{k}: {pa[k][0]} {pa[k][1]} -> {pb[k][0]} {pb[k][1]}'
            for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)]
  if params:
    return f'the update changes the parameters (path: served -> new): {_name_some(params)}'
  return None


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
  return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def nonfinite_params(model) -> list[str]:
  """Paths of `model`'s floating-point parameters holding a NaN or an Inf (one jitted reduction on device)."""
  flat = [(path, v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
          if jnp.issubdtype(v.get_value().dtype, jnp.inexact)]
  if not flat:
    return []
  ok = np.asarray(_all_finite([x for _, x in flat]))
  return ['/'.join(map(str, path)) for (path, _), good in zip(flat, ok) if not good]


SMOKE_TOKENS = 8   # text tokens of the smoke forward pass


@nnx.jit
def _smoke(model, ids):
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), (3,) + ids.shape)
  hidden, _ = model(ids, positions)
  logprobs = jax.nn.log_softmax(model.logits(hidden).astype(jnp.float32), axis=-1)
  return jnp.all(jnp.isfinite(hidden)) & jnp.all(jnp.isfinite(logprobs)), hidden[0, 0, 0]


def smoke_forward(served, new) -> str | None:
  """Why `new` cannot serve, from one forward pass of `SMOKE_TOKENS` ids spread over the vocabulary (None: it
  can): non-finite activations or log-probs (weights that overflow when run), or a compute dtype other than the
  served model's."""
  vocab = new.config.text.vocab_ids
  rows = np.linspace(0, (len(vocab) if vocab is not None else new.config.text.vocab_size) - 1, SMOKE_TOKENS)
  ids = np.asarray(vocab, np.int32)[rows.astype(int)] if vocab is not None else rows.astype(np.int32)
  finite, sample = _smoke(new, jnp.asarray(ids[None]))
  want = np.dtype(served.dtype)
  if np.dtype(sample.dtype) != want:
    return f'the update computes in {np.dtype(sample.dtype)}, the served model in {want}'
  if not bool(finite):
    return (f'the update overflows when run: a forward pass of {SMOKE_TOKENS} tokens gives non-finite activations '
            'or log-probs')
  return None


def check_update(served, new) -> None:
  """Refuses `new` as the replacement of the served model `served` (both `Qwen3VLModel`s).

  Raises:
    UpdateRefused: the architecture differs (`architecture_diff`), parameters hold NaN / Inf (named), or the
      smoke forward pass fails (`smoke_forward`).
  """
  diff = architecture_diff(served, new)
  if diff:
    raise UpdateRefused(diff)
  bad = nonfinite_params(new)
  if bad:
    raise UpdateRefused(f'the update holds non-finite values (NaN or Inf) in {len(bad)} parameter(s): '
                        f'{_name_some(bad)}')
  smoke = smoke_forward(served, new)
  if smoke:
    raise UpdateRefused(smoke)


def load_model(path: str, layout=None):
  """The server's weight loader: `checkpoints.load_policy(path)`'s model (an HF folder or a checkpoint), read
  straight into the rollout `layout`'s shardings when the server runs on one (`rollout.embedded.layout.Layout`;
  None: unsharded, on the default device): no whole copy of the update on one device. An HF
  folder is first copied file by file into a private temporary folder and loaded from there (its safetensors are
  memory-mapped, and the served arrays may alias the mapping): a file rewritten in place while, or after, it
  loads can neither crash the server (SIGBUS) nor change the served weights. Needs the folder's size free in
  $TMPDIR while it loads.

  Raises:
    ValueError: a file of the folder changed while it was copied (written in place: publish by renaming).
    FileNotFoundError / ValueError: from `checkpoints.load_policy`.
  """
  from osvl_jax import checkpoints  # pylint: disable=g-import-not-at-top
  placed = {} if layout is None else {'mesh': layout.mesh, 'rules': layout.rules}
  if not checkpoints.is_hf_folder(path):
    return checkpoints.load_policy(path, **placed)[0]
  with tempfile.TemporaryDirectory(prefix='osvl-weights-') as private:
    for name in sorted(os.listdir(path)):
      src = os.path.join(path, name)
      if os.path.isfile(src):   # the loader reads the folder's files only
        with open(src, 'rb') as f, open(os.path.join(private, name), 'wb') as out:
          before = os.fstat(f.fileno())
          shutil.copyfileobj(f, out, 16 << 20)
          after, copied = os.fstat(f.fileno()), out.tell()
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or copied != after.st_size:
          raise ValueError(f'{src} changed while it was read (written in place?): not loaded')
    return checkpoints.load_policy(private, **placed)[0]   # the mapped copy's pages outlive its deletion

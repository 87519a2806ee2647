"""Publishing the trainer's policy to the rollout engines, versioned (DESIGN.md §6b).

SGLang servers (and `python -m osvl_jax.serve`) load new weights from disk: `publish` exports the policy as an HF
folder `<root>/v<version>` (`export_folder.write`: written to a temporary folder beside it and renamed as the last
step, so a server never sees a half-written one; marked as an export of kind 'weight_version'), then calls
`/update_weights_from_disk` on every server with SGLang's `weight_version` field set to the version, and deletes the
oldest version folders beyond `keep` (a server may still be reading the previous one). Only exports it wrote are
ever replaced or deleted: a `v<digits>` folder without the marker, or holding a file the marker does not list, is
left in place (a foreign folder under the new version's name is refused). The engine sends its API key
(`SGLangEngine(api_key=...)`, default `$OSVL_API_KEY` / `$SGLANG_API_KEY`), and a server with `--weights_root` must
have `root` inside one of its roots. The embedded JAX sampler swaps weights in process (`JaxSampler.set_model` on a
snapshot of the policy, no export) and takes the same version.

Multi-host (HTTP engines only): every process calls `publish` at the same point; all take part in gathering the
full parameters (`host_copy`), process 0 alone writes the folder and calls the servers, then every process waits
for its outcome (`distributed.broadcast_object`), so no host runs ahead of the published version, and a failure on
process 0 (a server refusing the update, a full disk) raises on every process instead of leaving the others
waiting at a barrier.

  sync = WeightPublisher(engine, root=workdir / 'weights', min_pixels=..., max_pixels=...)
  sync.publish(model, version=step)   # after the optimizer step that produced `version`
"""

from __future__ import annotations

import os
import pathlib
import time

import jax
from absl import logging
from flax import nnx

from osvl_jax import distributed, export_folder, export_hf

DTYPES = ('float32', 'bfloat16')
KIND = 'weight_version'  # the `export_folder` kind of a version folder


class PublishFailed(RuntimeError):
  """Raised on processes other than 0 when process 0 failed to export or publish a weight version."""


def folder_name(version: int) -> str:
  """`v<version>` zero-padded to 8 digits, so folder names sort by version."""
  return f'v{int(version):08d}'


def export_version(model, root: str | os.PathLike, version: int, min_pixels: int, max_pixels: int,
                   dtype: str = 'bfloat16', keep: int = 2) -> pathlib.Path:
  """Writes the HF folder of `model` as `<root>/v<version>` and prunes older versions.

  Args:
    model: the policy (`Qwen3VLModel`), possibly sharded: arrays are gathered to host one at a time by
      `weights.save_hf_folder`.
    root: local folder holding the versions (a GPU host must be able to read it: a shared filesystem or the
      same machine).
    version: the weight version (int >= 0).
    min_pixels, max_pixels: the image processor budget of the policy (its preprocessor_config.json).
    dtype: 'bfloat16' (what SGLang serves) or 'float32' (bit-exact log-probs against the trainer).
    keep: versions kept on disk, the new one included (>= 1): the newest older ones stay; versions above
      `version` (written before a resume went back to an older checkpoint) are deleted. Only version folders
      this module wrote (`export_folder.is_export` of `KIND`) count and are deleted; others are left, warned.
  Returns:
    The new folder.
  Raises:
    ValueError: a bad version, dtype or keep.
    export_folder.UnsafeTarget: `<root>/v<version>` exists and is not a version folder this module wrote.
  """
  if int(version) < 0:
    raise ValueError(f'version={version}: weight versions are integers >= 0')
  if dtype not in DTYPES:
    raise ValueError(f'dtype={dtype!r}: expected one of {DTYPES}')
  if int(keep) < 1:
    raise ValueError(f'keep={keep}: at least the new version must stay on disk')
  root = pathlib.Path(root).absolute()
  root.mkdir(parents=True, exist_ok=True)
  out = export_folder.write(root / folder_name(version),
                            lambda tmp: export_hf.write_folder(model, tmp, dtype, int(min_pixels), int(max_pixels)),
                            KIND, overwrite=True, info={'version': int(version), 'dtype': dtype})
  versions = []
  for p in sorted(root.iterdir()):
    if p.is_dir() and p.name.startswith('v') and p.name[1:].isdigit() and p.name != out.name:
      if export_folder.is_export(p, KIND):
        versions.append(p)
      else:
        logging.warning('weight_publish: %s is not a version folder it wrote; left in place', p)
  older = [p for p in versions if int(p.name[1:]) < int(version)]
  newer = [p for p in versions if int(p.name[1:]) > int(version)]  # left by a run that went further (a resume)
  for old in newer + older[:max(len(older) - (int(keep) - 1), 0)]:
    export_folder.remove_export(old, KIND)
  return out


def host_copy(model):
  """`model` with every parameter gathered to host numpy (a collective over all processes: each calls it at the
  same point); the other state is shared with `model`. In a single process `model` itself (the export reads one
  array at a time)."""
  if jax.process_count() == 1:
    return model
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return nnx.merge(graphdef, distributed.to_host(params), rest)


class WeightPublisher:
  """Hands each new policy version to the rollout engine.

  Args:
    engine: an `Engine` whose `weight_updates` is 'disk' (`SGLangEngine`: SGLang servers, `osvl_jax.serve`, a router
      with `admin_urls` naming its workers) or 'in_process' (the embedded `JaxSampler`).
    root: where HF folders are exported (HTTP engines only).
    min_pixels, max_pixels: the policy's image processor budget (written into each exported folder).
    dtype: exported weight dtype ('bfloat16' or 'float32').
    keep: exported versions kept on disk.
  Attributes:
    version: the last published version (None before the first `publish`).
  """

  def __init__(self, engine, root: str | os.PathLike | None = None, min_pixels: int = 0, max_pixels: int = 0,
               dtype: str = 'bfloat16', keep: int = 2):
    self.engine, self.dtype, self.keep = engine, dtype, int(keep)
    if engine.weight_updates not in ('disk', 'in_process'):
      raise TypeError(f'WeightPublisher: {type(engine).__name__} takes no weight updates (Engine.weight_updates='
                      f'{engine.weight_updates!r})')
    self.remote = engine.weight_updates == 'disk'
    if self.remote and root is None:
      raise ValueError('WeightPublisher: an HTTP engine needs `root`, the folder the servers load exported weights '
                       'from')
    if self.remote and not 1 <= int(min_pixels) <= int(max_pixels):
      raise ValueError(f'WeightPublisher: min_pixels={min_pixels}, max_pixels={max_pixels}: need 1 <= min <= max '
                       '(the exported preprocessor_config.json)')
    self.root = None if root is None else pathlib.Path(root)
    self.min_pixels, self.max_pixels = int(min_pixels), int(max_pixels)
    self.version: int | None = None

  def publish(self, model, version: int) -> dict:
    """Makes `model` the weights every later generation uses, as version `version`.

    Multi-host: every process calls it; process 0 exports and calls the servers, the others return
    {'path': '', 'servers': []} once it is done (module docstring).

    Returns:
      {'version': int, 'path': exported folder or '' (embedded), 'seconds': wall time, 'servers': answers}.
    Raises:
      sglang_protocol.EngineError: a server refused the update (it keeps its old weights and version).
      PublishFailed: on the other processes of a multi-process job, when process 0 failed (its error named).
      ValueError: an embedded engine in a multi-process job.
    """
    t0 = time.time()
    path, answers = '', []
    if self.remote:
      host_model = host_copy(model)  # every process: the gathers are collectives
      error = None
      if distributed.is_main():
        try:
          path = str(export_version(host_model, self.root, version, self.min_pixels, self.max_pixels, self.dtype,
                                    self.keep))
          answers = self.engine.update_weights_from_disk(path, weight_version=str(int(version)))
        except Exception as e:  # pylint: disable=broad-except
          error = e
      failed = distributed.broadcast_object(None if error is None else f'{type(error).__name__}: {error}')
      if error is not None:
        raise error
      if failed is not None:
        raise PublishFailed(f'process 0 failed to publish weight version {int(version)}: {failed}')
    elif jax.process_count() > 1:
      raise ValueError('WeightPublisher: the embedded engine runs in one process; a multi-process job needs servers')
    else:  # a snapshot: the trainer updates `model`'s Variables in place, maybe while the sampler generates
      self.engine.set_model(model, weight_version=str(int(version)))  # a snapshot (`JaxSampler.set_model`)
    self.version = int(version)
    return {'version': int(version), 'path': path, 'seconds': time.time() - t0, 'servers': answers}

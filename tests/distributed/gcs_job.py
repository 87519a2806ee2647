"""A job run by `test_gcs_checkpoint.py` against a local fake GCS server (environment set by the test).

Saves the tiny model and its optimizer to `gs://<bucket>/run/sft_ckpt` at steps 1 and 2 (asynchronously, keep 1),
restores them into a fresh model sharded over 4 CPU devices (another placement than the one that saved), and
exports the HF folder from the `gs://` workdir. Prints one JSON line with what it checked.
"""

import json
import sys

import jax
import numpy as np
import optax
from flax import nnx
from safetensors.numpy import load_file

from osvl_jax import checkpoints
from osvl_jax import export_hf
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding


META = {'stage': 'sft', 'image_processor': {'min_pixels': 64 * 64, 'max_pixels': 128 * 128}}


def params(model) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def main(workdir: str, out: str) -> None:
  config = config_lib.Qwen3VLConfig.tiny()
  model = model_lib.Qwen3VLModel(config, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  mngr = checkpoints.manager(workdir, 'sft_ckpt', max_to_keep=1)
  checkpoints.save(mngr, 1, model, optimizer, META, wait=False)
  checkpoints.save(mngr, 2, model, optimizer, META, wait=False)
  mngr.wait_until_finished()

  fresh = model_lib.Qwen3VLModel(config, rngs=nnx.Rngs(1))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:4]).reshape(1, 4, 1, 1), sharding.MESH_AXES)
  sharding.shard_model(fresh, mesh)
  fresh_opt = nnx.Optimizer(fresh, optax.adamw(1e-3), wrt=nnx.Param)
  meta = checkpoints.restore(checkpoints.manager(workdir, 'sft_ckpt'), fresh, fresh_opt)
  embed = fresh.language_model.embed_tokens.embedding.value
  info = export_hf.export(workdir, out)
  exported = load_file(f'{out}/model.safetensors')
  print(json.dumps({
      'restored_step': meta['step'],
      'steps_kept': [int(s) for s in checkpoints.manager(workdir, 'sft_ckpt').all_steps()],
      'params_equal': all(np.array_equal(a, b) for a, b in zip(params(model), params(fresh))),
      'restored_embed_shards': len({s.device for s in embed.addressable_shards}),
      'export': {k: info[k] for k in ('checkpoint', 'path', 'step', 'params')},
      'exported_embed_equal': bool(np.array_equal(exported['model.language_model.embed_tokens.weight'],
                                                  np.asarray(model.language_model.embed_tokens.embedding.value))),
  }), flush=True)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])

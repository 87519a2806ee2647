"""Exports the latest trained checkpoint of a workdir as a Hugging Face Qwen3-VL folder.

Command:
  python -m osvl_jax.export_hf --workdir=W --out=DIR [--hf_config=PATH] [--dtype=float32|bfloat16] [--step=N]

Reads the latest orbax checkpoint under `W/grpo_ckpt` (else `W/sft_ckpt`; `osvl_jax/train/checkpoint.py`, item
'params' = `nnx.state(model, nnx.Param)`) into a model of the architecture the checkpoint's meta records (the
trainers write it; `--hf_config`, a config.json or a HF folder holding one, overrides it; checkpoints without it
default to the built-in tiny config) and its parameter layout (`scan_layers`), then writes `DIR/config.json`, `DIR/model.safetensors` (`weights.save_hf_folder`)
and the tokenizer files (`osvl_jax.trajectory.load_tokenizer().save_pretrained`). The folder loads with
`transformers.Qwen3VLForConditionalGeneration.from_pretrained(DIR)` (or the MoE class) and gives the same logits.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from osvl_jax.models.qwen3_vl import weights
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel

CHECKPOINT_DIRS = ('grpo_ckpt', 'sft_ckpt')   # in order of preference


def read_config(hf_config: str | pathlib.Path | None, meta: dict | None = None) -> Qwen3VLConfig:
  """The model architecture: from a config.json (or a folder containing one), else the checkpoint meta's
  `model_config`, else `Qwen3VLConfig.tiny()`."""
  if not hf_config:
    if meta and meta.get('model_config'):
      return Qwen3VLConfig.from_hf_dict(meta['model_config'])
    return Qwen3VLConfig.tiny()
  path = pathlib.Path(hf_config)
  path = path / 'config.json' if path.is_dir() else path
  return Qwen3VLConfig.from_hf_dict(json.loads(path.read_text()))


def latest_checkpoint(workdir: str | pathlib.Path) -> tuple[str, int]:
  """(checkpoint dir name, step) of the checkpoint to export: latest step of `grpo_ckpt`, else of `sft_ckpt`.

  Raises:
    FileNotFoundError: when neither holds a checkpoint.
  """
  from osvl_jax.train import checkpoint
  for name in CHECKPOINT_DIRS:
    if (pathlib.Path(workdir) / name).is_dir():
      step = checkpoint.manager(workdir, name).latest_step()
      if step is not None:
        return name, int(step)
  raise FileNotFoundError(f'no checkpoint under {workdir}/{{{",".join(CHECKPOINT_DIRS)}}}')


def export(workdir: str | pathlib.Path, out: str | pathlib.Path, hf_config=None, dtype: str = 'float32',
           step: int | None = None) -> dict:
  """Restores the checkpoint and writes the HF folder; returns {'checkpoint', 'step', 'out', 'params'}."""
  from osvl_jax import trajectory
  from osvl_jax.train import checkpoint
  name, latest = latest_checkpoint(workdir)
  step = latest if step is None else step
  mngr = checkpoint.manager(workdir, name)
  saved = checkpoint.read_meta(mngr, step)
  config = read_config(hf_config, saved)
  model = Qwen3VLModel(config, nnx.Rngs(0), scan_layers=bool(saved.get('scan_layers', False)))
  try:
    meta = checkpoint.restore(mngr, model, step=step)
  except ValueError as e:   # shape/structure mismatch
    raise ValueError(f'checkpoint {workdir}/{name} does not fit this architecture; pass --hf_config') from e
  np_dtype = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}[dtype]
  out = pathlib.Path(out)
  weights.save_hf_folder(model, out, dtype=np_dtype)
  if dtype != 'float32':
    cfg = json.loads((out / 'config.json').read_text())
    cfg['dtype'] = dtype
    (out / 'config.json').write_text(json.dumps(cfg, indent=2))
  trajectory.load_tokenizer().save_pretrained(out)
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return {'checkpoint': name, 'step': meta['step'], 'out': str(out), 'params': n}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--workdir', required=True)
  ap.add_argument('--out', required=True)
  ap.add_argument('--hf_config', default=None, help='config.json (or HF folder) of the architecture; default: the checkpoint\'s')
  ap.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
  ap.add_argument('--step', type=int, default=None)
  args = ap.parse_args(argv)
  info = export(args.workdir, args.out, args.hf_config, args.dtype, args.step)
  print(json.dumps(info))


if __name__ == '__main__':
  main()

"""Exports the latest trained checkpoint of a workdir as a Hugging Face Qwen3-VL folder.

Command (absl flags):
  python -m osvl_jax.export_hf --workdir=W --out=DIR [--hf_config=PATH] [--dtype=float32|bfloat16] [--step=N]

No `--config`: the architecture and parameter layout come from the checkpoint itself (a training config adds
nothing an export needs; `--hf_config` is the override).

Reads the latest orbax checkpoint under `W/grpo_ckpt` (else `W/sft_ckpt`; `osvl_jax/train/checkpoint.py`, item
'params' = `nnx.state(model, nnx.Param)`) into a model of the architecture the checkpoint's meta records (the
trainers write it; `--hf_config`, a config.json or a HF folder holding one, overrides it; checkpoints without it
default to the built-in tiny config) and its parameter layout (`scan_layers`), then writes `DIR/config.json`,
`DIR/model.safetensors` (`weights.save_hf_folder`) and the tokenizer files
(`osvl_jax.trajectory.load_tokenizer().save_pretrained`). The folder loads with
`transformers.Qwen3VLForConditionalGeneration.from_pretrained(DIR)` (or the MoE class) and gives the same logits.
"""

from __future__ import annotations

import json
import pathlib

import jax
import ml_dtypes
import numpy as np
from absl import app, flags
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


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  info = export(_WORKDIR.value, _OUT.value, _HF_CONFIG.value, _DTYPE.value, _STEP.value)
  print(json.dumps(info))


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the module imports into others (and tests) freely.
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder holding grpo_ckpt/ or sft_ckpt/.', required=True)
  _OUT = flags.DEFINE_string('out', None, 'HF folder to write.', required=True)
  _HF_CONFIG = flags.DEFINE_string('hf_config', None,
                                   "config.json (or HF folder) of the architecture; default: the checkpoint's")
  _DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'dtype of the written weights.')
  _STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')
  app.run(main)

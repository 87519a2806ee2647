"""`python -m osvl_jax.export_hf`: the latest orbax checkpoint of a workdir -> HF folder that transformers loads to
the same logits, with the tokenizer files."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from osvl_jax import export_hf  # noqa: E402
from osvl_jax.models.qwen3_vl import parity  # noqa: E402
from osvl_jax.models.qwen3_vl import weights  # noqa: E402
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # noqa: E402
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel  # noqa: E402
from osvl_jax.train import checkpoint  # noqa: E402


def test_export_latest_checkpoint_loads_in_transformers_with_same_logits(tmp_path):
  config = Qwen3VLConfig.tiny()
  sft, grpo = Qwen3VLModel(config, nnx.Rngs(1)), Qwen3VLModel(config, nnx.Rngs(2))
  checkpoint.save(checkpoint.manager(tmp_path, 'sft_ckpt'), 4, sft, None, {'stage': 'sft'})
  mngr = checkpoint.manager(tmp_path, 'grpo_ckpt')
  checkpoint.save(mngr, 1, sft, None, {'stage': 'grpo'})
  checkpoint.save(mngr, 2, grpo, None, {'stage': 'grpo'})
  out = tmp_path / 'hf'
  export_hf.export(tmp_path, out)
  assert (out / 'model.safetensors').exists() and (out / 'tokenizer.json').exists()
  hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
  hf.config._attn_implementation = 'eager'
  pv, grid = parity.load_images()[2]
  ids = np.array([[parity.IM_START, 872] + parity.image_tokens(grid[0]) + [30, 40, parity.IM_END]])
  ref = parity.hf_logits(hf, ids, None, pv, grid)
  got = parity.flax_logits(grpo, ids, None, pv, grid)          # the latest GRPO step, not SFT
  assert np.abs(got - ref).max() <= parity.TOL
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok('Hello world')['input_ids'] == [9707, 1879] and len(tok) == 151669


def test_export_without_checkpoint_raises(tmp_path):
  with pytest.raises(FileNotFoundError):
    export_hf.latest_checkpoint(tmp_path)


def test_export_of_a_scan_layers_checkpoint_writes_the_per_layer_hf_tensors(tmp_path):
  """A non-default architecture (as the demo's) and the stacked layout, both read from the checkpoint's meta; the
  absl command line (one subprocess)."""
  base = Qwen3VLConfig.tiny()
  config = dataclasses.replace(base, text=dataclasses.replace(base.text, num_hidden_layers=3, intermediate_size=96,
                                                              rope_theta=10_000.0))
  scanned = Qwen3VLModel(config, nnx.Rngs(3), scan_layers=True)
  checkpoint.save(checkpoint.manager(tmp_path, 'sft_ckpt'), 1, scanned, None, {'stage': 'sft'})
  proc = subprocess.run([sys.executable, '-m', 'osvl_jax.export_hf', f'--workdir={tmp_path}',
                         f'--out={tmp_path / "hf"}'], capture_output=True, text=True, timeout=600,
                        cwd=pathlib.Path(__file__).parents[2], env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1])['checkpoint'] == 'sft_ckpt'
  written = weights.read_safetensors(tmp_path / 'hf' / 'model.safetensors')
  expected = weights.to_hf_state_dict(Qwen3VLModel(config, nnx.Rngs(3)))      # same init, unrolled layout
  assert written.keys() == expected.keys()
  for name, value in expected.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)


def test_restoring_into_the_other_layout_names_scan_layers(tmp_path):
  config = Qwen3VLConfig.tiny()
  checkpoint.save(checkpoint.manager(tmp_path, 'sft_ckpt'), 1, Qwen3VLModel(config, nnx.Rngs(0)), None, {})
  with pytest.raises(ValueError, match='scan_layers=False but the model has scan_layers=True'):
    checkpoint.restore(checkpoint.manager(tmp_path, 'sft_ckpt'), Qwen3VLModel(config, nnx.Rngs(0), scan_layers=True))

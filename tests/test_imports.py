"""Start-up cost: the trainers, the server, the pipeline and trajectory building never import torch (it is in this
environment only for the HF reference of the tests; importing it costs a process 5-25 s). tensorboardX would
import it (`metrics._import_tensorboardx`), transformers' image processor too (`trajectory.images`)."""

import subprocess
import sys

import pytest

CHECK = '''
import sys, tempfile, numpy as np
import osvl_jax.train.grpo, osvl_jax.train.sft, osvl_jax.serve, osvl_jax.evaluate, data_pipeline.build
from osvl_jax import trajectory as tj
from osvl_jax.train import metrics
ref = tj.ImageProcessor(min_pixels=1024, max_pixels=65536).process(np.zeros((64, 96, 3), np.uint8))
writer = metrics.MetricWriter(tempfile.mkdtemp(), 'sft')
writer.write(1, {'loss': np.float32(1.5)})
writer.close()
print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules), ref.grid_thw.tolist())
import importlib.util  # torch still importable afterwards: no `None` left in sys.modules (find_spec would raise)
print(importlib.util.find_spec('torch') is not None)
'''


def test_no_entry_point_imports_torch():
  pytest.importorskip('torch')
  out = subprocess.run([sys.executable, '-c', CHECK], capture_output=True, text=True, timeout=300, check=True)
  assert out.stdout.split('\n')[:2] == ['[] [1, 4, 6]', 'True'], out.stdout + out.stderr[-2000:]

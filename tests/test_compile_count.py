"""bench/compile_count.py (issue 22): runs whose every batch holds images of other grids compile a number of
programs the config fixes. At small N on the tiny model, the SFT step compiles once (packed: its three pieces once
each), the sampler's prefill and decode once each, the GRPO update at most twice per (T, K) rung its budgets allow
(`batching.program_bound`) and never more than twice per shape it met, while the batches hold more distinct image
grids than that."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_programs_are_fixed_by_the_budgets_not_by_the_images(tmp_path):
  out = subprocess.run([sys.executable, str(ROOT / 'bench' / 'compile_count.py'), '--n', '3', '--seed', '1'],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  figures = dict(re.findall(r'(\w+)=(\S+)', out.stdout))
  n = {k: int(figures[k]) for k in ('sft_programs', 'grpo_programs', 'sampler_programs', 'distinct_image_grids',
                                     'grpo_bound', 'grpo_shapes', 'sampler_bound', 'sft_bound')}
  assert n['distinct_image_grids'] >= 4, out.stdout          # the batches really differ in their images
  assert n['sft_programs'] == n['sft_bound'] == 1, out.stdout
  # Packed: the micro-batch's gradient, the optimizer step and (steps of two micro-batches) the accumulation.
  assert int(figures['sft_packed_programs']) <= int(figures['sft_packed_bound']) == 3, out.stdout
  assert n['sampler_programs'] == n['sampler_bound'] == 2, out.stdout
  assert 3 <= n['grpo_programs'] <= min(n['grpo_bound'], 2 * n['grpo_shapes'] + 1), out.stdout
  assert float(figures['steady_step_s']) > 0

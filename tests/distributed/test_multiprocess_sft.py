"""Two JAX processes on one machine (jax.distributed on 127.0.0.1, simulated CPU devices) train SFT like one, on
a mesh over both processes' devices (`config.mesh`), with packed rows (`sft.pack_rows`) against an unpacked
one-process reference.

The job is the real entry point, `python -m osvl_jax.train.sft`, started as a pod starts it: one process per
host, told its coordinator, count and index through the environment (`osvl_jax.distributed`).
"""

import json
import os
import time

import numpy as np
import pytest

from tests.distributed import conftest

STEPS = 4
ARGS = ['-m', 'osvl_jax.train.sft', '--config=configs/demo.py', '--config.model.vocab=full',
        '--config.sft.batch_size=8',
        f'--config.sft.steps={STEPS}', '--config.sft.log_every=1', '--config.sft.ckpt_every=2',
        '--config.sft.warmup_steps=0', '--config.model.text.num_hidden_layers=1', '--config.mesh.fsdp=-1']


def _records(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def _losses(workdir) -> dict[int, float]:
  """Step -> loss, the last record of each step (a step rerun after a preemption is written again)."""
  return {r['step']: r['loss'] for r in _records(workdir)}


def _wait_for_checkpoint(procs, folder, timeout=600):
  """Returns once orbax has committed `folder` (it appears under its final name only when complete)."""
  deadline = time.time() + timeout
  while not folder.is_dir():
    assert time.time() < deadline and all(p.poll() is None for p in procs), \
        'the job ended before writing ' + str(folder) + ':\n' + ''.join(p.communicate()[0][-4000:] for p in procs)
    time.sleep(0.2)


@pytest.mark.timeout(900)
def test_two_processes_train_are_preempted_and_resume_on_another_mesh_with_the_one_process_losses(
    sft_dataset, tmp_path):
  args = ARGS + [f'--config.data.dir={sft_dataset}']
  pod, single = tmp_path / 'pod', tmp_path / 'single'
  # The reference: one process, one device, no mesh (it runs beside the pod job; the CPU is mostly idle there).
  reference = conftest.start_processes(args + [f'--workdir={single}'], 1, 1)
  # 2 processes x 4 devices: the 8-device fsdp mesh (mesh.fsdp=-1: parameters, Adam moments and rows sharded over
  # both hosts), one row per device, packed (sft.pack_rows: the step's 8 trajectories of 337 tokens go three to a
  # 1024-token row, so process 1's devices hold only padding rows); the losses are the unpacked reference's.
  # Preempted once step 2 is saved.
  pod_args = args + ['--config.sft.pack_rows=8', '--config.sft.length_buckets=(1024,)', f'--workdir={pod}']
  job = conftest.start_processes(pod_args, 2, 4)
  _wait_for_checkpoint(job, pod / 'sft_ckpt' / '2')
  conftest.kill_processes(job)
  # Rerun with the same workdir on 2 processes x 2 devices (another, 4-device fsdp mesh): restores step 2 onto the
  # new shardings, trains on.
  resumed = conftest.wait_processes(conftest.start_processes(pod_args, 2, 2))
  assert all('resumed at step 2' in out for out in resumed)
  conftest.wait_processes(reference)

  pod_losses, single_losses = _losses(pod), _losses(single)
  assert sorted(pod_losses) == sorted(single_losses) == [1, 2, 3, 4]
  assert single_losses[4] < single_losses[1]
  np.testing.assert_allclose([pod_losses[s] for s in range(1, 5)], [single_losses[s] for s in range(1, 5)],
                             rtol=2e-5)
  assert sorted(os.listdir(pod / 'sft_ckpt')) == ['2', '4']
  steps = [r['step'] for r in _records(pod)]
  assert steps.count(1) == steps.count(2) == steps.count(4) == 1  # process 0 alone writes metrics


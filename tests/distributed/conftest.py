"""Shared pieces of the multi-host tests: a tiny SFT dataset on disk and a runner for entry-point processes."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import datasets
import numpy as np
import pytest

from osvl_jax import trajectory as tj
from tools import base as tools_base
from tools import env as tools_env

REPO = pathlib.Path(__file__).resolve().parents[2]
# Cheaper CPU code generation: these jobs are compile-bound (same numerics; halves a two-process run).
CPU_XLA_FLAGS = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'


def sft_trajectories(num: int = 4) -> list:
  """`num` two-step expert episodes (text_search, then the answer), each with its own 64x64 image."""
  tokenizer = tj.load_tokenizer()
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  schemas = tools_env.ToolEnv({'enabled': ('text_search',)}).schemas()
  rng = np.random.default_rng(0)
  out = []
  for i in range(num):
    builder = tj.TrajectoryBuilder(tokenizer, processor, schemas)
    builder.start(f'Which city is landmark {i}?', rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    builder.append_assistant_text(tj.render_assistant_text(
        f'Search landmark {i}.', tool_call={'name': 'text_search', 'arguments': {'query': f'landmark {i}'}}))
    builder.append_observation(tools_base.ToolResult(ok=True, error_kind=None, text=f'[1] City {i}: a city.',
                                                     images=[], seconds=0.0))
    builder.append_assistant_text(tj.render_assistant_text(f'It is city {i}.', response=f'City {i}'))
    out.append(builder.finish(prompt_id=f'q{i}', answers=[f'City {i}']))
  return out


@pytest.fixture(scope='session')
def sft_dataset(tmp_path_factory) -> pathlib.Path:
  """A dataset folder with an `sft` split of 4 trajectories, as `data_pipeline.build` writes it."""
  root = tmp_path_factory.mktemp('data')
  folder = root / 'sft'
  trajectories = sft_trajectories()
  datasets.Dataset.from_list([t.to_record() for t in trajectories], features=tj.record_features()).save_to_disk(
      str(folder))
  (folder / 'counts.json').write_text(json.dumps({'kept': len(trajectories)}))
  return root


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start_processes(args: list[str], num_processes: int, devices_per_process: int,
                    extra_env: dict | None = None) -> list[subprocess.Popen]:
  """Starts `python *args` as `num_processes` processes of one JAX job on 127.0.0.1 (simulated CPU devices)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(('OSVL_', 'JAX_', 'TPU_', 'MEGASCALE_'))}
  env.update({'JAX_PLATFORMS': 'cpu',
              'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices_per_process} {CPU_XLA_FLAGS}',
              **(extra_env or {})})
  if num_processes > 1:
    port = free_port()
    env.update(OSVL_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', OSVL_NUM_PROCESSES=str(num_processes),
               JAX_COORDINATOR_BIND_ADDRESS=f'127.0.0.1:{port}')
  procs = []
  for pid in range(num_processes):
    penv = dict(env, OSVL_PROCESS_ID=str(pid)) if num_processes > 1 else env
    procs.append(subprocess.Popen([sys.executable, *args], cwd=REPO, env=penv, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def wait_processes(procs: list[subprocess.Popen], timeout: float = 600) -> list[str]:
  """Waits for every process; returns their outputs.

  Raises:
    AssertionError: a process failed (its output is in the message); all are killed then.
  """
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=timeout)[0])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  for pid, (proc, out) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0, f'process {pid} of {len(procs)} failed:\n{out[-6000:]}'
  return outputs


def kill_processes(procs: list[subprocess.Popen]) -> None:
  """Kills every process (a preempted job) and reaps it."""
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
  for proc in procs:
    proc.communicate()

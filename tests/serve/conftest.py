"""Shared pieces of the serving tests: the tiny policy, contexts, and helpers that start servers on 127.0.0.1."""

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout.embedded import jax_sampler

REPO = pathlib.Path(__file__).resolve().parents[2]
NEW = 6            # decode length: small, the CPUs are shared.
MAX_LEN = 256
BUCKET = 16
# The server flags that make `osvl_jax.serve --tiny` compute what `reference_sampler` computes.
TINY_FLAGS = (f'--bucket={BUCKET}', f'--max_len={MAX_LEN}', f'--max_new_tokens={NEW}', '--batch_window_ms=20')


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def wait_until(check, timeout: float, what: str, proc: subprocess.Popen | None = None, log=None) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc is not None and proc.poll() is not None:
      raise RuntimeError(f'{what}: process exited {proc.returncode}\n{_tail(log)}')
    try:
      if check():
        return
    except httpx.HTTPError:
      pass
    time.sleep(0.25)
  raise TimeoutError(f'{what} not ready after {timeout}s\n{_tail(log)}')


def _tail(log) -> str:
  if log is None or not pathlib.Path(log).exists():
    return ''
  return pathlib.Path(log).read_text()[-3000:]


def healthy(url: str) -> bool:
  return httpx.get(url + '/health', timeout=2).status_code == 200


@contextlib.contextmanager
def serve_process(log_path, *flags, timeout: float = 120.0):
  """`python -m osvl_jax.serve --tiny ...` on a free port; yields its URL once /health answers, then stops it."""
  port = free_port()
  with open(log_path, 'w') as log:
    proc = subprocess.Popen([sys.executable, '-m', 'osvl_jax.serve', '--tiny', f'--port={port}', *TINY_FLAGS,
                             *flags], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
  url = f'http://127.0.0.1:{port}'
  try:
    yield url, proc
  finally:
    stop(proc)


def stop(proc: subprocess.Popen) -> None:
  """SIGTERM, then SIGKILL after 20 s."""
  proc.terminate()
  try:
    proc.wait(timeout=20)
  except subprocess.TimeoutExpired:
    proc.kill()


@contextlib.contextmanager
def router_process(log_path, *flags):
  """`sglang_router.launch_router` on 127.0.0.1 at a free port, its Prometheus exporter at another free port (the
  default, 29000, is one per machine: two routers started at once by the two test workers collided on it); yields
  (URL, process), then stops it."""
  port, metrics_port = free_port(), free_port()
  with open(log_path, 'w') as log:
    proc = subprocess.Popen([sys.executable, '-m', 'sglang_router.launch_router', '--host', '127.0.0.1',
                             '--port', str(port), '--prometheus-host', '127.0.0.1', '--prometheus-port',
                             str(metrics_port), *flags], stdout=log, stderr=subprocess.STDOUT)
  try:
    yield f'http://127.0.0.1:{port}', proc
  finally:
    stop(proc)


@contextlib.contextmanager
def router_cluster(logs: pathlib.Path, *worker_flags, timeout: float = 120.0):
  """Two `osvl_jax.serve` workers started with `worker_flags` (the same random model) behind
  `sglang_router.launch_router` (round robin), logs in `logs`; yields (router URL, [worker URLs]) once the router
  counts both workers healthy (else fails with the late one's log tail), then stops them all."""
  with serve_process(logs / 'w0.log', *worker_flags) as (w0, p0), \
      serve_process(logs / 'w1.log', *worker_flags) as (w1, p1):
    wait_until(lambda: healthy(w0), timeout, 'worker 0', p0, logs / 'w0.log')
    wait_until(lambda: healthy(w1), timeout, 'worker 1', p1, logs / 'w1.log')
    with router_process(logs / 'router.log', '--policy', 'round_robin', '--worker-urls', w0, w1) as (url, router):
      def ready():
        workers = httpx.get(url + '/workers', timeout=2).json().get('workers', [])
        return sum(bool(w.get('is_healthy')) for w in workers) == 2
      wait_until(ready, 60, 'router', router, logs / 'router.log')
      yield url, [w0, w1]


@contextlib.contextmanager
def healthy_server(log_path, *flags, timeout: float = 120.0):
  """`serve_process` that yields only the URL, once /health answers (else fails with the log's tail)."""
  with serve_process(log_path, *flags) as (url, proc):
    wait_until(lambda: healthy(url), timeout, 'worker', proc, log_path)
    yield url


@contextlib.contextmanager
def serve_in_thread(service, api_key=None):
  """The FastAPI app of `service` (with `api_key`, if any) under uvicorn in a thread of this process (shares the jit
  caches)."""
  import uvicorn
  from osvl_jax.serve import app as app_lib
  port = free_port()
  config = uvicorn.Config(app_lib.create_app(service, '127.0.0.1', port, api_key=api_key), host='127.0.0.1',
                          port=port, log_level='warning', access_log=False)
  srv = uvicorn.Server(config)
  thread = threading.Thread(target=srv.run, daemon=True)
  thread.start()
  url = f'http://127.0.0.1:{port}'
  try:
    wait_until(lambda: healthy(url), 30, 'in-thread server')
    yield url
  finally:
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope='session')
def tokenizer():
  return tj.load_tokenizer()


@pytest.fixture(scope='session')
def processor():
  """The tiny server's image processor (`osvl_jax.serve --tiny` defaults)."""
  return tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)


@pytest.fixture(scope='session')
def tiny_model():
  return model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))


def reference_sampler(model, tokenizer, processor=None):
  """The in-process engine the servers must reproduce (greedy)."""
  return jax_sampler.JaxSampler(model, tokenizer, image_processor=processor, max_new_tokens=NEW, temperature=0.0,
                                max_len=MAX_LEN, bucket=BUCKET)


@pytest.fixture(scope='session')
def reference(tiny_model, tokenizer):
  """One in-process greedy engine over the tiny model for the whole session (its compiled programs are kept)."""
  return reference_sampler(tiny_model, tokenizer)


@pytest.fixture(scope='session')
def contexts(processor):
  """Three contexts: two text-only of different lengths, one with a 64x64 image (4 pads) between text; all in one
  length bucket, so the servers compile few programs."""
  rng = np.random.default_rng(0)
  text = lambda n: list(rng.integers(100, 150000, size=n))
  ref = processor.process(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
  image_ids = text(5) + [tj.VISION_START_ID] + [tj.IMAGE_PAD_ID] * ref.num_tokens + [tj.VISION_END_ID] + text(4)
  return [(np.asarray(text(11), np.int32), []), (np.asarray(text(7), np.int32), []),
          (np.asarray(image_ids, np.int32), [ref])]

"""Starting the server: `build_service` loads a policy into a running `service.SamplerService` (what
`python -m osvl_jax.serve` serves; its flags are `build_service`'s arguments), `prefix_cache_size` sizes its prefix
cache, `local_server` runs `python -m osvl_jax.serve` on a free port for the benches.
"""

import contextlib
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from absl import logging

from osvl_jax.serve import request_limits


def build_service(checkpoint: str = 'latest', workdir: str | None = None, step: int | None = None,
                  hf_config: str | None = None, tiny: bool = False, seed: int = 0, max_new_tokens: int = 512,
                  max_len: int = 8192, bucket: int = 128, max_batch: int = 64, batch_window_s: float = 0.02,
                  min_pixels: int | None = None, max_pixels: int | None = None,
                  served_model_name: str = 'osvl-jax', weight_version: str = '0', prefix_cache_slots: int = -1,
                  limits: dict | None = None, weights_root: tuple[str, ...] = (),
                  num_continuous_decode_steps: int = 8, patch_bucket: int = 256, mesh_tensor: int = 0,
                  mesh_data: int = -1, compile_ahead: bool = False):
  """Loads the policy and returns a running `service.SamplerService` (arguments: the flags of `__main__`; `limits`: the
  `request_limits.RequestLimits` fields but context_length, max_new_tokens_limit None = max_len).

  `mesh_tensor` / `mesh_data` are `rollout.mesh`'s tensor / data (`rollout.embedded.layout`): 0 (default) = one
  device; -1 = auto, sized for max_batch rows of max_len tokens beside the prefix cache's slots; T = tensor-parallel
  T with mesh_data replicas (-1 = the remaining devices). A checkpoint or HF folder is read straight into that
  layout's shardings (no whole copy of the model); --tiny is built on one device and resharded.

  Raises:
    FileNotFoundError / ValueError: from `checkpoints.load_policy`, or no pixel budget for a checkpoint without one.
    ValueError: from `layout.rollout_mesh` (naming rollout.mesh.tensor / data: sizes out of range, the devices or
      the KV heads not divisible, no tensor size that fits for -1).
    ValueError: from `prefix_cache_size` (a bad `prefix_cache_slots`, or one over half the device's memory); a
      limit < 1, max_new_tokens_limit above max_len or below max_new_tokens; a `weights_root` that is not an
      existing folder or a URL (`auth.WeightsRoots`).
  """
  limits = dict(limits or {})
  if limits.get('max_new_tokens_limit') is None:
    limits['max_new_tokens_limit'] = max_len
  limits = request_limits.RequestLimits(context_length=max_len, **limits)   # bad limits: before any loading
  limits.check_max_new_tokens(max_new_tokens, '--max_new_tokens')
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from osvl_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl import model as model_lib  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.embedded import jax_sampler, layout  # pylint: disable=g-import-not-at-top
  from osvl_jax.serve import auth, service  # pylint: disable=g-import-not-at-top
  roots = auth.WeightsRoots(weights_root)   # refused before the (slow) model load
  if tiny:   # built on one device (the sampler reshards it)
    model, meta = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(seed)), {'path': f'tiny:seed={seed}'}
    recorded = {'min_pixels': 32 * 32, 'max_pixels': 64 * 64}
  # The layout is sized from the policy's shapes; a checkpoint's weights are then read into it.
  shape = model if tiny else checkpoints.policy_shape(checkpoint, workdir, step, hf_config)
  prefix_cache_slots = prefix_cache_size(shape, prefix_cache_slots, max_len, bucket, tensor=max(mesh_tensor, 1))
  mesh = layout.rollout_mesh({'tensor': mesh_tensor, 'data': mesh_data}, shape, max_batch, max_len,
                             prefix_cache_slots)
  if not tiny:
    model, meta = checkpoints.load_policy(checkpoint, workdir, step, hf_config, mesh=mesh, rules=layout.DECODE_RULES)
    recorded = meta.get('image_processor') or {}
  lo = min_pixels if min_pixels is not None else recorded.get('min_pixels')
  hi = max_pixels if max_pixels is not None else recorded.get('max_pixels')
  if lo is None or hi is None:
    if 'step' in meta:
      raise ValueError('the checkpoint does not record its image processor budget: pass --min_pixels and '
                       '--max_pixels')
    processor = tj.ImageProcessor()   # an HF folder: the Qwen3-VL defaults
  else:
    processor = tj.ImageProcessor(min_pixels=int(lo), max_pixels=int(hi))
  tokenizer = tj.load_tokenizer()
  sampler = jax_sampler.JaxSampler(model, tokenizer, image_processor=processor, max_new_tokens=max_new_tokens,
                                   temperature=1.0, seed=seed, max_len=max_len, bucket=bucket,
                                   prefix_cache_slots=prefix_cache_slots, patch_bucket=patch_bucket, mesh=mesh)
  return service.SamplerService(sampler, tokenizer, processor, model_path=meta['path'],
                               weight_version=weight_version, served_model_name=served_model_name,
                               max_batch=max_batch, batch_window_s=batch_window_s,
                               default_max_new_tokens=max_new_tokens, limits=limits, weights_roots=roots,
                               decode_steps=num_continuous_decode_steps, compile_ahead=compile_ahead)


AUTO_PREFIX_CACHE_SLOTS = 256  # the most slots `--prefix_cache_slots=-1` picks


def prefix_cache_size(model, slots: int, max_len: int, bucket: int, tensor: int = 1) -> int:
  """The number of prefix-cache slots to use for `--prefix_cache_slots=slots` (`__main__`'s docstring).

  Args:
    model: the served `Qwen3VLModel`, concrete or `nnx.eval_shape`d (its text config and dtype size a slot).
    slots: -1 = auto (a quarter of the device memory, at most `AUTO_PREFIX_CACHE_SLOTS`), 0 = off, N > 0 = N.
    max_len, bucket: the sampler's (a slot holds max_len rounded up to the bucket tokens).
    tensor: the rollout mesh's tensor size (`--mesh_tensor`; 1 for none or auto, which is sized after the slots):
      the pool's KV heads are split over it (`prefix_cache`), so a slot holds 1 / tensor of its bytes per device.
  Returns:
    The slot count (>= 0).
  Raises:
    ValueError: slots < -1, or N slots needing more than half the device's memory (the host's RAM on CPU).
  """
  import os  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.embedded import prefill_inputs  # pylint: disable=g-import-not-at-top
  if slots < -1:
    raise ValueError(f'--prefix_cache_slots must be -1 (auto), 0 (off) or a positive count, got {slots}')
  text = model.config.text
  tokens = prefill_inputs.round_up(max_len, bucket)   # the sampler's slot length
  per_slot = (2 * text.num_hidden_layers * text.num_key_value_heads * text.head_dim * tokens
              * np.dtype(model.dtype).itemsize) // tensor   # per device
  limit = ((jax.devices()[0].memory_stats() or {}).get('bytes_limit')
           or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))
  if slots == -1:
    slots = int(min(AUTO_PREFIX_CACHE_SLOTS, limit // 4 // per_slot))
  elif slots * per_slot > limit // 2:
    raise ValueError(f'--prefix_cache_slots={slots} needs {slots * per_slot / 2**30:.1f} GiB per device, more than half of the '
                     f'{limit / 2**30:.1f} GiB of its memory: lower it (0 = no prefix cache, -1 = auto)')
  logging.info('prefix cache: %d slots of %d tokens, %.2f GiB per device', slots, tokens, slots * per_slot / 2**30)
  return slots


@contextlib.contextmanager
def local_server(serve_flags: Sequence[str], url: str | None = None, timeout_s: float = 180.0):
  """`python -m osvl_jax.serve <serve_flags> --port=<a free port>` on 127.0.0.1 (its output discarded), yielding its
  URL once `/health` answers 200, terminated on exit (killed after 20 s); with `url`, that running server as it is
  (the benches' `--url`).

  Raises:
    RuntimeError: the server exited, or did not answer /health within `timeout_s` seconds (naming the URL).
  """
  if url is not None:
    yield url
    return
  import httpx  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  proc = subprocess.Popen([sys.executable, '-m', 'osvl_jax.serve', f'--port={port}', *serve_flags],
                          cwd=pathlib.Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + timeout_s
    while True:
      try:
        if httpx.get(url + '/health', timeout=2).status_code == 200:
          break
      except httpx.HTTPError:
        pass
      if time.time() > deadline or proc.poll() is not None:
        raise RuntimeError(f'the server at {url} ({" ".join(serve_flags)}) did not come up')
      time.sleep(0.5)
    yield url
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
      proc.kill()

"""Serves a policy over SGLang's native HTTP API with the embedded JAX sampler (DESIGN.md §6b).

Commands:
  python -m osvl_jax.serve --checkpoint=latest --workdir=W --port=30000     # W/grpo_ckpt, else W/sft_ckpt
  python -m osvl_jax.serve --checkpoint=PATH [--step=N] --port=30000      # a checkpoint (step) folder / HF folder
  python -m osvl_jax.serve --tiny --port=30000                            # the tiny random model (tests)

Endpoints and batching: `osvl_jax/rollout/server.py`. Clients: `osvl_jax.rollout.sglang_client.SGLangEngine`
(the agent loop), the `sglang-router` (`python -m sglang_router.launch_router --worker-urls URL ...`), any
OpenAI client on `/v1/chat/completions`. The image processor uses the checkpoint's recorded pixel budget
(`--min_pixels` / `--max_pixels` override it; the tiny model defaults to 32*32 .. 64*64). The last line printed
before serving is `serving url=http://HOST:PORT model=... weight_version=...`.

Prefix cache (`--prefix_cache_slots`, default -1 = auto; 0 = off): the KV of the last N rows (prompt + generated ids) is
kept on the device and a new row prefills only what follows its longest cached prefix of tokens and images
(`osvl_jax.rollout.prefix_cache`, SGLang's RadixAttention idea); `meta_info.cached_tokens` reports it,
`/flush_cache` and weight updates empty it. Memory: N slots x 2 (k, v) x layers x kv heads x head_dim x max_len
(rounded up to --bucket) values of the cache dtype, allocated at the first batch: 1 MiB a slot for --tiny (float32) at
--max_len=2048; 1.125 GiB a slot for Qwen3-VL-8B in bfloat16 at --max_len=8192. Auto (-1): as many slots as fit
in a quarter of the device's memory (of the host's RAM where the device reports none), at most 256; an explicit N
over half of it is refused at startup.

Request limits (`osvl_jax.rollout.request_limits`, reported by /server_info under `request_limits`):
--max_new_tokens_limit (default --max_len), --max_image_pixels / --max_request_pixels (refused from the image
headers, before any decode), --max_concurrent_decodes (image decoding adds at most `decode_memory_bytes` to the
server's memory: 2 x (16.8 MP x 32 B + 67.1 MP x 3 B) = 1.4 GiB at the defaults), --max_body_bytes (413).
"""

import contextlib
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from absl import app, flags, logging

from osvl_jax.rollout import request_limits

FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('checkpoint', 'latest', "'latest' | 'sft' | 'grpo' (with --workdir), a checkpoint folder or "
                      'one step of it, or an HF folder (config.json + safetensors).')
  flags.DEFINE_string('workdir', None, 'job folder for --checkpoint=latest|sft|grpo.')
  flags.DEFINE_string('compile_cache_dir', None, "JAX's persistent compilation cache (default <workdir>/jax_cache "
                      'when --workdir is given; "" = off): a restarted server compiles nothing new.')
  flags.DEFINE_integer('step', None, 'checkpoint step (default: the latest).')
  flags.DEFINE_string('hf_config', None, 'architecture override (config.json or a folder holding one).')
  flags.DEFINE_bool('tiny', False, 'serve the tiny random Qwen3-VL (Qwen3VLConfig.tiny(), nnx.Rngs(--seed)).')
  flags.DEFINE_integer('seed', 0, 'init seed of --tiny; the sampler PRNG seed.')
  flags.DEFINE_string('host', '127.0.0.1', 'bind address.')
  flags.DEFINE_integer('port', 30000, 'port.')
  flags.DEFINE_integer('max_new_tokens', 512, 'max_new_tokens of a request that gives none.')
  flags.DEFINE_integer('max_len', 8192, 'cap on prompt + generated ids per row.')
  flags.DEFINE_integer('bucket', 128, 'prompt / cache lengths padded to this x 2^k up to 4x this, '
                       'then its steps, capped at --max_len (compiled shapes: prefill_inputs.length_rung).')
  flags.DEFINE_integer('patch_bucket', 256, 'image patches of a prefill padded to this x 2^k (compiled shapes; a '
                       'multiple of 4).')
  flags.DEFINE_integer('max_batch', 64, 'most rows per sampler call.')
  flags.DEFINE_integer('num_continuous_decode_steps', 8, 'decode steps per chunk at most (SGLang\'s flag): between two '
                       'chunks finished rows are answered and waiting ones join the running batch.')
  flags.DEFINE_float('batch_window_ms', 20.0, 'a batch keeps collecting requests while they arrive less than '
                     'this apart (at most 20 windows).')
  flags.DEFINE_integer('min_pixels', None, 'image processor min_pixels (default: the checkpoint records it).')
  flags.DEFINE_integer('max_pixels', None, 'image processor max_pixels (default: the checkpoint records it).')
  flags.DEFINE_string('served_model_name', 'osvl-jax', 'model name reported by /v1/models and /model_info.')
  flags.DEFINE_string('weight_version', '0', 'initial weight_version (bumped by each update that gives none).')
  flags.DEFINE_string('api_key', None, 'require `Authorization: Bearer KEY` on every request but /health* (SGLang\'s '
                      '--api-key); default: $OSVL_API_KEY, else $SGLANG_API_KEY, else no key.')
  flags.DEFINE_multi_string('weights_root', [], '/update_weights_from_disk loads only folders inside these roots '
                            '(local folders, symlinks resolved, or gs://bucket/prefix); repeatable; none: any path.')
  flags.DEFINE_integer('prefix_cache_slots', -1, 'rows whose KV (prompt + generated ids, max_len each) are kept '
                       'for reuse by later rows that share a prefix (0: no prefix cache; -1: as many as fit in a '
                       'quarter of the device memory, at most 256); memory: see the module docstring.')
  flags.DEFINE_integer('max_new_tokens_limit', None, 'largest max_new_tokens a request may ask for (default: '
                       '--max_len); larger ones are refused (400).')
  flags.DEFINE_integer('max_image_pixels', request_limits.DEFAULT_MAX_IMAGE_PIXELS, 'largest width*height of one '
                       'request image, read from its header before decoding (400 above it).')
  flags.DEFINE_integer('max_request_pixels', request_limits.DEFAULT_MAX_REQUEST_PIXELS, 'largest sum of '
                       'width*height over the images of one request (400 above it).')
  flags.DEFINE_integer('max_concurrent_decodes', request_limits.DEFAULT_MAX_CONCURRENT_DECODES, 'requests '
                       'decoding images at once (the others wait); bounds the decode memory (/server_info).')
  flags.DEFINE_integer('max_body_bytes', request_limits.DEFAULT_MAX_BODY_BYTES, 'largest request body, bytes '
                       '(413 above it).')


def build_service(checkpoint: str = 'latest', workdir: str | None = None, step: int | None = None,
                  hf_config: str | None = None, tiny: bool = False, seed: int = 0, max_new_tokens: int = 512,
                  max_len: int = 8192, bucket: int = 128, max_batch: int = 64, batch_window_s: float = 0.02,
                  min_pixels: int | None = None, max_pixels: int | None = None,
                  served_model_name: str = 'osvl-jax', weight_version: str = '0', prefix_cache_slots: int = -1,
                  limits: dict | None = None, weights_root: tuple[str, ...] = (),
                  num_continuous_decode_steps: int = 8, patch_bucket: int = 256):
  """Loads the policy and returns a running `server.SamplerService` (arguments: the flags above; `limits`: the
  `request_limits.RequestLimits` fields but context_length, max_new_tokens_limit None = max_len).

  Raises:
    FileNotFoundError / ValueError: from `checkpoints.load_policy`, or no pixel budget for a checkpoint without one.
    ValueError: from `prefix_cache_size` (a bad `prefix_cache_slots`, or one over half the device's memory); a
      limit < 1, max_new_tokens_limit above max_len or below max_new_tokens; a `weights_root` that is not an
      existing folder or a URL (`server_auth.WeightsRoots`).
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
  from osvl_jax.rollout import jax_sampler, server, server_auth  # pylint: disable=g-import-not-at-top
  roots = server_auth.WeightsRoots(weights_root)   # refused before the (slow) model load
  if tiny:
    model, meta = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(seed)), {'path': f'tiny:seed={seed}'}
    recorded = {'min_pixels': 32 * 32, 'max_pixels': 64 * 64}
  else:
    model, meta = checkpoints.load_policy(checkpoint, workdir, step, hf_config)
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
  prefix_cache_slots = prefix_cache_size(model, prefix_cache_slots, max_len, bucket)
  tokenizer = tj.load_tokenizer()
  sampler = jax_sampler.JaxSampler(model, tokenizer, image_processor=processor, max_new_tokens=max_new_tokens,
                                   temperature=1.0, seed=seed, max_len=max_len, bucket=bucket,
                                   prefix_cache_slots=prefix_cache_slots, patch_bucket=patch_bucket)
  return server.SamplerService(sampler, tokenizer, processor, model_path=meta['path'],
                               weight_version=weight_version, served_model_name=served_model_name,
                               max_batch=max_batch, batch_window_s=batch_window_s,
                               default_max_new_tokens=max_new_tokens, limits=limits, weights_roots=roots,
                               decode_steps=num_continuous_decode_steps)


AUTO_PREFIX_CACHE_SLOTS = 256  # the most slots `--prefix_cache_slots=-1` picks


def prefix_cache_size(model, slots: int, max_len: int, bucket: int) -> int:
  """The number of prefix-cache slots to use for `--prefix_cache_slots=slots` (module docstring).

  Args:
    model: the served `Qwen3VLModel` (its text config and dtype size a slot).
    slots: -1 = auto (a quarter of the device memory, at most `AUTO_PREFIX_CACHE_SLOTS`), 0 = off, N > 0 = N.
    max_len, bucket: the sampler's (a slot holds max_len rounded up to the bucket tokens).
  Returns:
    The slot count (>= 0).
  Raises:
    ValueError: slots < -1, or N slots needing more than half the device's memory (the host's RAM on CPU).
  """
  import os  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout import prefill_inputs  # pylint: disable=g-import-not-at-top
  if slots < -1:
    raise ValueError(f'--prefix_cache_slots must be -1 (auto), 0 (off) or a positive count, got {slots}')
  text = model.config.text
  tokens = prefill_inputs.round_up(max_len, bucket)   # the sampler's slot length
  per_slot = (2 * text.num_hidden_layers * text.num_key_value_heads * text.head_dim * tokens
              * np.dtype(model.dtype).itemsize)
  limit = ((jax.devices()[0].memory_stats() or {}).get('bytes_limit')
           or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))
  if slots == -1:
    slots = int(min(AUTO_PREFIX_CACHE_SLOTS, limit // 4 // per_slot))
  elif slots * per_slot > limit // 2:
    raise ValueError(f'--prefix_cache_slots={slots} needs {slots * per_slot / 2**30:.1f} GiB, more than half of the '
                     f'{limit / 2**30:.1f} GiB of device memory: lower it (0 = no prefix cache, -1 = auto)')
  logging.info('prefix cache: %d slots of %d tokens, %.2f GiB', slots, tokens, slots * per_slot / 2**30)
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
                          cwd=pathlib.Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
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


def main(argv) -> None:
  del argv
  import uvicorn  # pylint: disable=g-import-not-at-top

  from osvl_jax import compile_cache  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout import server_app, server_auth  # pylint: disable=g-import-not-at-top
  cache = FLAGS.compile_cache_dir
  compile_cache.enable(f'{FLAGS.workdir.rstrip("/")}/jax_cache' if cache is None and FLAGS.workdir else cache)
  service = build_service(FLAGS.checkpoint, FLAGS.workdir, FLAGS.step, FLAGS.hf_config, FLAGS.tiny, FLAGS.seed,
                          FLAGS.max_new_tokens, FLAGS.max_len, FLAGS.bucket, FLAGS.max_batch,
                          FLAGS.batch_window_ms / 1000.0, FLAGS.min_pixels, FLAGS.max_pixels,
                          FLAGS.served_model_name, FLAGS.weight_version, FLAGS.prefix_cache_slots,
                          {k: getattr(FLAGS, k) for k in ('max_new_tokens_limit', 'max_image_pixels',
                                                          'max_request_pixels', 'max_concurrent_decodes',
                                                          'max_body_bytes')},
                          tuple(FLAGS.weights_root), FLAGS.num_continuous_decode_steps, FLAGS.patch_bucket)
  api_key = FLAGS.api_key if FLAGS.api_key is not None else server_auth.api_key_from_env()
  fastapi_app = server_app.create_app(service, FLAGS.host, FLAGS.port, api_key=api_key)
  logging.info('model %s; api key %s; weights roots %s', service.model_path, 'required' if api_key else 'off',
               FLAGS.weights_root or 'any path')
  print(f'serving url=http://{FLAGS.host}:{FLAGS.port} model={service.model_path} '
        f'weight_version={service.weight_version}', flush=True)
  uvicorn.run(fastapi_app, host=FLAGS.host, port=FLAGS.port, log_level='warning', access_log=False,
              timeout_keep_alive=600)   # idle keep-alive connections of pooled clients stay usable


if __name__ == '__main__':
  _define_flags()
  app.run(main)

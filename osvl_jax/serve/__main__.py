"""Serves a policy over SGLang's native HTTP API with the embedded JAX sampler (DESIGN.md §6b).

Commands:
  python -m osvl_jax.serve --checkpoint=latest --workdir=W --port=30000     # W/grpo_ckpt, else W/sft_ckpt
  python -m osvl_jax.serve --checkpoint=PATH [--step=N] --port=30000      # a checkpoint (step) folder / HF folder
  python -m osvl_jax.serve --tiny --port=30000                            # the tiny random model (tests)

Endpoints and batching: `osvl_jax/serve/service.py`; the policy loaded by `launch.build_service`. Clients:
`osvl_jax.rollout.remote.sglang_client.SGLangEngine` (the agent loop), the `sglang-router`
(`python -m sglang_router.launch_router --worker-urls URL ...`), any OpenAI client on `/v1/chat/completions`. The
image processor uses the checkpoint's recorded pixel budget (`--min_pixels` / `--max_pixels` override it; the tiny
model defaults to 32*32 .. 64*64). The last line printed before serving is
`serving url=http://HOST:PORT model=... weight_version=...`.

Prefix cache (`--prefix_cache_slots`, default -1 = auto; 0 = off): the KV of the last N rows (prompt + generated ids) is
kept on the device and a new row prefills only what follows its longest cached prefix of tokens and images
(`osvl_jax.rollout.embedded.prefix_cache`, SGLang's RadixAttention idea); `meta_info.cached_tokens` reports it,
`/flush_cache` and weight updates empty it. Memory: N slots x 2 (k, v) x layers x kv heads x head_dim x max_len
(rounded up to --bucket) values of the cache dtype, allocated at the first batch: 1 MiB a slot for --tiny (float32) at
--max_len=2048; 1.125 GiB a slot for Qwen3-VL-8B in bfloat16 at --max_len=8192. Auto (-1): as many slots as fit
in a quarter of the device's memory (of the host's RAM where the device reports none), at most 256; an explicit N
over half of it is refused at startup.

Rollout layout (`--mesh_tensor`, `--mesh_data`: `rollout.mesh`'s tensor / data, `osvl_jax.rollout.embedded.layout`):
0 (default) = one device; T = the weights tensor-parallel over T devices, the batch and KV cache over --mesh_data
replicas (-1 = the remaining devices); -1 = auto. The checkpoint is read straight into that layout's shardings;
/server_info reports the sizes as SGLang's `tp_size` / `dp_size`. E.g. an 8B checkpoint on 8 chips:
`--mesh_tensor=2` (4 replicas).

Request limits (`osvl_jax.serve.request_limits`, reported by /server_info under `request_limits`):
--max_new_tokens_limit (default --max_len), --max_image_pixels / --max_request_pixels (refused from the image
headers, before any decode), --max_concurrent_decodes (image decoding adds at most `decode_memory_bytes` to the
server's memory: 2 x (16.8 MP x 32 B + 67.1 MP x 3 B) = 1.4 GiB at the defaults), --max_body_bytes (413).
"""

from absl import app, flags, logging

from osvl_jax.serve import request_limits

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
  flags.DEFINE_bool('compile_ahead', False, 'compile the program shapes a new request needs on a background thread '
                    'while the running requests decode (serve.compile_ahead; the rows that need them wait): no '
                    'request stalls behind another\'s compile, at the cost of a scratch KV cache per rehearsal.')
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
  flags.DEFINE_integer('mesh_tensor', 0, "the sampler's rollout layout (`rollout.mesh.tensor`): 0 = one device; -1 = "
                       'auto (the smallest tensor-parallel degree whose replica holds the weights and the KV of its '
                       'share of --max_batch rows of --max_len tokens); T = tensor-parallel T (KV heads over it).')
  flags.DEFINE_integer('mesh_data', -1, 'replicas of the rollout layout (`rollout.mesh.data`; the batch over them), '
                       '-1 = the remaining devices; only with --mesh_tensor != 0.')
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


def main(argv) -> None:
  del argv
  import uvicorn  # pylint: disable=g-import-not-at-top

  from osvl_jax import compile_cache  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.api_key import api_key_from_env  # pylint: disable=g-import-not-at-top
  from osvl_jax.serve import launch  # pylint: disable=g-import-not-at-top
  from osvl_jax.serve.app import create_app  # pylint: disable=g-import-not-at-top
  cache = FLAGS.compile_cache_dir
  compile_cache.enable(f'{FLAGS.workdir.rstrip("/")}/jax_cache' if cache is None and FLAGS.workdir else cache)
  service = launch.build_service(
      FLAGS.checkpoint, FLAGS.workdir, FLAGS.step, FLAGS.hf_config, FLAGS.tiny, FLAGS.seed, FLAGS.max_new_tokens,
      FLAGS.max_len, FLAGS.bucket, FLAGS.max_batch, FLAGS.batch_window_ms / 1000.0, FLAGS.min_pixels,
      FLAGS.max_pixels, FLAGS.served_model_name, FLAGS.weight_version, FLAGS.prefix_cache_slots,
      {k: getattr(FLAGS, k) for k in ('max_new_tokens_limit', 'max_image_pixels', 'max_request_pixels',
                                      'max_concurrent_decodes', 'max_body_bytes')},
      tuple(FLAGS.weights_root), FLAGS.num_continuous_decode_steps, FLAGS.patch_bucket, FLAGS.mesh_tensor,
      FLAGS.mesh_data, FLAGS.compile_ahead)
  api_key = FLAGS.api_key if FLAGS.api_key is not None else api_key_from_env()
  fastapi_app = create_app(service, FLAGS.host, FLAGS.port, api_key=api_key)
  logging.info('model %s; api key %s; weights roots %s', service.model_path, 'required' if api_key else 'off',
               FLAGS.weights_root or 'any path')
  print(f'serving url=http://{FLAGS.host}:{FLAGS.port} model={service.model_path} '
        f'weight_version={service.weight_version}', flush=True)
  uvicorn.run(fastapi_app, host=FLAGS.host, port=FLAGS.port, log_level='warning', access_log=False,
              timeout_keep_alive=600)   # idle keep-alive connections of pooled clients stay usable


if __name__ == '__main__':
  _define_flags()
  app.run(main)

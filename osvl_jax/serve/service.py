"""SGLang's native HTTP API over the embedded JAX sampler (DESIGN.md §6b): the worker (`SamplerService`) that
batches every request into the sampler; `app.create_app` is its HTTP app, `python -m osvl_jax.serve` runs it.

Endpoints (the subset of SGLang 0.5.23 the project speaks; `osvl_jax.rollout.remote.sglang_client` is the client):

  POST /generate                  SGLang `GenerateReqInput`: `input_ids` (one list, or a batch of lists),
                                  `image_data` (base64 / data URLs, one per image, or a list per row),
                                  `sampling_params` {max_new_tokens, temperature, top_p, stop, stop_token_ids,
                                  skip_special_tokens, no_stop_trim, ...}, `return_logprob`,
                                  `return_text_in_logprobs`. Answer {text, output_ids, meta_info{id,
                                  finish_reason, prompt_tokens, completion_tokens, cached_tokens,
                                  weight_version, weight_versions, output_token_logprobs
                                  [[logprob, id, text|null]], e2e_latency}} (a list for a batch).
  POST /update_weights_from_disk  {model_path, weight_version?, ...}: new weights between two batches
                                  (`JaxSampler.set_model`, no recompile); the version is `weight_version`, or
                                  the old one + 1 when it is an integer and none is given. Refused
                                  (`success: false`, the old weights keep serving) for a path outside
                                  `--weights_root` (`auth`), another architecture or non-finite values
                                  or weights that overflow when run (`weight_receive.check_update`); an HF folder
                                  is loaded from a private copy (`weight_receive.load_model`).
  GET|POST /flush_cache           empties the sampler's prefix cache between two decode chunks (it does not wait
                                  for running requests, nor do later requests wait for them); always succeeds.
  GET /health, /health_generate, /ready
  GET /model_info, /server_info   and the deprecated `/get_model_info`, `/get_server_info`.
  POST /v1/chat/completions       OpenAI-compatible, text out (judges, pipeline stages): messages rendered by
                                  `render_messages` (the `TrajectoryBuilder`'s rendering), n=1, no streaming.
  GET /v1/models

Images: as SGLang, `input_ids` hold ONE `<|image_pad|>` per image (inside `<|vision_start|>...<|vision_end|>`),
expanded here to the image's feature count after the image is decoded and processed with the server's
`ImageProcessor` (the checkpoint's pixel budget). Ids that already hold the expanded runs (as many pads as the
images' features) are accepted as they are. `image_data` items are base64 strings or `data:image/...;base64,`
URLs (no URLs or file paths are fetched).

Batching (`scheduler`): one worker thread owns the sampler and runs continuous batching: rows decode in
a running `decode_batch.DecodeBatch` per distinct (temperature, top_p, stop strings); between two chunks of at
most `decode_steps` steps, finished rows are answered and waiting rows are admitted, so a short request never
waits for a long one. Per-row `max_new_tokens` and extra `stop_token_ids` end that row alone. A weight update is
a job too: the rows before it finish on the old weights, the rows after it start on the new ones, so no
generation straddles an update (each answer has one version span). With `compile_ahead` (`--compile_ahead`), a
request needing a program shape not compiled yet waits while `compile_ahead` compiles it off the worker thread, and
the other requests keep decoding (`/server_info`'s internal_states[0].compile_ahead counts the rehearsals).

Prefix cache: with `JaxSampler(prefix_cache_slots=N)` (the `osvl_jax.serve` default), a row reuses the KV of
the longest prefix (tokens and images) an earlier row computed and prefills only the rest, as SGLang's
RadixAttention does; `meta_info.cached_tokens` is that prefix's length. A weight update empties it.

Request limits (`request_limits.RequestLimits`, reported by /server_info): the body size (413), max_new_tokens,
prompt + 1 new token within the context, pixels per image and per request (refused from the image headers before
any decode) and concurrent image decodes; every malformed field is a 400 naming it. A request with images is
parsed on a decode thread of the `request_limits.ImageGate` and waits for one in its queue, holding no HTTP
thread: text requests are parsed at once however many image requests wait. Bodies are read and parsed by the
HTTP app (`app.create_app`) so that a flood of large uploads delays no small request; the decode threads
run nicer than the sampler's
(`request_limits.DECODE_NICENESS`). A batched sampler call that
raises while admitting rows is retried in halves (`scheduler`), so only the row that fails alone gets
the error.

Log-probs are those of the emitted ids under the served weights at the request's temperature (temperature 1 when
greedy), `JaxSampler`'s, as SGLang 0.5.23 returns them by default.
A per-request `sampling_seed` is accepted and ignored (the worker's PRNG stream advances per batch).
"""


import dataclasses
import functools
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.serve import auth, request_fields, request_limits, scheduler, weight_receive
from osvl_jax.serve import compile_ahead as compile_ahead_lib
from osvl_jax.serve.request_fields import RequestError
from osvl_jax.serve.requests import Row, parse_generate_request
from osvl_jax.trajectory import tokens as tokens_lib


@dataclasses.dataclass
class _Job:
  kind: str                      # 'generate' | 'update' | 'flush'
  payload: Any                   # list[Row] | dict (update request) | None (flush)
  future: Future


# ---------------------------------------------------------------------------------------------------------------
# The worker.
# ---------------------------------------------------------------------------------------------------------------

class SamplerService:
  """Owns a `JaxSampler` and the one worker thread that batches every request's rows into it.

  Thread-safe: `submit_*` may be called from any thread; results come back as `concurrent.futures.Future`s.
  """

  def __init__(self, sampler, tokenizer, image_processor, model_path: str = '', weight_version: str = 'default',
               served_model_name: str = 'osvl-jax', max_batch: int = 64, batch_window_s: float = 0.02,
               default_max_new_tokens: int = 512, loader: Callable[[str], Any] | None = None,
               limits: request_limits.RequestLimits | None = None,
               weights_roots: auth.WeightsRoots | None = None, decode_steps: int = 8, compile_ahead: bool = False):
    """Args:
      sampler: a `JaxSampler` (its temperature / top_p are set per batch by the worker).
      tokenizer: the Qwen tokenizer.
      image_processor: the `ImageProcessor` of the served policy (its training pixel budget).
      model_path: reported by /model_info.
      weight_version: the initial version string.
      served_model_name: the model name of /v1/models and /model_info.
      max_batch: most rows decoding at once.
      batch_window_s: the worker keeps collecting jobs for a batch while they arrive less than this apart
        (seconds; at most 20 windows per batch; 0: only the jobs already waiting).
      default_max_new_tokens: max_new_tokens of a request that gives none.
      loader: `path -> model` for /update_weights_from_disk (default `weight_receive.load_model` into the
        sampler's rollout layout).
      weights_roots: the folders updates may load from (`auth.WeightsRoots`; None: any path).
      decode_steps: decode steps per chunk at most (SGLang's `num_continuous_decode_steps`): finished rows leave
        and waiting rows enter a running batch between chunks (`scheduler`).
      compile_ahead: compile an admission's new program shapes on a background thread while the other rows
        decode (`compile_ahead`; `python -m osvl_jax.serve --compile_ahead`).
      limits: the request limits (default: `RequestLimits(sampler.max_len, sampler.max_len)`, the other limits at
        their defaults); images are decoded through one `request_limits.ImageGate` over them.
    Raises:
      ValueError: `default_max_new_tokens` above `limits.max_new_tokens_limit`; a `weight_version` that is not
        an integer or printable text (`request_fields.weight_version`).
    """
    self.sampler, self.tokenizer, self.image_processor = sampler, tokenizer, image_processor
    self.model_path, self.served_model_name = model_path, served_model_name
    self.weight_version = request_fields.weight_version(weight_version, '--weight_version')
    self.max_batch, self.batch_window_s = int(max_batch), float(batch_window_s)
    self.default_max_new_tokens = int(default_max_new_tokens)
    self.limits = limits or request_limits.RequestLimits(int(sampler.max_len), int(sampler.max_len))
    self.limits.check_max_new_tokens(self.default_max_new_tokens, '--max_new_tokens')
    self.image_gate = request_limits.ImageGate(self.limits)
    self.loader = loader or functools.partial(weight_receive.load_model, layout=getattr(sampler, 'layout', None))
    self.weights_roots = weights_roots or auth.WeightsRoots()
    if isinstance(decode_steps, bool) or not isinstance(decode_steps, int) or decode_steps < 1:
      raise ValueError(f'decode_steps must be an integer >= 1, got {decode_steps!r}')
    self.decode_steps = decode_steps
    self.compile_ahead = compile_ahead_lib.CompileAhead() if compile_ahead else None
    self.stats = {'batches': 0, 'rows': 0, 'max_rows_per_batch': 0, 'updates': 0, 'failed_rows': 0,
                  'isolation_retries': 0, 'peak_kv_slots': 0}
    self.started = time.time()
    self._queue: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._run, name='osvl-sampler', daemon=True)
    self._thread.start()

  def close(self) -> None:
    self._queue.put(None)
    self._thread.join(timeout=30)
    if self.compile_ahead is not None:
      self.compile_ahead.close()

  # -- submission ----------------------------------------------------------------------------------------------
  def submit_rows(self, rows: list[Row]) -> Future:
    """Queues rows; the future's result is one dict per row (`_row_output`)."""
    fut: Future = Future()
    if not rows:
      fut.set_result([])
      return fut
    self._queue.put(_Job('generate', rows, fut))
    return fut

  def submit_update(self, request: dict) -> Future:
    """Queues a weight update; the future's result is (success, message)."""
    fut: Future = Future()
    self._queue.put(_Job('update', request, fut))
    return fut

  def submit_flush(self) -> Future:
    """Queues a prefix-cache flush (run between two batches); the future's result is True."""
    fut: Future = Future()
    self._queue.put(_Job('flush', None, fut))
    return fut

  def parse_generate_request(self, body: dict) -> tuple[list[Row], bool]:
    """A `/generate` body -> (rows, is_batch) (`requests.parse_generate_request`, ids checked against the served
    model's vocabulary, a compact one included, within `self.limits`).

    Raises:
      RequestError: naming the field: one this server cannot honour, a malformed value, ids or images, image spans
        that do not match the images, a prompt or max_new_tokens over the limits.
    """
    config = getattr(self.sampler._model, 'config', None)  # pylint: disable=protected-access
    vocab = getattr(getattr(config, 'text', None), 'vocab_size', tokens_lib.VOCAB_SIZE)
    return parse_generate_request(body, self.image_processor, vocab, self.default_max_new_tokens, self.limits,
                                  self.image_gate, model_config=config)

  # -- worker (`scheduler`) -----------------------------------------------------------------------------
  def _run(self) -> None:
    scheduler.Scheduler(self).run()

  def _update(self, job: _Job) -> None:
    """Answers an update job with (success, message); any failure (refused, unloadable, another architecture,
    a broken set_model) is (False, why) with the old weights still serving, never an exception out of the worker."""
    try:
      job.future.set_result(self._apply_update(job.payload))
    except Exception as e:  # pylint: disable=broad-except
      job.future.set_result((False, f'update failed: {type(e).__name__}: {e}; still serving weight_version '
                                    f'{self.weight_version}'))

  def _apply_update(self, req: dict) -> tuple[bool, str]:
    version = req.get('weight_version')
    try:
      version = None if version is None else request_fields.weight_version(version)
    except RequestError as e:
      return False, f'{e}; still serving weight_version {self.weight_version}'
    try:
      path = self.weights_roots.resolve(req['model_path'])
    except (auth.WeightsPathRefused, ValueError, OSError) as e:   # e.g. a NUL byte in the path
      return False, str(e) if isinstance(e, auth.WeightsPathRefused) else f'bad model_path: {e}'
    try:
      model = self.loader(path)
    except Exception as e:  # pylint: disable=broad-except
      return False, f'failed to load {req.get("model_path")}: {type(e).__name__}: {e}'
    try:   # the old weights keep serving unless the new ones fit them
      weight_receive.check_update(self.sampler._model, model)  # pylint: disable=protected-access
    except weight_receive.UpdateRefused as e:
      return False, f'refused {req.get("model_path")}: {e}; still serving weight_version {self.weight_version}'
    self.sampler.set_model(model)
    old = self.weight_version
    if version is None:
      digits = old.removeprefix('-')
      version = str(int(old) + 1) if digits.isascii() and digits.isdigit() else old
    self.weight_version, self.model_path = version, str(req['model_path'])
    self.stats['updates'] += 1
    return True, f'Succeeded to update model weights (weight_version {old} -> {version}).'

  def _flush(self, job: _Job) -> None:
    cache = getattr(self.sampler, 'prefix_cache', None)
    if cache is not None:
      cache.clear()
    job.future.set_result(True)

  def _row_output(self, row: Row, gen: engine_lib.Generation, version: str) -> dict:
    """Cuts a generation to the row's cap and stop ids; -> (ids, logprobs, finish_reason dict, stop string)."""
    ids = [int(i) for i in gen.ids]
    lps = [float(x) for x in gen.logprobs]
    reason, matched = gen.finish_reason, None
    extra = [k for k, i in enumerate(ids) if i in row.stop_token_ids]
    if extra and extra[0] < len(ids) - 1:  # an extra stop id of this row before the sampler stopped it
      ids, lps, reason = ids[:extra[0] + 1], lps[:extra[0] + 1], engine_lib.FINISH_STOP
    if len(ids) > row.max_new_tokens:
      ids, lps, reason = ids[:row.max_new_tokens], lps[:row.max_new_tokens], engine_lib.FINISH_LENGTH
    if ids and (ids[-1] in row.stop_token_ids or ids[-1] in engine_lib.EOS_IDS):
      reason = engine_lib.FINISH_STOP
    if reason == engine_lib.FINISH_STOP:
      finish = {'type': 'stop', 'matched': ids[-1]}
    elif reason == engine_lib.FINISH_STOP_STRING:
      text = self.tokenizer.decode(ids)
      matched = next((s for s in row.stop if s in text), row.stop[0] if row.stop else '')
      finish = {'type': 'stop', 'matched': matched}
    else:
      finish = {'type': 'length', 'length': row.max_new_tokens}
    return {'ids': ids, 'logprobs': lps, 'finish_reason': finish, 'matched_str': matched,
            'weight_version': version, 'prompt_tokens': int(len(row.context.prompt_ids))}

  # -- answers -------------------------------------------------------------------------------------------------
  def text_of(self, ids: Sequence[int], skip_special_tokens: bool, stop_str: str | None = None,
              no_stop_trim: bool = True) -> str:
    """The answer text: stop ids dropped, special tokens skipped or not, a matched stop string trimmed."""
    ids = list(ids)
    if ids and ids[-1] in engine_lib.EOS_IDS:
      ids = ids[:-1]
    text = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    if stop_str and not no_stop_trim and stop_str in text:
      text = text[:text.index(stop_str)]
    return text

  def generate_response(self, row: Row, out: dict, rid: str, started: float) -> dict:
    """One row's `/generate` answer in SGLang's layout."""
    n = len(out['ids'])
    meta = {'id': rid, 'finish_reason': out['finish_reason'], 'prompt_tokens': out['prompt_tokens'],
            'completion_tokens': n, 'cached_tokens': out['cached_tokens'], 'weight_version': out['weight_version'],
            'weight_versions': [{'version': out['weight_version'], 'start': 0, 'end': n}],
            'e2e_latency': time.time() - started}
    if row.return_logprob:
      texts = ([self.tokenizer.decode([i]) for i in out['ids']] if row.return_text_in_logprobs
               else [None] * n)
      meta['input_token_logprobs'] = []
      meta['output_token_logprobs'] = [[lp, i, t] for lp, i, t in zip(out['logprobs'], out['ids'], texts)]
      meta['output_token_logprobs_length'] = n
    return {'text': self.text_of(out['ids'], row.skip_special_tokens, out['matched_str'], row.no_stop_trim),
            'output_ids': out['ids'], 'meta_info': meta}

  def model_info(self) -> dict:
    config = getattr(self.sampler._model, 'config', None)  # pylint: disable=protected-access
    return {'model_path': self.model_path, 'served_model_name': self.served_model_name, 'tokenizer_path': None,
            'is_generation': True, 'preferred_sampling_params': None, 'weight_version': self.weight_version,
            'load_format': 'orbax|hf', 'has_image_understanding': True, 'has_audio_understanding': False,
            'model_type': 'qwen3_vl_moe' if getattr(config, 'is_moe', False) else 'qwen3_vl',
            'architectures': ['Qwen3VLForConditionalGeneration'], 'engine': 'osvl_jax.JaxSampler'}

  def server_info(self, host: str = '', port: int = 0) -> dict:
    import jax  # pylint: disable=g-import-not-at-top
    s = self.sampler
    return {'version': 'osvl_jax', 'frontend': 'osvl_jax', 'model_path': self.model_path, 'host': host,
            'port': port, 'served_model_name': self.served_model_name, 'weight_version': self.weight_version,
            'max_total_num_tokens': int(s.max_len * self.max_batch), 'max_batch': self.max_batch,
            'batch_window_s': self.batch_window_s, 'context_length': int(s.max_len), **self.parallel_sizes(),
            'devices': [str(d) for d in jax.devices()], 'startup_time': self.started,
            'image_processor': {'min_pixels': self.image_processor.min_pixels,
                                'max_pixels': self.image_processor.max_pixels},
            'request_limits': {**self.limits.info(), 'peak_decodes': self.image_gate.peak_decodes,
                               'waiting_decodes': self.image_gate.waiting},
            'internal_states': [{'stats': dict(self.stats), 'last_batch': dict(s.stats),
                                 'prefix_cache': self.prefix_cache_info(),
                                 'compile_ahead': None if self.compile_ahead is None else
                                 self.compile_ahead.info()}]}

  def parallel_sizes(self) -> dict:
    """SGLang's {'dp_size', 'tp_size'}: the sampler's rollout layout (replicas, tensor-parallel degree; 1, 1 on one
    device)."""
    layout = self.sampler.layout
    return {'dp_size': 1, 'tp_size': 1} if layout is None else {'dp_size': layout.replicas, 'tp_size': layout.tensor}

  def prefix_cache_info(self) -> dict:
    """{slots, used_slots, slot_tokens} of the sampler's prefix cache ({'slots': 0} without one)."""
    cache = getattr(self.sampler, 'prefix_cache', None)
    if cache is None:
      return {'slots': 0}
    return {'slots': cache.slots, 'used_slots': cache.used_slots, 'slot_tokens': cache.max_len}

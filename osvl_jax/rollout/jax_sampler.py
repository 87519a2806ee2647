"""The embedded JAX sampler: batched prefill into a KV cache, then jitted batched decode (CPU/TPU, tests, demo).

One `generate` call:
  1. Right-pads the B prompts to a common length bucket (a multiple of `bucket`) and the batch to a power of two,
     so that repeated calls reuse compiled programs.
  2. Prefills all rows in one forward pass into a batched KV cache (`model.init_cache`), vision features
     included; 3-D MRoPE positions come from `rope.get_rope_index` on each row alone (no padding convention to
     agree on), the single source of truth shared with training.
  3. Decodes the batch together, in chunks of steps run on device (`jax.lax.while_loop`, one host sync per
     chunk): row b feeds its last token at cache index `c_b` (per-row `cache_index [B]`) with text position
     `c_b + delta_b`, where `delta_b = max(position_ids[:, b]) + 1 - len_b` (HF's `rope_deltas` for a
     right-aligned-free row). Right padding is safe: a row's real tokens precede its pads, and decode overwrites
     the pad slots in order.
  4. Stops a row at `<|im_end|>` or `<|endoftext|>` (Qwen's two end-of-sequence ids; finish_reason 'stop') or at
     max_new_tokens / when the context reaches `max_len`, both on device, exactly; at a stop string, checked on
     the host after each chunk (at most `_STOP_CHUNK` steps when there are stop strings) and cut exactly at the
     id that completes it, so the result is the same as checking after every token.

Vision ids (`trajectory.VISION_IDS`: `<|image_pad|>`, `<|vision_start|>`, `<|vision_end|>`, `<|video_pad|>`) are
never emitted: their logits are set to -inf before sampling and before greedy argmax (only the environment writes
image spans; a sampled pad would break the pad/feature count of the next context). The class attribute
`never_sampled` holds them; a subclass may add ids (bench/sampler_speed.py adds the end-of-sequence ids to decode
full-length rows, as transformers' `min_new_tokens` does).

Log-probabilities: `Generation.logprobs[k]` is log softmax(logits)[id_k] at temperature 1, i.e. under the policy
model itself, not under the temperature/top-p-warped distribution the id was drawn from. This is what the trainer
recomputes (the GRPO old/new log-probs are temperature-1 log-probs, vision ids not masked), so the two can be
compared directly.

Sampling parameters are validated on construction and on assignment (`temperature`, `top_p` are properties):
a ValueError names the parameter.
"""

import math
import numbers
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from osvl_jax.models.qwen3_vl import rope
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout import sampling
from osvl_jax.trajectory import tokens as tokens_lib

PAD_ID = tokens_lib.ENDOFTEXT_ID  # <|endoftext|>, never attended to by real tokens (right padding).
IMAGE_PAD_ID = tokens_lib.IMAGE_PAD_ID  # <|image_pad|>, one per merged image patch.
_STOP_TAIL = 64  # stop strings are searched in the text of a row's last this-many ids.
_STOP_CHUNK = 8  # decode steps per device call at most, with stop strings (a stopped row decodes <= 7 ids more).


def _round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def _next_pow2(n: int) -> int:
  return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _check_int(name: str, value: Any, minimum: int) -> int:
  """`value` as an int >= minimum, or a ValueError naming the parameter."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}')
  return int(value)


def _check_stop(name: str, stop: Any) -> tuple[str, ...]:
  """`stop` as a tuple of non-empty strings, or a ValueError naming the parameter (a bare str is refused)."""
  if isinstance(stop, (str, bytes)) or not all(isinstance(x, str) and x for x in stop):
    raise ValueError(f'{name} must be a sequence of non-empty strings, got {stop!r}')
  return tuple(stop)


class JaxSampler(engine_lib.Engine):
  """Batched KV-cache sampler over a `Qwen3VLModel` (implements `engine.Engine`).

  Compiled programs are keyed by (padded batch, prompt bucket, cache length, image grids, greedy/top-p flags,
  `never_sampled`, decode steps per call);
  weights are an argument, so `set_model` after a training step does not recompile.

  Attributes:
    weight_version: the version of the current weights (a str, set with them by `rollout.weight_sync`), reported
      on every `Generation`; None = unknown.
    never_sampled: ids never drawn nor argmaxed (`sampling.NEVER_SAMPLED`, the vision ids); a subclass may add
      ids (bench/sampler_speed.py adds the end-of-sequence ids, as transformers' `min_new_tokens` does).
  """
  weight_version: str | None = None
  never_sampled: tuple[int, ...] = sampling.NEVER_SAMPLED

  def __init__(self, model, tokenizer, image_processor=None, max_new_tokens: int = 512,
               temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, max_len: int = 8192,
               bucket: int = 128, stop: Sequence[str] = (), cache_dtype: Any = None,
               pad_batch_pow2: bool = True, progress: bool = False, decode_steps: int = 64):
    """Args:
      model: a `Qwen3VLModel` (nnx.Module) with `__call__`, `logits`, `init_cache` (docs/INTERFACES.md).
      tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer()`), for `Generation.text` and stop strings.
      image_processor: optional `trajectory.ImageProcessor`, used only for images given as raw uint8 [H, W, 3]
        arrays instead of `ImageRef`s.
      max_new_tokens: default cap on emitted ids per row, an integer >= 1.
      temperature: sampling temperature, finite and >= 0; 0 means greedy (argmax).
      top_p: nucleus sampling mass in (0, 1] (1: no nucleus cut).
      seed: integer PRNG seed; each `generate` call advances the sampler's key.
      max_len: cap on prompt + emitted ids per row, an integer >= 1 (rows whose prompt already fills it emit
        nothing).
      bucket: prompt lengths and cache lengths are rounded up to a multiple of this, an integer >= 1.
      stop: default stop strings, non-empty (besides `<|im_end|>` and `<|endoftext|>`, which always stop).
      cache_dtype: KV-cache dtype (None: the model's default in `init_cache`).
      pad_batch_pow2: pad the batch to a power of two with dummy rows (fewer recompiles as episodes finish).
      progress: show a tqdm bar over decode steps.
      decode_steps: decode steps per device call (one host sync each; SGLang's `num_continuous_decode_steps`),
        an integer >= 1; a call ends early once every row is done. With stop strings at most `_STOP_CHUNK` (8):
        they are checked on the host after each call.
    Raises:
      ValueError: naming the parameter, for any value outside the ranges above (e.g. top_p=0, a negative or NaN
        temperature, max_new_tokens=0, a bare string as `stop`).
    """
    self.tokenizer = tokenizer
    self.image_processor = image_processor
    self.max_new_tokens = _check_int('max_new_tokens', max_new_tokens, 1)
    self.temperature = temperature
    self.top_p = top_p
    self.max_len = _check_int('max_len', max_len, 1)
    self.bucket = _check_int('bucket', bucket, 1)
    self.stop = _check_stop('stop', stop)
    self.cache_dtype = cache_dtype
    self.pad_batch_pow2 = pad_batch_pow2
    self.progress = progress
    self.decode_steps = _check_int('decode_steps', decode_steps, 1)
    self._key = jax.random.key(_check_int('seed', seed, 0))
    self.set_model(model)
    self.stats: dict[str, float] = {}

  @property
  def temperature(self) -> float:
    """Sampling temperature, finite and >= 0 (0: greedy); validated on assignment."""
    return self._temperature

  @temperature.setter
  def temperature(self, value: float) -> None:
    try:
      t = float(value)
    except (TypeError, ValueError):
      raise ValueError(f'temperature must be a finite number >= 0, got {value!r}') from None
    if not math.isfinite(t) or t < 0:
      raise ValueError(f'temperature must be a finite number >= 0 (0 = greedy), got {value!r}')
    self._temperature = t

  @property
  def top_p(self) -> float:
    """Nucleus mass in (0, 1]; validated on assignment."""
    return self._top_p

  @top_p.setter
  def top_p(self, value: float) -> None:
    try:
      p = float(value)
    except (TypeError, ValueError):
      raise ValueError(f'top_p must be a number in (0, 1], got {value!r}') from None
    if not 0.0 < p <= 1.0:  # NaN fails this too
      raise ValueError(f'top_p must be in (0, 1] (use temperature=0 for greedy), got {value!r}')
    self._top_p = p

  # -------------------------------------------------------------------------------------------------------------
  # Weights.
  # -------------------------------------------------------------------------------------------------------------

  def set_model(self, model) -> None:
    """Uses `model`'s current weights from now on (same architecture: compiled programs are reused).

    The sampler keeps a snapshot (`nnx.clone`: new Variables over the same immutable arrays, nothing copied), so a
    trainer's later in-place update of `model` (e.g. while a rollout runs, `grpo.max_staleness` 1) does not reach
    it until the next `set_model`.
    """
    model = nnx.clone(model)
    graphdef, state = nnx.split(model)
    if getattr(self, '_graphdef', None) is not None and graphdef != self._graphdef:
      self._jit_cache = {}
    self._graphdef, self._state = graphdef, state
    self._model = model
    if not hasattr(self, '_jit_cache'):
      self._jit_cache = {}

  def reseed(self, seed: int) -> None:
    """Restarts the sampler's PRNG stream from `seed` (e.g. one seed per training step, for resumable runs).

    Raises:
      ValueError: when `seed` is not an integer >= 0.
    """
    self._key = jax.random.key(_check_int('seed', seed, 0))

  # -------------------------------------------------------------------------------------------------------------
  # Compiled pieces.
  # -------------------------------------------------------------------------------------------------------------

  def _init_cache(self, batch: int, cache_len: int):
    if self.cache_dtype is None:
      return self._model.init_cache(batch, cache_len)
    return self._model.init_cache(batch, cache_len, self.cache_dtype)

  def _prefill_fn(self, grids: tuple, greedy: bool, use_top_p: bool):
    """jit(state, ids [B,T], pos [3,B,T], mask [B,T], pixels [N,D]|None, last [B], cache, key, temp, top_p)."""
    key = ('prefill', grids, greedy, use_top_p, self.never_sampled)
    if key not in self._jit_cache:
      graphdef, banned = self._graphdef, self.never_sampled
      grid_thw = np.asarray(grids, np.int32).reshape(-1, 3) if grids else None

      def prefill(state, input_ids, position_ids, attention_mask, pixel_values, last, cache, rng, temperature,
                  top_p):
        model = nnx.merge(graphdef, state)
        batch = input_ids.shape[0]
        hidden, cache = model(input_ids, position_ids, attention_mask, pixel_values, grid_thw, cache=cache,
                              cache_index=jnp.zeros((batch,), jnp.int32))
        hidden_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)  # [B, 1, H]
        logits = model.logits(hidden_last)[:, 0]
        ids, logprobs = sampling.sample_logits(logits, rng, temperature, top_p, greedy, use_top_p, banned)
        return ids, logprobs, cache

      self._jit_cache[key] = jax.jit(prefill, donate_argnums=(6,))
    return self._jit_cache[key]

  def _decode_fn(self, greedy: bool, use_top_p: bool, chunk: int):
    """jit(state, cache, carry, limits [B], key, offset, temp, top_p) -> (ids [B, chunk], logprobs [B, chunk], carry,
    cache).

    Up to `chunk` decode steps on device (`jax.lax.while_loop`, leaving early once every row is done), so the host
    syncs once per chunk, not per token. carry = (tokens [B] (each row's last id, fed next), positions [B],
    cache_index [B], emitted [B] (ids so far), done bool [B]). Step k feeds the active rows' last ids, draws with
    `fold_in(key, offset + k)` (`key` is one per `generate`, `offset` the decode steps already run: the samples do
    not depend on the chunk size or on stop strings), and writes row b's draw at column k while b is active: the ids a row emits in this chunk
    are the first `emitted_after - emitted_before` columns. A row becomes done on device at an end-of-sequence id
    or when `emitted` reaches `limits`; a done row keeps rewriting its own next slot (harmless, never read).
    """
    key = ('decode', greedy, use_top_p, self.never_sampled, chunk)
    if key not in self._jit_cache:
      graphdef, banned = self._graphdef, self.never_sampled
      eos = jnp.asarray(engine_lib.EOS_IDS, jnp.int32)

      def decode(state, cache, carry, limits, rng, offset, temperature, top_p):
        model = nnx.merge(graphdef, state)
        batch = limits.shape[0]
        last_slot = cache['mask'].shape[1] - 1

        def step(loop):
          k, (tokens, positions, cache_index, emitted, done), cache, out_ids, out_lp = loop
          position_ids = jnp.broadcast_to(positions[None, :, None], (3, batch, 1))
          hidden, cache = model(tokens[:, None], position_ids, None, None, None, cache=cache,
                                cache_index=jnp.minimum(cache_index, last_slot))
          ids, logprobs = sampling.sample_logits(model.logits(hidden)[:, -1], jax.random.fold_in(rng, offset + k),
                                                 temperature, top_p, greedy, use_top_p, banned)
          active = ~done
          step_ = active.astype(jnp.int32)
          emitted = emitted + step_
          done = done | (active & (jnp.isin(ids, eos) | (emitted >= limits)))
          carry = (jnp.where(active, ids, tokens), positions + step_, cache_index + step_, emitted, done)
          return k + 1, carry, cache, out_ids.at[:, k].set(ids), out_lp.at[:, k].set(logprobs)

        loop = (jnp.int32(0), carry, cache, jnp.zeros((batch, chunk), jnp.int32),
                jnp.zeros((batch, chunk), jnp.float32))
        _, carry, cache, out_ids, out_lp = jax.lax.while_loop(
            lambda loop: (loop[0] < chunk) & ~jnp.all(loop[1][4]), step, loop)
        return out_ids, out_lp, carry, cache

      self._jit_cache[key] = jax.jit(decode, donate_argnums=(1,))
    return self._jit_cache[key]

  # -------------------------------------------------------------------------------------------------------------
  # Generation.
  # -------------------------------------------------------------------------------------------------------------

  def _image_refs(self, images: Sequence[Any]) -> list:
    refs = []
    for image in images:
      if isinstance(image, np.ndarray):
        if self.image_processor is None:
          raise ValueError('raw image arrays need JaxSampler(image_processor=...)')
        image = self.image_processor.process(image)
      refs.append(image)
    return refs

  def _next_key(self) -> jax.Array:
    self._key, key = jax.random.split(self._key)
    return key

  def generate(self, contexts, max_new_tokens=None, stop=None):
    """Samples one assistant turn per context (see `engine.Engine.generate`).

    Args:
      contexts: B `(prompt_ids int32 [T_b], images list[ImageRef])`.
      max_new_tokens: cap per row, an integer >= 1 (default: the sampler's).
      stop: non-empty stop strings (default: the sampler's); `<|im_end|>` and `<|endoftext|>` always stop.
    Returns:
      B `Generation`s; `logprobs` are temperature-1 log-probabilities of the emitted ids (module docstring).
    Raises:
      ValueError: naming the parameter, for an invalid `max_new_tokens` or `stop`; for a context whose
        `<|image_pad|>` count does not match its images.
    """
    contexts = [engine_lib.as_context(c) for c in contexts]
    contexts = [engine_lib.Context(c.prompt_ids, self._image_refs(c.images)) for c in contexts]
    max_new = self.max_new_tokens if max_new_tokens is None else _check_int('max_new_tokens', max_new_tokens, 1)
    stop = self.stop if stop is None else _check_stop('stop', stop)
    results: list[engine_lib.Generation | None] = [None] * len(contexts)

    # Rows that cannot emit anything (no budget) are answered without running the model.
    live = []
    for i, c in enumerate(contexts):
      if min(max_new, self.max_len - len(c.prompt_ids)) <= 0 or len(c.prompt_ids) == 0:
        results[i] = engine_lib.Generation(np.zeros(0, np.int32), np.zeros(0, np.float32), '',
                                           engine_lib.FINISH_LENGTH)
      else:
        live.append(i)
    if live:
      for i, gen in zip(live, self._generate_batch([contexts[i] for i in live], max_new, stop)):
        results[i] = gen
    return results

  def _generate_batch(self, contexts: list, max_new: int, stop: tuple) -> list:
    t_start = time.perf_counter()
    n = len(contexts)
    batch = _next_pow2(n) if self.pad_batch_pow2 else n
    lengths = np.asarray([len(c.prompt_ids) for c in contexts] + [1] * (batch - n), np.int32)
    prompt_pad = _round_up(int(lengths.max()), self.bucket)
    cache_len = _round_up(min(self.max_len, int(lengths.max()) + max_new), self.bucket)
    cache_len = max(cache_len, prompt_pad)
    limits = np.asarray([min(max_new, self.max_len - l) for l in lengths], np.int32)  # emitted ids per row

    input_ids = np.full((batch, prompt_pad), PAD_ID, np.int32)
    position_ids = np.zeros((3, batch, prompt_pad), np.int32)
    attention_mask = np.zeros((batch, prompt_pad), bool)
    deltas = np.zeros((batch,), np.int32)  # rope_deltas: next position of row b = cache index + delta
    config = getattr(self._model, 'config', None)
    rope_kw = {}
    if config is not None:
      rope_kw = {'image_token_id': config.image_token_id, 'spatial_merge_size': config.vision.spatial_merge_size}
    pixel_values, grids = [], []
    for b in range(batch):
      if b < n:
        ids, images = contexts[b].prompt_ids, contexts[b].images
      else:
        ids, images = np.asarray([PAD_ID], np.int32), []
      length = len(ids)
      n_pads = int(np.sum(ids == rope_kw.get('image_token_id', IMAGE_PAD_ID)))
      if n_pads != sum(im.num_tokens for im in images):
        raise ValueError(f'context {b}: {n_pads} <|image_pad|> tokens but its {len(images)} image(s) need '
                         f'{sum(im.num_tokens for im in images)}')
      input_ids[b, :length] = ids
      attention_mask[b, :length] = True
      row_grid = np.asarray([np.asarray(im.grid_thw).reshape(3) for im in images], np.int32).reshape(-1, 3)
      pos, delta = rope.get_rope_index(ids[None], row_grid if len(images) else None, None, **rope_kw)
      pos = np.asarray(pos, np.int32)[:, 0]  # [3, length]
      position_ids[:, b, :length] = pos
      deltas[b] = int(np.asarray(delta).reshape(-1)[0])
      position_ids[:, b, length:] = length + deltas[b] + np.arange(prompt_pad - length)[None]
      for im in images:
        pixel_values.append(np.asarray(im.pixel_values, np.float32))
        grids.append(tuple(int(x) for x in np.asarray(im.grid_thw).reshape(3)))
    pixels = np.concatenate(pixel_values, 0) if pixel_values else None

    greedy = self.temperature <= 0.0
    use_top_p = (not greedy) and self.top_p < 1.0
    temperature = jnp.float32(max(self.temperature, 1e-6))
    top_p = jnp.float32(self.top_p)
    state = self._state

    cache = self._init_cache(batch, cache_len)
    prefill = self._prefill_fn(tuple(grids), greedy, use_top_p)
    tok, lp, cache = prefill(state, input_ids, position_ids, attention_mask, pixels,
                             jnp.asarray(lengths - 1), cache, self._next_key(), temperature, top_p)
    tok.block_until_ready()
    t_prefill = time.perf_counter()

    tok_np, lp_np = np.asarray(tok), np.asarray(lp)
    out_ids = [[int(tok_np[b])] for b in range(n)]
    out_lp = [[float(lp_np[b])] for b in range(n)]
    reasons = [self._finish(out_ids[b], out_lp[b], 0, limits[b], stop) for b in range(n)]
    done = np.asarray([r is not None for r in reasons] + [True] * (batch - n))  # padding rows never run
    emitted = np.ones((batch,), np.int32)
    carry = (tok, jnp.asarray(lengths + deltas, jnp.int32), jnp.asarray(lengths, jnp.int32), jnp.asarray(emitted),
             jnp.asarray(done))   # a row's last id is written at its cache index next, at text position + delta
    decode = self._decode_fn(greedy, use_top_p, min(self.decode_steps, _STOP_CHUNK) if stop else self.decode_steps)
    limits_dev = jnp.asarray(limits)
    decode_key, offset = self._next_key(), 0
    steps = 0
    bar = None
    if self.progress:
      import tqdm  # pylint: disable=g-import-not-at-top
      bar = tqdm.tqdm(total=int(limits[:n].max()), desc='decode', leave=False)
    while not done.all():
      ids, lps, carry, cache = decode(state, cache, carry, limits_dev, decode_key, jnp.int32(offset), temperature,
                                      top_p)
      offset += ids.shape[1]  # a chunk stops early only when every row is done (no call follows)
      ids, lps, now = np.asarray(ids), np.asarray(lps), np.asarray(carry[3])
      new = now - emitted
      for b in np.flatnonzero(new[:n]):
        start = len(out_ids[b])
        out_ids[b].extend(ids[b, :new[b]].tolist())
        out_lp[b].extend(lps[b, :new[b]].tolist())
        reasons[b] = self._finish(out_ids[b], out_lp[b], start, limits[b], stop)
      emitted = now
      done = np.asarray([r is not None for r in reasons] + [True] * (batch - n))
      carry = (*carry[:4], jnp.asarray(done))  # rows cut at a stop string stop on device too
      steps += int(new.max())
      if bar is not None:
        bar.update(int(new.max()))
    if bar is not None:
      bar.close()
    t_end = time.perf_counter()
    emitted = sum(len(x) for x in out_ids)
    self.stats = {'prefill_s': t_prefill - t_start, 'decode_s': t_end - t_prefill, 'decode_steps': steps,
                  'emitted_tokens': emitted, 'batch': batch, 'prompt_pad': prompt_pad, 'cache_len': cache_len,
                  'decode_tokens_per_s': emitted / max(t_end - t_prefill, 1e-9)}
    return [engine_lib.Generation(ids=np.asarray(out_ids[b], np.int32), logprobs=np.asarray(out_lp[b], np.float32),
                                  text=engine_lib.decode_text(self.tokenizer, out_ids[b]), finish_reason=reasons[b],
                                  weight_version=self.weight_version)
            for b in range(n)]

  def _finish(self, ids: list, logprobs: list, start: int, limit: int, stop: tuple) -> str | None:
    """Finish reason of a row whose ids[start:] are new, or None while it runs (ids / logprobs cut in place).

    The first new id that completes a stop string (searched in the text of the last `_STOP_TAIL` ids up to it)
    ends the row there, and the ids after it (decoded in the same chunk) are dropped; an end-of-sequence id ends
    it with 'stop' (it is always the last id: the device stops a row there); then the length limit. The same
    decisions, in the same order, as checking after every token.
    """
    if stop and any(s in self.tokenizer.decode(ids[max(0, start + 1 - _STOP_TAIL):]) for s in stop):
      for k in range(start, len(ids)):   # the chunk's text holds a stop string: find the id that completes it
        if ids[k] not in engine_lib.EOS_IDS and any(
            s in self.tokenizer.decode(ids[max(0, k + 1 - _STOP_TAIL):k + 1]) for s in stop):
          del ids[k + 1:], logprobs[k + 1:]
          return engine_lib.FINISH_STOP_STRING
    if ids and ids[-1] in engine_lib.EOS_IDS:
      return engine_lib.FINISH_STOP
    if len(ids) >= limit:
      return engine_lib.FINISH_LENGTH
    return None

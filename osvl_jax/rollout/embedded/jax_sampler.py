"""The embedded JAX sampler: batched prefill into a KV cache, then jitted batched decode (CPU/TPU, tests, demo).

One `generate` call:
  1. Right-pads the B prompts to a common length rung (`prefill_inputs.length_rung`: `bucket` x 2^k up to 4
     buckets, then steps of 4 buckets, capped at max_len) and the batch to a power of two, so that repeated
     calls, and the turns of a growing multi-turn context, reuse compiled programs.
  2. Prefills all rows in one forward pass into a batched KV cache (`model.init_cache`), vision features
     included; 3-D MRoPE positions come from `rope.get_rope_index` on each row alone (no padding convention to
     agree on), the single source of truth shared with training (`prefill_inputs`). With a prefix cache
     (`prefix_cache_slots` > 0, `prefix_cache`), the batch cache starts as each row's longest cached prefix and
     only the rest of the row is prefilled (at cache index = prefix length); the rows' KV are stored after the
     batch, and `cached_tokens` holds the reused prefix lengths (SGLang's `meta_info.cached_tokens`).
  3. Decodes the batch together, in chunks of steps run on device (`jax.lax.while_loop`, one host sync per
     chunk): row b feeds its last token at cache index `c_b` (per-row `cache_index [B]`) with text position
     `c_b + delta_b`, where `delta_b = max(position_ids[:, b]) + 1 - len_b` (HF's `rope_deltas` for a
     right-aligned-free row). Right padding is safe: a row's real tokens precede its pads, and decode overwrites
     the pad slots in order.
  4. Stops a row at `<|im_end|>` or `<|endoftext|>` (Qwen's two end-of-sequence ids; finish_reason 'stop') or at
     max_new_tokens / when the context reaches `max_len`, both on device, exactly; at a stop string, checked on
     the host after each chunk (at most `_STOP_CHUNK` steps when there are stop strings) and cut exactly at the
     id that completes it, so the result is the same as checking after every token.
  Steps 2-4 are a `decode_batch.DecodeBatch` given every row at once; the server keeps one running and admits
  new rows between chunks (continuous batching).

Vision ids (`trajectory.VISION_IDS`: `<|image_pad|>`, `<|vision_start|>`, `<|vision_end|>`, `<|video_pad|>`) are
never emitted: their logits are set to -inf before sampling and before greedy argmax (only the environment writes
image spans; a sampled pad would break the pad/feature count of the next context). The class attribute
`never_sampled` holds them; a subclass may add ids (bench/sampler_speed.py adds the end-of-sequence ids to decode
full-length rows, as transformers' `min_new_tokens` does).

A model with a compact vocabulary (`TextConfig.vocab_ids`) samples over its rows: the banned ids become their rows
(an id outside the vocabulary cannot be drawn anyway), the drawn rows become Qwen ids on device, and the log-probs
are of the distribution over the rows. A context id outside it (a tool's text) is read as `<|endoftext|>`, the
vocabulary's unknown-token stand-in, as the update reads it (`train.policy.mask_out_of_vocabulary`).

Log-probabilities: `Generation.logprobs[k]` is log softmax(logits / temperature)[id_k] (temperature 1 when
greedy): the distribution the id was drawn from, before top-p and with the vision ids not masked. This is what
the trainer recomputes at the rollout temperature (`policy.loss_logprobs(..., grpo.temperature)`, π_old and π_θ
alike, as verl does) and what SGLang 0.5.23 returns by default, so the two can be compared directly.

Sampling parameters are validated on construction and on assignment (`temperature`, `top_p` are properties):
a ValueError names the parameter.
"""

import math
import numbers
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import decode_batch
from osvl_jax.rollout.embedded import layout as layout_lib
from osvl_jax.rollout.embedded import prefill_inputs
from osvl_jax.rollout.embedded import prefix_cache as prefix_cache_lib
from osvl_jax.rollout.embedded import sampling

_STOP_CHUNK = decode_batch.STOP_CHUNK  # decode steps per device call at most, with stop strings.


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

  Compiled programs are keyed by (padded batch, prompt (suffix) bucket, cache length, patch bucket, greedy/top-p
  flags, `never_sampled`, decode steps per call), never by the images' grids nor by cached prefix lengths (runtime
  arrays: `prefill_inputs.vision_arrays`);
  weights are an argument, so `set_model` after a training step does not recompile.

  Attributes:
    weight_version: the version of the current weights (a str, set with them by `rollout.weight_publish`), reported
      on every `Generation`; None = unknown.
    never_sampled: ids never drawn nor argmaxed (`sampling.NEVER_SAMPLED`, the vision ids); a subclass may add
      ids (bench/sampler_speed.py adds the end-of-sequence ids, as transformers' `min_new_tokens` does).
    prefix_cache: the `prefix_cache.PrefixCache`, or None (`prefix_cache_slots=0`).
    cached_tokens: per context of the last `generate`, the prompt ids whose KV came from the prefix cache.
  """
  weight_version: str | None = None
  weight_updates = 'in_process'   # `set_model` (weight_publish.WeightPublisher)
  never_sampled: tuple[int, ...] = sampling.NEVER_SAMPLED

  def __init__(self, model, tokenizer, image_processor=None, max_new_tokens: int = 512,
               temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, max_len: int = 8192,
               bucket: int = 128, stop: Sequence[str] = (), cache_dtype: Any = None,
               pad_batch_pow2: bool = True, progress: bool = False, decode_steps: int = 64,
               prefix_cache_slots: int = 0, patch_bucket: int = 256, mesh=None):
    """Args:
      model: a `Qwen3VLModel` (nnx.Module) with `__call__`, `logits`, `init_cache` (`models/qwen3_vl/model.py`).
      tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer()`), for `Generation.text` and stop strings.
      image_processor: optional `trajectory.ImageProcessor`, used only for images given as raw uint8 [H, W, 3]
        arrays instead of `ImageRef`s.
      max_new_tokens: default cap on emitted ids per row, an integer >= 1.
      temperature: sampling temperature, finite and >= 0; 0 means greedy (argmax).
      top_p: nucleus sampling mass in (0, 1] (1: no nucleus cut).
      seed: integer PRNG seed; each `generate` call advances the sampler's key.
      max_len: cap on prompt + emitted ids per row, an integer >= 1 (rows whose prompt already fills it emit
        nothing).
      bucket: prompt (suffix) lengths and cache lengths are padded on `prefill_inputs.length_rung`'s ladder (this
        x 2^k up to 4 x this, then its steps, capped at max_len rounded up to it), an integer >= 1.
      stop: default stop strings, non-empty (besides `<|im_end|>` and `<|endoftext|>`, which always stop).
      cache_dtype: KV-cache dtype (None: the model's default in `init_cache`).
      pad_batch_pow2: pad the batch to a power of two with dummy rows (fewer recompiles as episodes finish).
      progress: show a tqdm bar over decode steps.
      decode_steps: decode steps per device call (one host sync each; SGLang's `num_continuous_decode_steps`),
        an integer >= 1; a call ends early once every row is done. With stop strings at most `_STOP_CHUNK` (8):
        they are checked on the host after each call.
      prefix_cache_slots: keep the KV of this many earlier rows (`prefix_cache.PrefixCache`, slots of max_len
        tokens) and prefill only what follows a row's longest cached prefix; 0 (default): no cache.
      patch_bucket: a prefill's image patches are padded to this times a power of two
        (`prefill_inputs.patch_slots`), an integer >= 1 and a multiple of the tower's spatial_merge_size**2 (4).
      mesh: the rollout `Mesh` (`layout.mesh_from_config(rollout.mesh)`: replicas on 'data', tensor-parallel on
        'tensor'), or None (one device). With a mesh, weights are resharded to the rollout layout on `set_model`,
        the KV cache is created sharded (batch over 'data', KV heads over 'tensor') and the batch is padded to a
        multiple of the replicas (`layout.Layout`).
    Raises:
      ValueError: naming the parameter, for any value outside the ranges above (e.g. top_p=0, a negative or NaN
        temperature, max_new_tokens=0, a bare string as `stop`); naming rollout.mesh.tensor, for KV heads the
        tensor axis does not divide.
    """
    self.layout = layout_lib.Layout(mesh) if mesh is not None else None
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
    self.patch_bucket = _check_int('patch_bucket', patch_bucket, 1)
    self._key = jax.random.key(_check_int('seed', seed, 0))
    slots = _check_int('prefix_cache_slots', prefix_cache_slots, 0)
    self.prefix_cache = (prefix_cache_lib.PrefixCache(slots, prefill_inputs.round_up(self.max_len, self.bucket),
                                                      self.layout) if slots else None)
    # Compiled programs by (kind, budgets); emptied when set_model brings a model of another structure.
    self._graphdef, self._jit_cache = None, {}
    self.set_model(model)
    merge2 = self.vision_config.spatial_merge_size ** 2 if self.vision_config is not None else 1
    if self.patch_bucket % merge2:
      raise ValueError(f'patch_bucket={patch_bucket} is not a multiple of spatial_merge_size**2={merge2}')
    self.stats: dict[str, float] = {}
    self.cached_tokens: list[int] = []   # per context of the last `generate`: prompt ids reused from the cache

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

  def set_model(self, model, weight_version: str | None = None) -> None:
    """Uses `model`'s current weights from now on (same architecture: compiled programs are reused), reported as
    `weight_version` (None: the version is unchanged).

    The sampler keeps a snapshot (`nnx.clone`: new Variables over the same immutable arrays, nothing copied), so a
    trainer's later in-place update of `model` (e.g. while a rollout runs, `grpo.max_staleness` 1) does not reach
    it until the next `set_model`. Empties the prefix cache (its KV came from the old weights).
    """
    if self.layout is not None:
      self.layout.check_model(model)
    model = nnx.clone(model)
    graphdef, state = nnx.split(model)
    if self.layout is not None:   # one device_put to the rollout layout; the trainer keeps its own arrays
      state = self.layout.place_state(state)
    if self._graphdef is not None and graphdef != self._graphdef:
      self._jit_cache = {}
    self._graphdef, self._state = graphdef, state
    self._model = model
    if self.prefix_cache is not None:
      self.prefix_cache.clear()
    if weight_version is not None:
      self.weight_version = str(weight_version)

  def reseed(self, seed: int) -> None:
    """Restarts the sampler's PRNG stream from `seed` (e.g. one seed per training step, for resumable runs).

    Raises:
      ValueError: when `seed` is not an integer >= 0.
    """
    self._key = jax.random.key(_check_int('seed', seed, 0))

  # -------------------------------------------------------------------------------------------------------------
  # Compiled pieces.
  # -------------------------------------------------------------------------------------------------------------

  @property
  def batch_multiple(self) -> int:
    """Batches are padded to a multiple of this (the rollout replicas; 1 without a mesh)."""
    return 1 if self.layout is None else self.layout.batch_multiple

  def _jit(self, fn, donate: int):
    """jax.jit(fn), run under the rollout mesh when there is one (`layout.Layout.call`)."""
    compiled = jax.jit(fn, donate_argnums=(donate,))
    return compiled if self.layout is None else self.layout.call(compiled)

  def _pin(self, cache: dict) -> dict:
    """The cache pinned to the rollout layout inside a program (unchanged without a mesh)."""
    return cache if self.layout is None else self.layout.constrain_cache(cache)

  def _init_cache(self, batch: int, cache_len: int):
    """An empty KV cache {'k','v': [L, B, Hkv, cache_len, D], 'mask': bool [B, cache_len]}, sharded on a mesh."""
    if self.layout is not None:
      return self.layout.init_cache(self._model, batch, cache_len, self.cache_dtype)
    if self.cache_dtype is None:
      return self._model.init_cache(batch, cache_len)
    return self._model.init_cache(batch, cache_len, self.cache_dtype)

  def _banned_rows(self) -> tuple[int, ...]:
    """The logit rows of `never_sampled` (themselves without a compact vocabulary; an id outside the compact one
    has no row to ban)."""
    vocab = getattr(getattr(getattr(self._model, 'config', None), 'text', None), 'vocab_ids', None)
    if vocab is None:
      return self.never_sampled
    vocab = np.asarray(vocab)
    return tuple(int(r) for r in np.searchsorted(vocab, [i for i in self.never_sampled if i in vocab]))

  def _prefill_fn(self, greedy: bool, use_top_p: bool):
    """jit(state, ids [B,T], pos [3,B,T], mask [B,T], vision, last [B], start [B], cache, key, temp, top_p): row b's
    T ids are written at cache slots start[b].. (after its cached prefix). `vision` is None (no images) or
    `prefill_inputs.vision_arrays`' dict (pixel_values [1, P, D] and the geometry arrays): a pytree of arrays, so
    the program is keyed by its shapes (the patch bucket), never by the images' grids."""
    key = ('prefill', greedy, use_top_p, self.never_sampled)
    if key not in self._jit_cache:
      graphdef, banned = self._graphdef, self._banned_rows()

      def prefill(state, input_ids, position_ids, attention_mask, vision, last, start, cache, rng, temperature,
                  top_p):
        model = nnx.merge(graphdef, state)
        pixels, layout = (None, None) if vision is None else (vision['pixel_values'], vision['vision_inputs'])
        hidden, cache = model(input_ids, position_ids, attention_mask, pixels, None, cache=self._pin(cache),
                              cache_index=start, vision_inputs=layout)
        hidden_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)  # [B, 1, H]
        logits = model.logits(hidden_last)[:, 0]
        ids, logprobs = sampling.sample_logits(logits, rng, temperature, top_p, greedy, use_top_p, banned)
        return model.rows_to_ids(ids), logprobs, self._pin(cache)

      self._jit_cache[key] = self._jit(prefill, 7)
    return self._jit_cache[key]

  def _decode_fn(self, greedy: bool, use_top_p: bool, chunk: int, until_first_done: bool = False):
    """jit(state, cache, carry, limits [B], key, offset, temp, top_p) -> (ids [B, chunk], logprobs [B, chunk], carry,
    cache).

    Up to `chunk` decode steps on device (`jax.lax.while_loop`, leaving early once every row is done, or with
    `until_first_done` once a row running at the call's start is done: the server returns it at once), so the host
    syncs once per chunk, not per token. carry = (tokens [B] (each row's last id, fed next), positions [B],
    cache_index [B], emitted [B] (ids so far), done bool [B]). Step k feeds the active rows' last ids, draws with
    `fold_in(key, offset + k)` (`key` is one per `generate`, `offset` the decode steps already run: the samples do
    not depend on the chunk size or on stop strings), and writes row b's draw at column k while b is active: the ids a row emits in this chunk
    are the first `emitted_after - emitted_before` columns. A row becomes done on device at an end-of-sequence id
    or when `emitted` reaches `limits`; a done row keeps rewriting its own next slot (harmless, never read).
    """
    key = ('decode', greedy, use_top_p, self.never_sampled, chunk, until_first_done)
    if key not in self._jit_cache:
      graphdef, banned = self._graphdef, self._banned_rows()
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
          ids = model.rows_to_ids(ids)
          active = ~done
          step_ = active.astype(jnp.int32)
          emitted = emitted + step_
          done = done | (active & (jnp.isin(ids, eos) | (emitted >= limits)))
          carry = (jnp.where(active, ids, tokens), positions + step_, cache_index + step_, emitted, done)
          return k + 1, carry, cache, out_ids.at[:, k].set(ids), out_lp.at[:, k].set(logprobs)

        loop = (jnp.int32(0), carry, self._pin(cache), jnp.zeros((batch, chunk), jnp.int32),
                jnp.zeros((batch, chunk), jnp.float32))
        done0 = carry[4]
        _, carry, cache, out_ids, out_lp = jax.lax.while_loop(
            lambda loop: ((loop[0] < chunk) & ~jnp.all(loop[1][4])
                          & ~(until_first_done & jnp.any(loop[1][4] & ~done0))), step, loop)
        return out_ids, out_lp, carry, self._pin(cache)

      self._jit_cache[key] = self._jit(decode, 1)
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

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    """Samples one assistant turn per context (see `engine.Engine.generate`).

    Args:
      contexts: B `(prompt_ids int32 [T_b], images list[ImageRef])`.
      max_new_tokens: cap per row, an integer >= 1 (default: the sampler's).
      stop: non-empty stop strings (default: the sampler's); `<|im_end|>` and `<|endoftext|>` always stop.
      sampling: temperature and top_p of this call (`engine.Sampling`; None: the sampler's).
    Returns:
      B `Generation`s; `logprobs` are log-probabilities of the emitted ids at the sampling temperature (module docstring).
    Raises:
      ValueError: naming the parameter, for an invalid `max_new_tokens` or `stop`; for a context whose
        `<|image_pad|>` count does not match its images; naming the context and the id, for an id outside a
        compact vocabulary (`config.check_ids`; the agent loop's queue retries the batch row by row, so it ends
        that trajectory only, with an engine error).
    """
    contexts = [engine_lib.as_context(c) for c in contexts]
    contexts = [engine_lib.Context(c.prompt_ids, self._image_refs(c.images)) for c in contexts]
    max_new = self.max_new_tokens if max_new_tokens is None else _check_int('max_new_tokens', max_new_tokens, 1)
    stop = self.stop if stop is None else _check_stop('stop', stop)
    sampling = None if sampling is None else engine_lib.Sampling(*sampling).checked()
    prefill_inputs.check_image_pads(contexts, self._rope_kw().get('image_token_id', prefill_inputs.IMAGE_PAD_ID))
    config = getattr(self._model, 'config', None)
    if getattr(getattr(config, 'text', None), 'vocab_ids', None) is not None:   # module docstring
      contexts = [c._replace(prompt_ids=config_lib.read_unknown_as_endoftext(config, c.prompt_ids))
                  for c in contexts]
    results: list[engine_lib.Generation | None] = [None] * len(contexts)
    self.cached_tokens = [0] * len(contexts)

    # Rows that cannot emit anything (no budget) are answered without running the model.
    live = []
    for i, c in enumerate(contexts):
      if min(max_new, self.max_len - len(c.prompt_ids)) <= 0 or len(c.prompt_ids) == 0:
        results[i] = engine_lib.Generation(np.zeros(0, np.int32), np.zeros(0, np.float32), '',
                                           engine_lib.FINISH_LENGTH)
      else:
        live.append(i)
    if live:
      gens, cached = self._generate_batch([contexts[i] for i in live], max_new, stop, sampling)
      for i, gen, c in zip(live, gens, cached):
        results[i], self.cached_tokens[i] = gen, c
    return results

  @property
  def vision_config(self):
    """The vision tower's `VisionConfig` (None for a model without one: images are then refused)."""
    return getattr(getattr(self._model, 'config', None), 'vision', None)

  def _rope_kw(self) -> dict:
    config = getattr(self._model, 'config', None)
    if config is None:
      return {}
    return {'image_token_id': config.image_token_id, 'spatial_merge_size': config.vision.spatial_merge_size}

  def _generate_batch(self, contexts: list, max_new: int, stop: tuple,
                      sampling: engine_lib.Sampling | None) -> tuple[list, list]:
    """(Generations, cached prefix length per row) of n live contexts, all run in one `decode_batch.DecodeBatch`."""
    batch = decode_batch.DecodeBatch(self, stop, sampling=sampling)
    n = len(contexts)
    limits = [min(max_new, self.max_len - len(c.prompt_ids)) for c in contexts]   # emitted ids per row
    results: list = [None] * n
    for b, gen, cached in batch.admit(contexts, limits, range(n)):
      results[b] = (gen, cached)
    bar = None
    if self.progress:
      import tqdm  # pylint: disable=g-import-not-at-top
      bar = tqdm.tqdm(total=max(limits), desc='decode', leave=False)
    while batch.live:
      steps = batch.stats['decode_steps']
      for b, gen, cached in batch.step():
        results[b] = (gen, cached)
      if bar is not None:
        bar.update(batch.stats['decode_steps'] - steps)
    if bar is not None:
      bar.close()
    st = self.stats = dict(batch.stats)
    st['decode_tokens_per_s'] = st['emitted_tokens'] / max(st['decode_s'], 1e-9)
    return [g for g, _ in results], [c for _, c in results]

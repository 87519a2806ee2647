"""A running decode batch of the embedded sampler: rows enter at chunk boundaries and leave as they finish.

`JaxSampler.generate` admits all its rows at once and steps until every row is done; the server
(`osvl_jax.serve.service.SamplerService`) keeps a batch running and, between two chunks of `chunk` decode steps,
returns the rows that finished and admits the rows that arrived meanwhile (a simple form of continuous batching): a
short request does not wait for a long one.

Shapes stay fixed while the batch runs: its KV cache is [L, B, Hkv, C, D] with B slots (a power of two, and a
multiple of the replicas on a rollout mesh: `JaxSampler.batch_multiple`) and C
cache slots (`prefill_inputs.length_rung`: the sampler's bucket x 2^k, then steps of 4 buckets), both from the rows'
budgets (prompt + max_new_tokens, capped at max_len), so a chunk compiles once per (B, C). An admission prefills
the new rows as a sub-batch of the same cache length (`JaxSampler._prefill_fn`, after their prefix-cache match)
and scatters them into free slots; when there are too few slots or C is too short, the batch grows (the cache is
padded: rows keep their slots and KV). A row's positions, cache index and limit are its own, so its ids do not
depend on what runs beside it.

Stopping: on device at an end-of-sequence id or the row's limit; on the host, after each chunk, at a stop string
(`finish_reason`) or one of the row's extra stop ids, cut exactly at the completing id.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from osvl_jax.models.qwen3_vl import vision_layout
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import prefill_inputs
from osvl_jax.rollout.embedded import prefix_cache as prefix_cache_lib

STOP_TAIL = 64  # stop strings are searched in the text of a row's last this-many ids.
STOP_CHUNK = 8  # decode steps per device call at most, with stop strings (a stopped row decodes <= 7 ids more).


def next_pow2(n: int) -> int:
  """The smallest power of two >= max(n, 1)."""
  return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _round_up(n: int, multiple: int) -> int:
  """The smallest multiple of `multiple` >= n."""
  return -(-int(n) // multiple) * multiple


def finish_reason(tokenizer, ids: list, logprobs: list, start: int, limit: int, stop: tuple,
                  stop_ids: frozenset = frozenset()) -> str | None:
  """Finish reason of a row whose ids[start:] are new, or None while it runs (ids / logprobs cut in place).

  The first new id that completes a stop string (searched in the text of the last `STOP_TAIL` ids up to it) ends
  the row there, and the ids after it (decoded in the same chunk) are dropped; then the first new id in `stop_ids`
  (a request's extra stop ids) ends it with 'stop'; an end-of-sequence id ends it with 'stop' (it is always the
  last id: the device stops a row there); then the length limit. The same decisions, in the same order, as
  checking after every token.
  """
  reason = None
  if stop and any(s in tokenizer.decode(ids[max(0, start + 1 - STOP_TAIL):]) for s in stop):
    for k in range(start, len(ids)):   # the chunk's text holds a stop string: find the id that completes it
      if ids[k] not in engine_lib.EOS_IDS and any(
          s in tokenizer.decode(ids[max(0, k + 1 - STOP_TAIL):k + 1]) for s in stop):
        del ids[k + 1:], logprobs[k + 1:]
        reason = engine_lib.FINISH_STOP_STRING
        break
  extra = next((k for k in range(start, len(ids)) if ids[k] in stop_ids), None)
  if extra is not None:
    del ids[extra + 1:], logprobs[extra + 1:]
    return engine_lib.FINISH_STOP
  if reason is not None:
    return reason
  if ids and ids[-1] in engine_lib.EOS_IDS:
    return engine_lib.FINISH_STOP
  if len(ids) >= limit:
    return engine_lib.FINISH_LENGTH
  return None


@dataclasses.dataclass
class _Slot:
  tag: Any
  keys: np.ndarray | None          # prefix-cache keys of the prompt (None without a prefix cache)
  matched: int                     # prefix-cache slot its prompt matched, or -1
  cached: int                      # prompt ids whose KV came from the prefix cache
  limit: int
  stop_ids: frozenset
  ids: list
  logprobs: list


@functools.partial(jax.jit, donate_argnums=(0,))
def _place(cache, carry, limits, sub_cache, sub_carry, sub_limits, dst):
  """Row i of the sub-batch into slot dst[i] of the batch (dst out of range: dropped)."""
  cache = {'k': cache['k'].at[:, dst].set(sub_cache['k'], mode='drop'),
           'v': cache['v'].at[:, dst].set(sub_cache['v'], mode='drop'),
           'mask': cache['mask'].at[dst].set(sub_cache['mask'], mode='drop')}
  carry = tuple(c.at[dst].set(s, mode='drop') for c, s in zip(carry, sub_carry))
  return cache, carry, limits.at[dst].set(sub_limits, mode='drop')


def _grow(cache, carry, limits, batch: int, cache_len: int):
  """The batch padded to `batch` slots of `cache_len` (new slots: empty, done)."""
  b, c = cache['mask'].shape
  kv = [(0, 0), (0, batch - b), (0, 0), (0, cache_len - c), (0, 0)]
  cache = {'k': jnp.pad(cache['k'], kv), 'v': jnp.pad(cache['v'], kv),
           'mask': jnp.pad(cache['mask'], [(0, batch - b), (0, cache_len - c)])}
  carry = (*(jnp.pad(x, (0, batch - b)) for x in carry[:4]), jnp.pad(carry[4], (0, batch - b), constant_values=True))
  return cache, carry, jnp.pad(limits, (0, batch - b), constant_values=1)


class _Plan(NamedTuple):
  """`DecodeBatch.plan`: an admission's host inputs and shapes."""
  lengths: np.ndarray     # int32 [n] prompt ids per row
  prefix: np.ndarray      # int32 [n] ids per row reused from the prefix cache
  matched: np.ndarray     # int32 [n] their prefix-cache slots (-1: none)
  keys: list              # prefix-cache keys per row (None without a prefix cache)
  sub: int                # rows of the prefill (padded)
  suffix_len: int         # its ids per row (padded)
  patches: int            # its image patches (padded; 0: no image)
  cache_len: int          # the batch's cache length after the admission
  batch: int              # its slots after the admission
  dst: list               # the slots of the n rows


class DecodeBatch:
  """Rows decoding together on one `JaxSampler` with its current weights and sampling parameters (module
  docstring). Not thread-safe: one owner drives `admit` and `step`.

  Attributes:
    live: rows still decoding. capacity: slots B. stats: the sampler's `stats` layout, over the batch's life.
  """

  def __init__(self, sampler, stop: Sequence[str] = (), chunk: int | None = None, until_first_done: bool = False,
               sampling: engine_lib.Sampling | None = None):
    """Args:
      sampler: the `JaxSampler`.
      stop: stop strings of every row.
      chunk: decode steps per `step` (default: the sampler's `decode_steps`, at most `STOP_CHUNK` with stop strings).
      until_first_done: end a chunk early as soon as a row finishes (the server returns it at once).
      sampling: temperature and top_p of every row for the batch's life (None: the sampler's defaults).
    """
    self.sampler, self.stop, self.until_first_done = sampler, tuple(stop), bool(until_first_done)
    self.chunk = int(chunk or (min(sampler.decode_steps, STOP_CHUNK) if stop else sampler.decode_steps))
    self.sampling = sampling or engine_lib.Sampling(sampler.temperature, sampler.top_p)
    temperature, top_p = self.sampling
    self.greedy = temperature <= 0.0
    self.use_top_p = (not self.greedy) and top_p < 1.0
    self.temperature, self.top_p = jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p)
    self.slots: list[_Slot | None] = []
    self.cache = self.carry = self.limits = self.decode_key = None
    self.emitted = np.zeros((0,), np.int32)
    self.offset = 0
    self.scratch = False   # `rehearse`'s batch: draws no PRNG key of the sampler, stores nothing in its prefix cache
    self.stats = {'prefill_s': 0.0, 'decode_s': 0.0, 'decode_steps': 0, 'emitted_tokens': 0, 'batch': 0,
                  'prompt_pad': 0, 'cache_len': 0, 'prompt_tokens': 0, 'cached_tokens': 0}

  @property
  def live(self) -> int:
    return sum(s is not None for s in self.slots)

  @property
  def capacity(self) -> int:
    return len(self.slots)

  def plan(self, contexts: Sequence[engine_lib.Context], limits: Sequence[int],
           prefix: np.ndarray | None = None) -> _Plan:
    """What admitting `contexts` would run: their prefix-cache matches, prefill inputs and the batch's shape after
    (nothing of the batch changes). Arguments as `admit`'s; `prefix` (a scratch batch's: the prefix lengths of the
    plan it rehearses) replaces the matches."""
    s, n = self.sampler, len(contexts)
    lengths = np.asarray([len(c.prompt_ids) for c in contexts], np.int32)
    rope_kw = s._rope_kw()   # pylint: disable=protected-access
    given = prefix is not None
    prefix = np.asarray(prefix, np.int32) if given else np.zeros((n,), np.int32)
    matched, keys = np.full((n,), -1, np.int32), [None] * n
    if s.prefix_cache is not None and not given:
      image_token_id = rope_kw.get('image_token_id', prefill_inputs.IMAGE_PAD_ID)
      for b, c in enumerate(contexts):
        keys[b] = prefix_cache_lib.row_keys(c.prompt_ids, c.images, image_token_id)
        prefix[b], matched[b] = s.prefix_cache.match(keys[b])
    first = self.cache is None
    sub = (next_pow2(n) if s.pad_batch_pow2 else n) if first else next_pow2(n)
    sub = _round_up(sub, s.batch_multiple)   # a rollout mesh splits the rows over its replicas
    suffix_len = prefill_inputs.length_rung(int((lengths - prefix).max()), s.bucket, s.max_len)   # `build`'s T
    cache_len = prefill_inputs.length_rung(int(np.minimum(lengths + np.asarray(limits), s.max_len).max()), s.bucket,
                                           s.max_len)
    cache_len = max(cache_len, suffix_len, 0 if first else self.cache['mask'].shape[1])
    free = [i for i, slot in enumerate(self.slots) if slot is None]
    batch = sub if first else self.capacity
    if not first and (len(free) < n or cache_len > self.cache['mask'].shape[1]):
      batch = _round_up(max(self.capacity, next_pow2(self.capacity + max(0, n - len(free)))), s.batch_multiple)
      free += list(range(self.capacity, batch))[:max(0, n - len(free))]
    patches = prefill_inputs.suffix_patches(contexts, prefix, rope_kw.get('image_token_id',
                                                                          prefill_inputs.IMAGE_PAD_ID))
    patches = vision_layout.patch_slots(patches, s.patch_bucket) if patches else 0   # `vision_arrays`' P
    return _Plan(lengths, prefix, matched, keys, sub, suffix_len, patches, cache_len, batch,
                 free[:n] if not first else list(range(n)))

  def compiles(self, plan: _Plan) -> tuple:
    """Keys of the programs `plan`'s admission and the next `step` run (`osvl_jax.serve.compile_ahead` keeps the
    compiled ones): one per distinct program shape, beside this batch's sampling settings. The prefix cache's
    gather and store programs are not among them (a rehearsal never touches the cache's pool)."""
    flags = (self.greedy, self.use_top_p)
    cache_len = plan.cache_len
    keys = [('prefill', *flags, plan.sub, plan.suffix_len, cache_len, plan.patches),
            ('decode', *flags, self.chunk, self.until_first_done, plan.batch, cache_len)]
    if self.cache is not None:
      keys.append(('place', plan.sub, plan.batch, cache_len))
      if (plan.batch, cache_len) != tuple(self.cache['mask'].shape):
        keys.append(('grow', *self.cache['mask'].shape, plan.batch, cache_len))
    return tuple(keys)

  def rehearse(self, contexts: Sequence[engine_lib.Context], limits: Sequence[int], plan: _Plan):
    """A function that admits `contexts` as `plan` (made on this batch just before) does, into a scratch batch shaped
    as this one is now (zeros; its occupied slots done; the prefixes of `plan` as zeros, the prefix cache never
    touched; no key of the sampler's PRNG drawn), runs one chunk and returns the `compiles` keys it ran. The
    snapshot is taken here, on the batch's thread; the function may run on another one beside this batch's `admit`
    / `step` (`osvl_jax.serve.compile_ahead`). It allocates a KV cache as large as this batch's after the admission
    while it runs."""
    s = self.sampler
    shape = None if self.cache is None else tuple(self.cache['mask'].shape)
    occupied = [slot is not None for slot in self.slots]
    contexts, limits, prefix = list(contexts), list(limits), plan.prefix.copy()
    s._prefill_fn(self.greedy, self.use_top_p)   # pylint: disable=protected-access  (made here: no two jit objects)
    s._decode_fn(self.greedy, self.use_top_p, self.chunk, self.until_first_done)   # pylint: disable=protected-access

    def run() -> tuple:
      scratch = DecodeBatch(s, self.stop, self.chunk, self.until_first_done, self.sampling)
      scratch.scratch = True
      if shape is not None:
        batch, cache_len = shape
        cache = s._init_cache(batch, cache_len)   # pylint: disable=protected-access
        scratch.cache = cache if s.layout is None else s.layout.put_cache(cache)
        scratch.carry = (*(jnp.zeros((batch,), jnp.int32) for _ in range(4)), jnp.ones((batch,), bool))
        scratch.limits = jnp.ones((batch,), jnp.int32)
        scratch.slots = [_Slot(None, None, -1, 0, 1, frozenset(), [], []) if o else None for o in occupied]
        scratch.emitted = np.zeros((batch,), np.int32)
      rehearsed = scratch.plan(contexts, limits, prefix)
      keys = scratch.compiles(rehearsed)
      scratch.admit(contexts, limits, [None] * len(contexts), plan=rehearsed)
      if scratch.live:
        scratch.step()
      return keys
    return run

  def admit(self, contexts: Sequence[engine_lib.Context], limits: Sequence[int], tags: Sequence[Any],
            stop_ids: Sequence[frozenset] | None = None,
            plan: _Plan | None = None) -> list[tuple[Any, engine_lib.Generation, int]]:
    """Prefills rows into free slots (growing the batch when needed).

    Args:
      contexts: rows with >= 1 prompt id and a pad count that matches their images (checked by the caller).
      limits: ids each row may emit, >= 1 (its max_new_tokens, capped so that prompt + ids <= max_len).
      tags: returned with each row's result.
      stop_ids: per row, extra ids that end it (a request's `stop_token_ids`), or None.
      plan: `plan(contexts, limits)`, made just before (None: made here).
    Returns:
      (tag, Generation, cached prompt ids) of the rows that finished at their first id.
    """
    s, n = self.sampler, len(contexts)
    t0 = time.perf_counter()
    stop_ids = stop_ids or [frozenset()] * n
    plan = plan or self.plan(contexts, limits)
    lengths, prefix, matched, keys, sub = plan[:5]
    cache_len, rope_kw = plan.cache_len, s._rope_kw()   # pylint: disable=protected-access
    inputs = prefill_inputs.build(contexts, sub, np.concatenate([prefix, np.zeros(sub - n, np.int32)]), s.bucket,
                                  s.max_len, rope_kw)
    pad, first = sub - n, self.cache is None
    if not first and (plan.batch, cache_len) != tuple(self.cache['mask'].shape):
      batch = plan.batch
      self.cache, self.carry, self.limits = _grow(self.cache, self.carry, self.limits, batch, cache_len)
      self.slots += [None] * (batch - self.capacity)
      self.emitted = np.concatenate([self.emitted, np.zeros(batch - len(self.emitted), np.int32)])
    padded = lambda x, v: np.concatenate([np.asarray(x, np.int32), np.full(pad, v, np.int32)])
    if prefix.any() and not self.scratch:
      cache = s.prefix_cache.gather(padded(matched, -1), padded(prefix, 0), cache_len)
    else:
      cache = s._init_cache(sub, cache_len)   # pylint: disable=protected-access
    vision = prefill_inputs.vision_arrays(inputs, s.vision_config, s.patch_bucket,
                                          rope_kw.get('image_token_id', prefill_inputs.IMAGE_PAD_ID))
    prefill = s._prefill_fn(self.greedy, self.use_top_p)   # pylint: disable=protected-access
    state = s._state   # pylint: disable=protected-access
    key = jax.random.key(0) if self.scratch else s._next_key()   # pylint: disable=protected-access
    tok, lp, cache = prefill(state, inputs.input_ids, inputs.position_ids, inputs.attention_mask,
                             vision, jnp.asarray(padded(lengths - prefix - 1, 0)),
                             jnp.asarray(padded(prefix, 0)), cache, key, self.temperature, self.top_p)
    tok_np, lp_np = np.asarray(tok), np.asarray(lp)
    if self.decode_key is None:
      self.decode_key = key if self.scratch else s._next_key()   # pylint: disable=protected-access
    finished, done = [], np.ones((sub,), bool)
    dst = plan.dst
    for b in range(n):
      slot = _Slot(tags[b], keys[b], int(matched[b]), int(prefix[b]), int(limits[b]), stop_ids[b],
                   [int(tok_np[b])], [float(lp_np[b])])
      reason = finish_reason(s.tokenizer, slot.ids, slot.logprobs, 0, slot.limit, self.stop, slot.stop_ids)
      if first:
        self.slots.append(slot)
      else:
        self.slots[dst[b]] = slot
      if reason is None:
        done[b] = False
      else:
        finished.append((dst[b], reason))
    sub_carry = (tok, jnp.asarray(padded(lengths + inputs.deltas[:n], 0)), jnp.asarray(padded(lengths, 0)),
                 jnp.ones((sub,), jnp.int32), jnp.asarray(done))   # last id at its cache index, position + delta
    sub_limits = jnp.asarray(padded(limits, 1))
    if first:
      self.slots += [None] * pad
      self.cache, self.carry, self.limits = cache, sub_carry, sub_limits
      self.emitted = np.ones((sub,), np.int32)
    else:
      target = jnp.asarray(dst + [self.capacity] * pad, jnp.int32)
      self.cache, self.carry, self.limits = _place(self.cache, self.carry, self.limits, cache, sub_carry,
                                                   sub_limits, target)
      self.emitted[dst] = 1
    if s.layout is not None:   # placed / grown caches back on the rollout layout (no copy where they are)
      self.cache = s.layout.put_cache(self.cache)
    st = self.stats
    st['prefill_s'] += time.perf_counter() - t0
    st['batch'], st['cache_len'] = self.capacity, int(self.cache['mask'].shape[1])
    st['prompt_pad'] = max(st['prompt_pad'], int(inputs.input_ids.shape[1]))
    st['prompt_tokens'] += int(lengths.sum())
    st['cached_tokens'] += int(prefix.sum())
    return self._release(finished)

  def step(self) -> list[tuple[Any, engine_lib.Generation, int]]:
    """Runs one chunk of decode steps on the live rows; returns (tag, Generation, cached prompt ids) of those that
    finished."""
    s = self.sampler
    t0 = time.perf_counter()
    decode = s._decode_fn(self.greedy, self.use_top_p, self.chunk, self.until_first_done)  # pylint: disable=W0212
    state = s._state   # pylint: disable=protected-access
    ids, lps, carry, self.cache = decode(state, self.cache, self.carry, self.limits, self.decode_key,
                                         jnp.int32(self.offset), self.temperature, self.top_p)
    ids, lps, now = np.asarray(ids), np.asarray(lps), np.array(carry[3])   # a writable copy
    new = now - self.emitted
    self.offset += int(new.max())   # the steps this chunk ran (a row active throughout emitted one each)
    self.stats['decode_steps'] += int(new.max())
    finished = []
    for b in np.flatnonzero(new):
      slot = self.slots[b]
      if slot is None:
        continue
      start = len(slot.ids)
      slot.ids.extend(ids[b, :new[b]].tolist())
      slot.logprobs.extend(lps[b, :new[b]].tolist())
      reason = finish_reason(s.tokenizer, slot.ids, slot.logprobs, start, slot.limit, self.stop, slot.stop_ids)
      if reason is not None:
        finished.append((int(b), reason))
    self.emitted = now
    done = np.asarray(carry[4]).copy()
    done[[b for b, _ in finished]] = True       # rows cut on the host stop on device too
    self.carry = (*carry[:4], jnp.asarray(done))
    self.stats['decode_s'] += time.perf_counter() - t0
    return self._release(finished)

  def _release(self, finished: list[tuple[int, str]]) -> list[tuple[Any, engine_lib.Generation, int]]:
    """Stores the finished rows' KV in the prefix cache, frees their slots and returns their results."""
    s = self.sampler
    if s.prefix_cache is not None and finished and not self.scratch:   # valid KV: prompt + emitted ids but the last (never fed)
      s.prefix_cache.store(self.cache, [(b, np.concatenate([self.slots[b].keys,
                                                            np.asarray(self.slots[b].ids[:-1], np.int64)]),
                                         self.slots[b].matched) for b, _ in finished])
    out = []
    for b, reason in finished:
      slot, self.slots[b] = self.slots[b], None
      self.stats['emitted_tokens'] += len(slot.ids)
      out.append((slot.tag, engine_lib.Generation(
          ids=np.asarray(slot.ids, np.int32), logprobs=np.asarray(slot.logprobs, np.float32),
          text=engine_lib.decode_text(s.tokenizer, slot.ids), finish_reason=reason,
          weight_version=s.weight_version), slot.cached))
    return out

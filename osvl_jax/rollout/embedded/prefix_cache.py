"""Prefix cache of the embedded sampler: the KV of earlier rows, kept on device and reused by later rows that start
with the same tokens and images (the idea of SGLang's RadixAttention, as a flat LRU pool of slots).

Every turn of an agent episode re-sends the whole context; with the cache, `JaxSampler` prefills only the part
after the longest prefix some earlier row already computed.

  - Pool: k, v [L, N, Hkv, S, D] on device (N = `slots`, S = the sampler's max_len rounded up to its bucket), in
    the batch cache's dtype, allocated at the first store: N * 2 * L * Hkv * S * D values in all. On the host,
    each slot's valid length and key sequence (int64 [S]), and its last use (LRU).
  - Keys: a row's token ids with each `<|image_pad|>` replaced by its image's key, a negative int64 derived from
    the image's content (blake2b of grid_thw and pixel_values, `image_key`): two contexts with the same ids but
    different images differ at the image's first pad.
  - Match (`match`): the longest common prefix of the row's keys with any slot's valid keys, cut back to the start
    of an image run if it ends inside one (no partial image: the vision tower sees whole images), at most
    len(prompt) - 1 (one token is always prefilled, for the first logits). Exact: KV at a position depends only on
    the prefix up to it (causal attention; MRoPE positions of a prefix do not depend on what follows).
  - Reuse (`gather`): one jitted gather `pool[:, slots, :, :cache_len]` per (batch, cache_len) shapes; the cache
    mask is True on slots < prefix length. Prefix lengths are runtime arrays: no compile per prefix length.
  - Store (`store`): after the batch, row b's valid KV (prompt + emitted ids but the last, which is never fed; ids
    after a stop-string cut were fed but do not count) goes into a slot: none when a slot already holds it, else
    the slot it extends when its match covered that whole slot, else the least recently used one. One jitted
    scatter into the donated pool per (batch, cache_len).

The KV depends on the weights: `JaxSampler.set_model` calls `clear`.

On a rollout mesh (`layout.Layout`) the pool's KV heads are split over 'tensor' (its slots are whole on every
replica), and a gathered batch cache comes out in the batch cache's layout (batch over 'data').
"""

import hashlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_EMPTY = np.iinfo(np.int64).min  # key of a position past a slot's valid length: equals no token or image key


def image_key(image: Any) -> int:
  """A negative int (> -2**56) identifying an image's content: blake2b of its grid_thw and pixel_values bytes."""
  h = hashlib.blake2b(digest_size=7)
  h.update(np.asarray(image.grid_thw, np.int64).reshape(3).tobytes())
  h.update(np.ascontiguousarray(image.pixel_values, np.float32).tobytes())
  return -1 - int.from_bytes(h.digest(), 'little')


def row_keys(prompt_ids: np.ndarray, images: Sequence[Any], image_token_id: int) -> np.ndarray:
  """int64 [T]: prompt_ids with image k's `num_tokens` pads replaced by `image_key(images[k])`.

  The caller checked the pad count (`prefill_inputs.check_image_pads`).
  """
  keys = np.asarray(prompt_ids, np.int64).copy()
  if images:
    pads = np.flatnonzero(keys == image_token_id)
    keys[pads] = np.repeat([image_key(im) for im in images], [im.num_tokens for im in images])
  return keys


def _common_prefix(rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
  """int [N]: length of the common prefix of each rows[i] (int64 [N, >= T]) with keys (int64 [T])."""
  eq = rows[:, :len(keys)] == keys[None]
  return np.where(eq.all(1), len(keys), eq.argmin(1))


class PrefixCache:
  """An LRU pool of `slots` KV sequences of up to `max_len` tokens (module docstring). Not thread-safe: one owner
  (the sampler, driven by one thread)."""

  def __init__(self, slots: int, max_len: int, layout=None):
    """Args: slots: pool size N >= 1; max_len: tokens per slot S (>= every batch's cache length); layout: the
    sampler's `layout.Layout` on a rollout mesh, or None (one device).

    Raises:
      ValueError: naming `slots` or `max_len` when < 1.
    """
    for name, value in (('slots', slots), ('max_len', max_len)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
    self.slots, self.max_len = slots, max_len
    self.keys = np.full((slots, max_len), _EMPTY, np.int64)
    self.lengths = np.zeros((slots,), np.int64)      # valid tokens per slot (0: free)
    self.last_used = np.zeros((slots,), np.int64)    # LRU clock of each slot's last match or store
    self._clock = 0
    self.pool: dict | None = None                    # {'k', 'v'}: [L, N, Hkv, S, D], at the first store
    self._pool_sharding = None
    if layout is None:
      self._gather = jax.jit(self._gather_impl, static_argnums=(4,))
      self._write = jax.jit(self._write_impl, donate_argnums=(0, 1))
    else:   # pool [L, N, Hkv, S, D]: heads over 'tensor'; gathered caches in the batch cache's layout
      self._pool_sharding = jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec(
          None, None, 'tensor', None, None))
      self._gather = jax.jit(self._gather_impl, static_argnums=(4,), out_shardings=layout.cache_shardings())
      self._write = jax.jit(self._write_impl, donate_argnums=(0, 1),
                            out_shardings=(self._pool_sharding, self._pool_sharding))

  def clear(self) -> None:
    """Forgets every slot (the device pool stays allocated; its contents are never read again)."""
    self.keys.fill(_EMPTY)
    self.lengths.fill(0)
    self.last_used.fill(0)

  @property
  def used_slots(self) -> int:
    return int((self.lengths > 0).sum())

  def _touch(self, slot: int) -> None:
    self._clock += 1
    self.last_used[slot] = self._clock

  def match(self, keys: np.ndarray) -> tuple[int, int]:
    """(prefix length, slot) of the longest reusable prefix of a row with keys int64 [T], or (0, -1).

    The prefix is at most T - 1 and never ends inside an image run (it is cut back to the run's start).
    """
    if len(keys) < 2 or not self.lengths.any():
      return 0, -1
    common = _common_prefix(self.keys, keys[:self.max_len])   # free slots hold `_EMPTY` keys: 0
    slot = int(np.argmax(common))
    m = min(int(common[slot]), len(keys) - 1)
    while m > 0 and keys[m - 1] < 0 and keys[m] == keys[m - 1]:   # inside an image run: back to its start
      m -= 1
    if m == 0:
      return 0, -1
    self._touch(slot)
    return m, slot

  @staticmethod
  def _gather_impl(pool_k, pool_v, slots, prefix, cache_len: int) -> dict:
    mask = jnp.arange(cache_len)[None, :] < prefix[:, None]
    return {'k': pool_k[:, slots, :, :cache_len], 'v': pool_v[:, slots, :, :cache_len], 'mask': mask}

  def gather(self, slots: np.ndarray, prefix: np.ndarray, cache_len: int) -> dict:
    """A batch KV cache {'k','v': [L, B, Hkv, cache_len, D], 'mask': bool [B, cache_len]} holding row b's prefix
    (prefix[b] tokens of slot slots[b]; rows with prefix 0 get an all-False mask).

    Raises:
      ValueError: nothing stored yet, or cache_len > max_len.
    """
    if self.pool is None or cache_len > self.max_len:
      raise ValueError(f'cannot gather {cache_len} slots from a pool of {self.max_len} (allocated: '
                       f'{self.pool is not None})')
    slots = jnp.asarray(np.maximum(slots, 0), jnp.int32)
    return self._gather(self.pool['k'], self.pool['v'], slots, jnp.asarray(prefix, jnp.int32), int(cache_len))

  @staticmethod
  def _write_impl(pool_k, pool_v, k, v, dst):
    c = k.shape[3]
    return (pool_k.at[:, dst, :, :c].set(k.astype(pool_k.dtype), mode='drop'),
            pool_v.at[:, dst, :, :c].set(v.astype(pool_v.dtype), mode='drop'))

  def store(self, cache: dict, rows: Sequence[tuple[int, np.ndarray, int]]) -> None:
    """Keeps the valid KV of batch rows (module docstring: which slot).

    Args:
      cache: the batch cache after decoding, {'k','v': [L, B, Hkv, C, D], ...}, C <= max_len.
      rows: (batch row b, keys int64 [V] of its valid KV (V <= C), the slot its prompt matched or -1).
    """
    k, v = cache['k'], cache['v']
    batch, cache_len = k.shape[1], k.shape[3]
    shape = (k.shape[0], self.slots, k.shape[2], self.max_len, k.shape[4])
    if self.pool is None or self.pool['k'].shape != shape or self.pool['k'].dtype != k.dtype:
      self.clear()   # a new layout: nothing stored so far can be read from the new pool
      # on a mesh created sharded, never whole on one device
      self.pool = {n: jnp.zeros(shape, k.dtype, device=self._pool_sharding) for n in ('k', 'v')}
      rows = [(b, keys, -1) for b, keys, _ in rows]
    claimed, todo = set(), []
    for b, keys, matched in rows:
      if len(keys) == 0 or len(keys) > min(cache_len, self.max_len):
        continue
      if matched >= 0:
        common = int(_common_prefix(self.keys[matched:matched + 1], keys)[0])
        if common == len(keys):            # the slot already holds all of it
          self._touch(matched)
          continue
        if common == self.lengths[matched] and matched not in claimed:   # it extends the whole slot
          claimed.add(matched)
          todo.append((b, keys, matched))
          continue
      todo.append((b, keys, -1))
    free = [int(s) for s in np.argsort(self.last_used, kind='stable') if int(s) not in claimed]
    dst = np.full((batch,), self.slots, np.int32)   # out of range: not written
    for b, keys, slot in todo:
      if slot < 0:
        if not free:
          continue
        slot = free.pop(0)
      dst[b] = slot
      self.keys[slot].fill(_EMPTY)
      self.keys[slot, :len(keys)] = keys
      self.lengths[slot] = len(keys)
      self._touch(slot)
    if (dst < self.slots).any():
      self.pool['k'], self.pool['v'] = self._write(self.pool['k'], self.pool['v'], k, v, jnp.asarray(dst))

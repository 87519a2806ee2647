"""Attention kernels for the text decoder (pure functions, GQA layout).

Shapes: q [B, T, Hkv, G, D] (G = query heads per kv head), k/v [B, S, Hkv, D]; outputs [B, T, Hkv, G, D].

* `dense_attention`: explicit bool mask [B, T, S]; materialises the [B, Hkv, G, T, S] float32 scores. Used
  with the KV cache (decode) and as the reference.
* `causal_attention`: causal + key-padding mask given as key_mask [B, T] (S = T, no cache). Static loop over
  query blocks; block i only sees keys [0, end_i), so the upper triangle is never computed and the live score
  tensor is at most [B, Hkv, G, block, T]. Same numerics as `dense_attention` with
  mask = tril & key_mask[:, None, :], including rows with no visible key (left padding), which get the uniform
  average of all S values exactly as the dense softmax over all-`finfo.min` scores does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = jnp.finfo(jnp.float32).min


def _softmax_attend(q, k, v, mask, scale):
  """q [B, t, Hkv, G, D], k/v [B, s, Hkv, D], mask bool broadcastable to [B, 1, 1, t, s] -> [B, t, Hkv, G, D]."""
  scores = jnp.einsum('btkgd,bskd->bkgts', q, k.astype(q.dtype)) * scale
  scores = jnp.where(mask, scores.astype(jnp.float32), _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bkgts,bskd->btkgd', probs, v)


def dense_attention(q, k, v, mask):
  """Reference attention with an explicit mask.

  Args:
    q: [B, T, Hkv, G, D]; k, v: [B, S, Hkv, D]; mask: bool [B, T, S] (True = may attend).

  Returns:
    [B, T, Hkv, G, D] (dtype of v).
  """
  return _softmax_attend(q, k, v, mask[:, None, None], q.shape[-1] ** -0.5)


def _attend_hm(q, k, v, mask, scale):
  """Head-major: q [B, Hkv, G, t, D], k/v [B, Hkv, s, D], mask broadcastable to [B, 1, 1, t, s] -> [B, Hkv, G, t, D]."""
  scores = jnp.einsum('bkgtd,bksd->bkgts', q, k.astype(q.dtype)) * scale
  scores = jnp.where(mask, scores.astype(jnp.float32), _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bkgts,bksd->bkgtd', probs, v)


def causal_attention(q, k, v, key_mask=None, block: int = 512, remat: bool = False):
  """Causal self-attention with key padding, computed in query blocks with causal block skipping.

  Equal (up to float32 rounding) to `dense_attention(q, k, v, tril(T, T) & key_mask[:, None, :])`.

  Args:
    q: [B, T, Hkv, G, D]; k, v: [B, T, Hkv, D].
    key_mask: bool [B, T] (True = real token; left or right padding) or None (all real).
    block: query block length (T need not be a multiple).
    remat: wrap each block in `jax.checkpoint` (recompute scores in the backward pass).

  Returns:
    [B, T, Hkv, G, D] (dtype of v).
  """
  b, t = q.shape[:2]
  scale = q.shape[-1] ** -0.5
  if key_mask is None:
    key_mask = jnp.ones((b, t), bool)
  key_mask = key_mask.astype(bool)
  attend = jax.checkpoint(_attend_hm, static_argnums=(4,)) if remat else _attend_hm
  qh = q.transpose(0, 2, 3, 1, 4)                                          # [B, Hkv, G, T, D]
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)                # [B, Hkv, T, D]
  outs = []
  for start in range(0, t, block):
    end = min(start + block, t)
    rows = jnp.arange(start, end)[:, None]
    cols = jnp.arange(end)[None, :]
    mask = (cols <= rows)[None] & key_mask[:, None, :end]                 # [B, tq, end]
    outs.append(attend(qh[:, :, :, start:end], kh[:, :, :end], vh[:, :, :end], mask[:, None, None], scale))
  out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
  out = out.transpose(0, 3, 1, 2, 4)                                       # [B, T, Hkv, G, D]
  # Rows with no visible key: dense softmax over all-masked scores is uniform over all S keys.
  any_visible = jnp.cumsum(key_mask.astype(jnp.int32), axis=1) > 0      # [B, T]
  mean_v = jnp.mean(v.astype(jnp.float32), axis=1).astype(out.dtype)     # [B, Hkv, D]
  return jnp.where(any_visible[:, :, None, None, None], out, mean_v[:, None, :, None, :])

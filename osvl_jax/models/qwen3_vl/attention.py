"""Attention kernels for the text decoder (pure functions, GQA layout).

Shapes: q [B, T, Hkv, G, D] (G = query heads per kv head), k/v [B, S, Hkv, D]; outputs [B, T, Hkv, G, D].

* `dense_attention`: explicit bool mask [B, T, S]; materialises the [B, Hkv, G, T, S] float32 scores. The
  reference.
* `cache_attention`: the same over a KV cache held head-major, k/v [B, Hkv, S, D] (prefill into a cache, decode):
  XLA:CPU then reads the cache in place instead of transposing it to (batch, head)-major for every call.
* `causal_attention`: causal + key-padding mask given as key_mask [B, T] (S = T, no cache), or causal within
  packed sequences given as int segment ids [B, T] (`segment_mask`). Static loop over query blocks with a
  FlashAttention-style custom VJP; block i only sees keys [0, end_i), so the upper triangle is never computed and
  the live score tensor is at most [B, Hkv, G, block, T]; nothing of size T x T is saved for the backward pass.
  Same numerics as `dense_attention` with mask = `segment_mask(key_mask)`, including rows with no visible key
  (left padding), which get the uniform average of all S values exactly as the dense softmax over all-`finfo.min`
  scores does.
* `fused_causal_attention`: the same causal / padding / segment masking through `jax.nn.dot_product_attention`
  (on a GPU with `implementation='cudnn'`: cuDNN's fused flash attention, which skips the upper triangle).

Packed rows (DESIGN.md §3, dynamic batch size): segment ids [B, T] int, 0 on padding and 1, 2, ... for the
sequences packed into a row (MaxText's `decoder_segment_ids`). A token of segment k > 0 attends to the earlier
tokens of segment k only; a padding token (0) attends to every earlier real token, as a bool key mask's padding
query does (its output is never read). A bool mask is the one-segment case: the same mask, the same program as
before packing.
"""

from __future__ import annotations

import functools

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


def cache_attention(q, k, v, mask):
  """`dense_attention` with head-major keys/values (the KV cache layout, `text.init_cache`).

  Args:
    q: [B, T, Hkv, G, D]; k, v: [B, Hkv, S, D]; mask: bool [B, T, S] (True = may attend).

  Returns:
    [B, T, Hkv, G, D] (dtype of v).
  """
  scores = jnp.einsum('btkgd,bksd->bkgts', q, k.astype(q.dtype)) * q.shape[-1] ** -0.5
  scores = jnp.where(mask[:, None, None], scores.astype(jnp.float32), _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bkgts,bksd->btkgd', probs, v)


def segment_mask(segments, start: int = 0, rows: int | None = None):
  """bool [B, rows, S]: query rows start..start+rows-1 may see key s <= row when the key is real (segment > 0)
  and, for a real query, of the query's own segment.

  Args:
    segments: bool [B, S] key mask (True = real: one segment) or int [B, S] segment ids (0 = padding).
    start, rows: the query rows (default all S).
  """
  rows = segments.shape[1] - start if rows is None else rows
  seg = segments.astype(jnp.int32)
  cols = jnp.arange(seg.shape[1])[None, :]
  causal = cols <= start + jnp.arange(rows)[:, None]
  query = seg[:, start:start + rows, None]                                               # [B, rows, 1]
  key = seg[:, None, :]                                                                  # [B, 1, S]
  return causal[None] & (key > 0) & ((query == key) | (query == 0))


def _block_mask(segments, start: int, rows: int):
  """bool [B, 1, 1, rows, S] (`segment_mask` of the block's query rows, broadcast over the heads)."""
  return segment_mask(segments, start, rows)[:, None, None]


def _block_scores(q, k, segments, start):
  """Masked float32 scores [B, Hkv, G, t, s] of query block q [B, Hkv, G, t, D] (pre-scaled) at rows start..,
  keys [B, Hkv, s, D] (s = start + t), segments int32 [B, >= s] (`segment_mask`)."""
  scores = jnp.einsum('bkgtd,bksd->bkgts', q, k, preferred_element_type=jnp.float32)
  return jnp.where(_block_mask(segments[:, :k.shape[2]], start, q.shape[3]), scores, _NEG)


def _flash_forward(q, k, v, key_mask, block):
  """Per query block: softmax(QK^T) V and the row log-sum-exp [B, Hkv, G, T] (the only saved statistic)."""
  outs, lses = [], []
  for start in range(0, q.shape[3], block):
    end = min(start + block, q.shape[3])
    scores = _block_scores(q[:, :, :, start:end], k[:, :, :end], key_mask, start)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum('bkgts,bksd->bkgtd', p.astype(v.dtype), v[:, :, :end], preferred_element_type=jnp.float32)
    outs.append((o / denom).astype(v.dtype))
    lses.append((m + jnp.log(denom))[..., 0])
  return jnp.concatenate(outs, axis=3), jnp.concatenate(lses, axis=3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, key_mask, block):
  return _flash_forward(q, k, v, key_mask, block)[0]


def _flash_fwd(q, k, v, key_mask, block):
  out, lse = _flash_forward(q, k, v, key_mask, block)
  return out, (q, k, v, key_mask, out, lse)


def _flash_bwd(block, residuals, d_out):
  """Recomputes each block's probabilities from the saved log-sum-exp; dS = P * (dP - rowsum(dO * O)).

  Query blocks are visited last to first: query block i touches keys [0, end_i), so once it is done the gradients
  of keys [start_i, end_i) are final; they are split off the running [0, end_i) accumulators (no scatter or pad
  into a length-T buffer, which makes XLA's simplifier loop on long sequences).
  """
  q, k, v, key_mask, out, lse = residuals
  starts = list(range(0, q.shape[3], block))
  dqs, dk_done, dv_done = [], [], []
  dk_acc = dv_acc = None
  for start in reversed(starts):
    end = min(start + block, q.shape[3])
    rows = slice(start, end)
    qb, do = q[:, :, :, rows], d_out[:, :, :, rows]
    p = jnp.exp(_block_scores(qb, k[:, :, :end], key_mask, start) - lse[:, :, :, rows, None])
    dp = jnp.einsum('bkgtd,bksd->bkgts', do, v[:, :, :end], preferred_element_type=jnp.float32)
    delta = jnp.sum(do.astype(jnp.float32) * out[:, :, :, rows].astype(jnp.float32), axis=-1, keepdims=True)
    ds = (p * (dp - delta)).astype(q.dtype)
    dqs.append(jnp.einsum('bkgts,bksd->bkgtd', ds, k[:, :, :end]))
    dk_b = jnp.einsum('bkgts,bkgtd->bksd', ds, qb, preferred_element_type=jnp.float32)            # [.., end, D]
    dv_b = jnp.einsum('bkgts,bkgtd->bksd', p.astype(do.dtype), do, preferred_element_type=jnp.float32)
    dk_acc = dk_b if dk_acc is None else dk_acc[:, :, :end] + dk_b
    dv_acc = dv_b if dv_acc is None else dv_acc[:, :, :end] + dv_b
    dk_done.append(dk_acc[:, :, start:])
    dv_done.append(dv_acc[:, :, start:])
  dq = jnp.concatenate(dqs[::-1], axis=3)
  dk = jnp.concatenate(dk_done[::-1], axis=2).astype(k.dtype)
  dv = jnp.concatenate(dv_done[::-1], axis=2).astype(v.dtype)
  return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def causal_attention(q, k, v, key_mask=None, block: int = 128):
  """Causal self-attention with key padding or packed segments, computed in query blocks with causal block
  skipping.

  Equal (up to float32 rounding) to `dense_attention(q, k, v, segment_mask(key_mask))` (for a bool key_mask:
  tril(T, T) & key_mask[:, None, :]). Forward and
  backward are blockwise (FlashAttention's recurrence, Dao et al. 2022, as a `jax.custom_vjp`): query block i only
  sees keys [0, end_i), so the upper triangle is never computed; the backward recomputes each block's
  probabilities from the saved row log-sum-exp instead of storing them, and uses
  dS = P * (dP - rowsum(dO * O)), which saves a reduction over keys.

  Args:
    q: [B, T, Hkv, G, D]; k, v: [B, T, Hkv, D].
    key_mask: bool [B, T] (True = real token; left or right padding), int [B, T] segment ids of packed rows
      (0 = padding; module docstring), or None (all real).
    block: query block length (T need not be a multiple).

  Returns:
    [B, T, Hkv, G, D] (dtype of v).

  Raises:
    ValueError: block < 1.
  """
  if block < 1:
    raise ValueError(f'causal_attention: block must be >= 1, got {block}')
  b, t = q.shape[:2]
  if key_mask is None:
    key_mask = jnp.ones((b, t), bool)
  key_mask = key_mask.astype(jnp.int32)
  qh = (q * q.shape[-1] ** -0.5).transpose(0, 2, 3, 1, 4)                  # [B, Hkv, G, T, D], pre-scaled
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)                # [B, Hkv, T, D]
  out = _flash(qh, kh, vh, key_mask, block).transpose(0, 3, 1, 2, 4)       # [B, T, Hkv, G, D]
  # Rows with no visible key: dense softmax over all-masked scores is uniform over all S keys.
  any_visible = jnp.cumsum((key_mask > 0).astype(jnp.int32), axis=1) > 0      # [B, T]
  mean_v = jnp.mean(v.astype(jnp.float32), axis=1).astype(out.dtype)     # [B, Hkv, D]
  return jnp.where(any_visible[:, :, None, None, None], out, mean_v[:, None, :, None, :])


def fused_causal_attention(q, k, v, key_mask=None, implementation: str | None = 'cudnn'):
  """Causal self-attention through `jax.nn.dot_product_attention` (cuDNN flash attention on NVIDIA GPUs).

  Equal (up to rounding) to `causal_attention(q, k, v, key_mask)` on every row that sees a key; a row that sees
  none (a leading padding token, an all-padding row: outputs never read) attends to key 0 instead of averaging
  all keys, so that no row of the fused kernel is fully masked. Without `key_mask` the kernel's own causal mask is
  the only mask (nothing of size T x T is built); with one, the bool mask `segment_mask(key_mask)` [B, 1, T, T]
  is passed to the kernel.

  Args:
    q: [B, T, Hkv, G, D]; k, v: [B, T, Hkv, D] (GQA: query head h = kv * G + g reads kv head h // G, as
      `jax.nn.dot_product_attention` groups heads).
    key_mask: None (every token real), bool [B, T] (True = real) or int [B, T] segment ids (0 = padding).
    implementation: 'cudnn' (GPU only; `jax.nn.dot_product_attention` raises elsewhere), 'xla' or None.

  Returns:
    [B, T, Hkv, G, D] (dtype of v).
  """
  b, t, hkv, g, d = q.shape
  mask = None
  if key_mask is not None:
    m = segment_mask(key_mask)                                                     # [B, T, T]
    blind = ~jnp.any(m, axis=-1, keepdims=True)
    mask = (m | (blind & (jnp.arange(t) == 0)[None, None, :]))[:, None]          # [B, 1, T, T]
  out = jax.nn.dot_product_attention(q.reshape(b, t, hkv * g, d), k.astype(q.dtype), v.astype(q.dtype),
                                     mask=mask, is_causal=True, implementation=implementation)
  return out.reshape(b, t, hkv, g, d).astype(v.dtype)

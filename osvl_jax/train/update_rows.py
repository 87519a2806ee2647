"""Rows of a collated GRPO update batch (one trajectory per row, `grpo_batch.prepare_batch`) on the host: the rows
of a part with their images (`take_rows`), micro-batches (`split_micro_batches`), mini-batches of whole groups
(`mini_batch_rows`), and packed micro-batches (`Packing`, `pack_parts`, `pack_batch`: several trajectories per row,
segment ids, per-token advantages; DESIGN.md §3's dynamic batch size). `grpo_update` runs the update over them.
"""

from typing import NamedTuple

import ml_collections
import numpy as np

from osvl_jax.models.qwen3_vl import vision_layout
from osvl_jax.train import batching
from osvl_jax.trajectory import tokens as tokens_lib


def take_rows(batch: dict, grid: tuple, rows, merge_size: int = 2,
              image_token_id: int = tokens_lib.IMAGE_PAD_ID) -> tuple[dict, tuple]:
  """The given rows of a collated batch, in the given order, each with its own images (pixel_values, grid).

  Images fill `<|image_pad|>` tokens in row-major order; an image of grid (t, h, w) has t·h·w patches and
  t·h·w / merge_size² pad tokens, so a row's patches are merge_size² × its pad-token count.

  Args:
    batch: `batching.collate` fields (+ per-row loss arrays [B, ...]) as host numpy arrays, without image_grid_thw;
      position_ids [3, B, T] (rows on axis 1), pixel_values [P, D], scalars and None kept as they are.
    grid: the batch's image grids, a tuple of (t, h, w) (`grpo_batch.prepare_batch`).
    rows: int row indices (any order, no repeats needed).
  Returns:
    (part, part grid); T and K stay the batch's, so all parts share compiled shapes.
  Raises:
    ValueError: the image tokens do not match the grids.
  """
  rows = np.asarray(rows, np.int64).reshape(-1)
  patches_per_row = merge_size ** 2 * np.sum(np.asarray(batch['input_ids']) == image_token_id, axis=1)
  row_end = np.cumsum(patches_per_row)
  image_end = np.cumsum([int(np.prod(g)) for g in grid])
  if (row_end[-1] if len(row_end) else 0) != (image_end[-1] if len(image_end) else 0):
    raise ValueError(f'{int(row_end[-1])} image patches by the pad tokens, '
                     f'{int(image_end[-1]) if len(image_end) else 0} by the grids')
  row_start = row_end - patches_per_row
  images = [i for r in rows for i in np.nonzero((image_end > row_start[r]) & (image_end <= row_end[r]))[0]]
  part = {}
  for key, value in batch.items():
    if value is None or np.ndim(value) == 0:
      part[key] = value
    elif key == 'pixel_values':
      chunks = [value[row_start[r]:row_end[r]] for r in rows if row_end[r] > row_start[r]]
      part[key] = np.concatenate(chunks) if chunks else None
    elif key == 'position_ids':
      part[key] = np.asarray(value)[:, rows]
    else:
      part[key] = np.asarray(value)[rows]
  return part, tuple(grid[i] for i in images)


def split_micro_batches(batch: dict, grid: tuple, micro_batch_size: int) -> list[tuple[dict, tuple]]:
  """Consecutive `micro_batch_size`-row parts of a batch (0 or >= B: one part), each with its images (`take_rows`).

  Raises:
    ValueError: micro_batch_size does not divide B, or the image tokens do not match the grids.
  """
  rows = batch['input_ids'].shape[0]
  size = rows if not micro_batch_size or micro_batch_size >= rows else int(micro_batch_size)
  if rows % size:
    raise ValueError(f'micro_batch_size={size} does not divide the batch of {rows} rows')
  if size == rows:
    return [(batch, grid)]
  return [take_rows(batch, grid, np.arange(lo, lo + size)) for lo in range(0, rows, size)]


def mini_batch_rows(prompt_ids, mini_batch_prompts: int) -> list[np.ndarray]:
  """Row indices of each mini-batch: groups (rows sharing a prompt_id) kept whole, `mini_batch_prompts` per part.

  Groups are taken in the order of their first row; within a mini-batch rows stay in batch order (so one
  mini-batch of everything is the batch itself). A prompt drawn twice in one batch is one group of 2G
  (`grpo_batch.prepare_batch`), so a mini-batch then holds more rows than the others.

  Args:
    prompt_ids: [B] the prompt id of each row.
    mini_batch_prompts: groups per mini-batch; 0 (or >= the number of groups) = one mini-batch of all rows.
  Returns:
    list of sorted int64 arrays, together every row exactly once.
  """
  groups: dict = {}
  for row, pid in enumerate(prompt_ids):
    groups.setdefault(pid, []).append(row)
  groups = list(groups.values())
  size = mini_batch_prompts or len(groups)
  return [np.sort(np.array(sum(groups[i:i + size], []), np.int64)) for i in range(0, len(groups), size)]


# ----------------------------------------------------------------------------------------------------------------
# Packed micro-batches (dynamic batch size, DESIGN.md §3)
# ----------------------------------------------------------------------------------------------------------------

# The loss-aligned fields of a collated update batch, [B, K] (a row's first Σ completion_mask entries are its own),
# and what pads them in a packed row; `pack_batch` concatenates the token-aligned ones itself (input_ids,
# attention_mask, position_ids) and refuses any other array field.
LOSS_FILL = {'loss_positions': 0, 'loss_targets': 0, 'completion_mask': False, 'loss_step': -1,
             'rollout_logprobs': 0.0, 'loss_mask': 0.0, 'old_logprobs': 0.0, 'ref_logprobs': 0.0, 'tis_weights': 1.0}


class Packing(NamedTuple):
  """The packed micro-batch of `grpo.pack_rows` > 0: `rows` rows of `length` tokens (the largest of
  grpo.length_buckets) and `num_loss` loss positions (grpo.max_loss_tokens, 0 = length), each row holding whole
  trajectories within `patches_per_row` image patches (0 = no limit)."""
  rows: int
  length: int
  num_loss: int
  patches_per_row: int = 0

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict, batch_shards: int = 1) -> 'Packing | None':
    """`cfg` = config.grpo; None when pack_rows is 0 / absent. patches_per_row: grpo.patches_per_shard over the
    rows of a batch shard (0 = no limit)."""
    rows = int(cfg.get('pack_rows', 0) or 0)
    if not rows:
      return None
    length = int(max(cfg.length_buckets))
    patches = int(cfg.get('patches_per_shard', 0) or 0)
    return cls(rows, length, int(cfg.get('max_loss_tokens', 0) or 0) or length,
               patches // max(rows // batch_shards, 1) if patches else 0)


def pack_batch(batch: dict, grid: tuple, rows: list[list[int]], length: int, num_loss: int,
               merge_size: int = 2) -> tuple[dict, tuple]:
  """Packs rows of a collated update batch (one trajectory per row) into rows of `length` tokens: packed row r holds
  batch rows rows[r] one after the other ([] = a padding row), as `batching.collate(rows=...)` packs trajectories.

  Token fields are concatenated (attention_mask becomes int32 segment ids j + 1, position_ids restart with each
  trajectory as they were collated), loss fields concatenated with loss_positions shifted to the row, images in
  packed order (`take_rows`); the per-trajectory advantages [B] become each loss token's (float32 [R, K]) and
  `sequence_tokens` float32 [R, K] holds Σ loss_mask of each token's trajectory (`losses.grpo_loss`: Eq. 12's
  per-trajectory means and its sequence count, the same as unpacked).

  Args:
    batch: host numpy fields of `grpo_batch.prepare_batch` (+ old_logprobs, ref_logprobs, tis_weights), no grids.
    grid: the batch's image grids (`take_rows`).
    rows: packed rows of batch row indices, each row within `length` tokens and `num_loss` loss tokens.
    length, num_loss: T and K of the packed rows.
  Returns:
    (packed host batch, its grids).
  Raises:
    ValueError: a field this function does not know how to pack (naming it), or a row over the budgets.
  """
  order = [b for row in rows for b in row]
  images, part_grid = take_rows({'input_ids': batch['input_ids'], 'pixel_values': batch.get('pixel_values')}, grid,
                                order, merge_size)   # only the images move here; the rows are copied below
  tokens = dict(zip(order, np.asarray(batch['attention_mask'])[order].astype(bool).sum(1).tolist()))
  n_loss = dict(zip(order, np.asarray(batch['completion_mask'], bool)[order].sum(1).tolist()))
  size = len(rows)
  out = {'input_ids': np.full((size, length), batching.PAD_ID, np.int32),
         'attention_mask': np.zeros((size, length), np.int32),
         'position_ids': np.zeros((3, size, length), np.int32),
         'advantages': np.zeros((size, num_loss), np.float32),
         'sequence_tokens': np.zeros((size, num_loss), np.float32)}
  for key, value in batch.items():
    if key in LOSS_FILL:
      out[key] = np.full((size, num_loss), LOSS_FILL[key], np.asarray(value).dtype)
    elif key == 'pixel_values':
      out[key] = images[key]
    elif key not in out and value is not None and np.ndim(value) > 0:
      raise ValueError(f'pack_batch: no packing rule for batch field {key!r}')
    elif key not in out:
      out[key] = value
  for r, row in enumerate(rows):
    offset, n = 0, 0
    row_tokens, row_loss = sum(tokens[b] for b in row), sum(n_loss[b] for b in row)
    if row_tokens > length or row_loss > num_loss:
      raise ValueError(f'pack_batch: rows {row} hold {row_tokens} tokens / {row_loss} loss tokens, over the budget '
                       f'of {length} / {num_loss}')
    for j, b in enumerate(row):
      t, k = tokens[b], n_loss[b]
      out['input_ids'][r, offset:offset + t] = batch['input_ids'][b, :t]
      out['attention_mask'][r, offset:offset + t] = j + 1
      out['position_ids'][:, r, offset:offset + t] = batch['position_ids'][:, b, :t]
      for key in LOSS_FILL:
        if key in batch:
          out[key][r, n:n + k] = batch[key][b, :k]
      out['loss_positions'][r, n:n + k] += offset
      out['advantages'][r, n:n + k] = batch['advantages'][b]
      out['sequence_tokens'][r, n:n + k] = np.sum(batch['loss_mask'][b])
      offset, n = offset + t, n + k
  return out, part_grid


def pack_parts(batch: dict, grid: tuple, row_indices, packing: Packing,
               merge_size: int = 2) -> list[tuple[dict, tuple, list[list[int]]]]:
  """The packed micro-batches of the given rows of a collated update batch: the rows packed first-fit decreasing
  into rows of the budget (`batching.first_fit` over their tokens, loss tokens and image patches), `packing.rows`
  rows per micro-batch (the last padded with empty rows), each packed by `pack_batch`.

  Returns:
    [(packed host batch, its grids, its rows: lists of batch row indices)], together every given row once.
  Raises:
    ValueError: a row over the budget on its own (naming the budget).
  """
  row_indices = np.asarray(row_indices, np.int64).reshape(-1)
  tokens = np.asarray(batch['attention_mask']).astype(bool).sum(1)[row_indices]
  n_loss = np.asarray(batch['completion_mask'], bool).sum(1)[row_indices]
  patches = vision_layout.row_patches(batch['input_ids'], merge_size)[row_indices]
  sizes = np.stack([tokens, n_loss, patches], axis=1)
  budget = (packing.length, packing.num_loss, packing.patches_per_row or batching.NO_LIMIT)
  over = np.any(sizes > np.asarray(budget), axis=1)
  if over.any():
    raise ValueError(f'a trajectory of {sizes[over][0].tolist()} (tokens, loss tokens, patches) is over the packed '
                     f'row budget {budget[:2]} / patches_per_row={packing.patches_per_row} (grpo.pack_rows)')
  packed = [[int(row_indices[i]) for i in row] for row in batching.first_fit(sizes, budget)]
  parts = []
  for start in range(0, len(packed), packing.rows):
    rows = packed[start:start + packing.rows]
    rows = rows + [[]] * (packing.rows - len(rows))
    part, part_grid = pack_batch(batch, grid, rows, packing.length, packing.num_loss, merge_size)
    parts.append((part, part_grid, rows))
  return parts


def unpack_loss_values(values: np.ndarray, rows: list[list[int]], n_loss: np.ndarray, out: np.ndarray) -> None:
  """Writes a packed micro-batch's loss-aligned values [R, K] back to their trajectories' rows of `out` [B, K']
  (each trajectory's first n_loss[b] entries), the inverse of `pack_batch`'s concatenation."""
  for r, row in enumerate(rows):
    n = 0
    for b in row:
      k = int(n_loss[b])
      out[b, :k] = values[r, n:n + k]
      n += k

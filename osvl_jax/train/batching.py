"""Trajectories -> padded training arrays, token-exact (no re-rendering, no re-tokenization).

The loss only needs next-token log-probs where the policy emitted a token, so besides the full sequence the
batch carries the gathered *loss positions*: position t predicts token t+1, and is kept when gen_mask[t+1] = 1.
Computing the vocabulary projection only there keeps a 152k vocabulary from dominating time and memory.

The model reads `trajectory.model_input_ids(token_ids, gen_mask)` (a vision id the policy emitted is text, as in
the rollout's contexts: it can never break the pad/feature count); the loss targets are the emitted ids themselves.
"""

from typing import NamedTuple

import numpy as np

from osvl_jax import trajectory as traj_lib
from osvl_jax.models.qwen3_vl import rope, vision_layout

PAD_ID = traj_lib.ENDOFTEXT_ID  # <|endoftext|>


def _round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def num_loss_tokens(trajectory) -> int:
  """The loss positions of a `Trajectory`: its policy-emitted tokens after the first (Σ M_gen of its row in
  `collate`'s completion_mask)."""
  return int(np.count_nonzero(np.asarray(trajectory.gen_mask, bool)[1:]))


def padded_sizes(trajectories, length_multiple: int = 256, loss_multiple: int = 64) -> tuple[int, int]:
  """(T, K) that `collate` pads `trajectories` to: the longest sequence and the most emitted tokens, rounded up."""
  length = _round_up(max(len(t.token_ids) for t in trajectories), length_multiple)
  k = _round_up(max(num_loss_tokens(t) for t in trajectories), loss_multiple)
  return length, k


class Bucket(NamedTuple):
  """One compiled shape of the SFT step: T tokens per row, K loss positions per row, P image patches per batch
  shard."""
  length: int
  num_loss: int
  patches: int


def sft_buckets(trajectories, length_buckets=(), rows_per_shard: int = 1, merge_size: int = 2,
                patches_per_shard: int = 0, length_multiple: int = 256, loss_multiple: int = 64,
                max_loss_tokens: int = 0) -> list[Bucket]:
  """The SFT run's shapes, fixed once from the config's length buckets and the dataset: one `Bucket` per configured
  T that some trajectory fits (the smallest first), whose K and P hold every trajectory of at most T tokens (the
  fixed `max_loss_tokens` (at most T), else the most loss tokens rounded up to `loss_multiple` and at most T; the
  fixed `patches_per_shard`, else the fullest row's patches times `rows_per_shard`). With both budgets set the shapes
  are the config's alone. A batch takes the smallest bucket holding its longest row (`pick_bucket`), so the run
  compiles one step per bucket, whatever its batches hold.

  Args:
    trajectories: the dataset's `Trajectory` records.
    length_buckets: increasing ints (`sft.length_buckets`); () = one bucket, the longest trajectory rounded up to
      `length_multiple` (`padded_sizes`).
    rows_per_shard: rows of one batch shard (the micro-batch's rows / the data x fsdp devices).
    merge_size: the vision tower's spatial_merge_size (P is a multiple of its square).
    patches_per_shard: a fixed P for every bucket (`sft.patches_per_shard`), or 0.
    max_loss_tokens: a fixed K (`sft.max_loss_tokens`), or 0.
  Raises:
    ValueError: no trajectories; a trajectory longer than the largest bucket, or with more loss tokens than
      `max_loss_tokens` (naming it and the budget: the data must be rebuilt with a smaller cutoff, or the budget
      raised).
  """
  if not trajectories:
    raise ValueError('sft_buckets: trajectories is empty')
  lengths = np.array([len(t.token_ids) for t in trajectories])
  buckets = [int(b) for b in length_buckets] or [_round_up(int(lengths.max()), length_multiple)]
  over = int(np.argmax(lengths))
  if lengths[over] > buckets[-1]:
    t = trajectories[over]
    raise ValueError(f'SFT trajectory {t.prompt_id!r} (sample {t.sample_index}) has {int(lengths[over])} tokens, '
                     f'over the largest length bucket {buckets[-1]} (sft.length_buckets={tuple(length_buckets)})')
  loss = np.array([num_loss_tokens(t) for t in trajectories])
  most = int(np.argmax(loss))
  if max_loss_tokens and loss[most] > max_loss_tokens:
    t = trajectories[most]
    raise ValueError(f'SFT trajectory {t.prompt_id!r} (sample {t.sample_index}) has {int(loss[most])} loss tokens, '
                     f'over sft.max_loss_tokens={max_loss_tokens}')
  patches = np.array([sum(int(np.prod(i.grid_thw)) for i in t.images) for t in trajectories])
  out = []
  for length in buckets:
    fits = lengths <= length
    if not fits.any():
      continue
    k = min(length, int(max_loss_tokens) or _round_up(int(loss[fits].max()), loss_multiple))
    fullest = int(patches[fits].max())
    p = int(patches_per_shard) or (_round_up(fullest * int(rows_per_shard), merge_size ** 2) if fullest else 0)
    out.append(Bucket(length, k, p))
  return out


def pack_budget(trajectories, length_buckets=(), rows_per_shard: int = 1, merge_size: int = 2,
                max_loss_tokens: int = 0, patches_per_shard: int = 0, loss_multiple: int = 64,
                length_multiple: int = 256) -> Bucket:
  """The one compiled shape of a packed run (`pack`): T the largest length bucket (() = the longest trajectory
  rounded up to `length_multiple`); K and P from the config when set, else bounds that any row of at most T tokens
  meets: K = T x the largest share of loss tokens of a trajectory, P = rows_per_shard x T x the largest image
  patches per token, rounded up (to `loss_multiple`, at most T; to merge_size**2). A row packed to T tokens then
  never runs out of K or P; with a fixed budget `pack` also keeps each row within it.

  Args:
    trajectories: the dataset's `Trajectory` records.
    length_buckets: increasing ints (`sft.length_buckets`), or ().
    rows_per_shard: packed rows of one batch shard (the packed micro-batch's rows / the data x fsdp devices).
    merge_size: the vision tower's spatial_merge_size.
    max_loss_tokens: a fixed K (`sft.max_loss_tokens`), or 0.
    patches_per_shard: a fixed P (`sft.patches_per_shard`), or 0.
  Raises:
    ValueError: no trajectories; a trajectory longer than T (naming it and the budget).
  """
  (bucket,) = sft_buckets(trajectories, tuple(length_buckets)[-1:], rows_per_shard, merge_size, patches_per_shard,
                          length_multiple, loss_multiple)
  length = bucket.length
  lengths = np.array([max(len(t.token_ids), 1) for t in trajectories], np.float64)
  loss = np.array([num_loss_tokens(t) for t in trajectories]) / lengths
  patches = np.array([sum(int(np.prod(i.grid_thw)) for i in t.images) for t in trajectories]) / lengths
  k = int(max_loss_tokens) or min(length, _round_up(int(np.ceil(loss.max() * length)), loss_multiple))
  per_row = int(np.ceil(patches.max() * length))
  p = int(patches_per_shard) or (_round_up(per_row, merge_size ** 2) * int(rows_per_shard) if per_row else 0)
  return Bucket(length, k, p)


def pick_bucket(buckets: list[Bucket], trajectories) -> Bucket:
  """The smallest of `sft_buckets`' buckets that holds every one of `trajectories` (T, K and patches per row).

  Raises:
    ValueError: none does (a trajectory that was not in the dataset the buckets were made from).
  """
  longest = max(len(t.token_ids) for t in trajectories)
  for bucket in buckets:
    if bucket.length >= longest:
      return bucket
  raise ValueError(f'no SFT length bucket holds a row of {longest} tokens (buckets: {[b.length for b in buckets]})')


def bucket_sizes(trajectories, length_buckets, max_loss_tokens: int | None = None,
                 loss_bucket: int = 64) -> tuple[int, int]:
  """(T, K) of a batch on the config's ladders, never the data's own sizes: T is the smallest of `length_buckets`
  that holds the batch's longest trajectory; K (loss positions per row) is `loss_bucket` times the smallest power of
  two that holds its most emitted tokens, capped at min(T, max_loss_tokens). A run therefore compiles at most
  len(length_buckets) × (log2(K_max / loss_bucket) + 1) update programs, a number fixed by the config
  (`program_bound`; DESIGN.md §3), while K follows the policy's emitted tokens (the vocabulary projection runs
  only there).

  Args:
    trajectories: the batch's `Trajectory` records.
    length_buckets: increasing ints >= 1, tokens per row (`grpo.length_buckets`).
    max_loss_tokens: the cap on K (`grpo.max_loss_tokens`), or None / 0 (T).
    loss_bucket: the K ladder's first rung, an int >= 1.
  Raises:
    ValueError: an empty batch; a trajectory longer than the largest bucket, or emitting more tokens than the cap
      (naming its prompt_id, its size and the budget).
  """
  if not trajectories:
    raise ValueError('bucket_sizes: trajectories is empty')
  longest = max(trajectories, key=lambda t: len(t.token_ids))
  fits = [int(b) for b in length_buckets if int(b) >= len(longest.token_ids)]
  if not fits:
    raise ValueError(f'trajectory {longest.prompt_id!r} has {len(longest.token_ids)} tokens, over the largest '
                     f'length bucket {max(length_buckets)} (length_buckets={tuple(length_buckets)})')
  length = fits[0]
  cap = min(length, int(max_loss_tokens)) if max_loss_tokens else length
  most = max(trajectories, key=num_loss_tokens)
  need = num_loss_tokens(most)
  if need > cap:
    raise ValueError(f'trajectory {most.prompt_id!r} has {need} loss tokens, over the budget '
                     f'max_loss_tokens={max_loss_tokens}')
  return length, min(cap, ladder(need, loss_bucket))


def ladder(n: int, base: int) -> int:
  """`base` times the smallest power of two whose product holds n (n >= 1; `base` for n <= base): the K rung, on
  the same ladder as the vision patches (`vision_layout.patch_slots`)."""
  return vision_layout.patch_slots(max(1, int(n)), int(base))


def program_bound(length_buckets, max_loss_tokens: int | None = None, loss_bucket: int = 64) -> int:
  """The most (T, K) pairs `bucket_sizes` can return for these budgets: the update programs a run can compile.
  Per T: the rungs loss_bucket x 2^i below the cap min(T, max_loss_tokens), plus the cap itself."""
  total = 0
  for length in length_buckets:
    cap = min(int(length), int(max_loss_tokens)) if max_loss_tokens else int(length)
    rung = int(loss_bucket)
    total += 1
    while rung < cap:
      total, rung = total + 1, rung * 2
  return total


def first_fit(sizes, budget) -> list[list[int]]:
  """First-fit decreasing (by the first size): each item, longest first (ties in input order), goes into the first
  row with room for all its sizes, else a new row. The bin packing of `pack`, also over a collated batch's rows
  (`update_rows.pack_parts`).

  Args:
    sizes: int [N, D] per-item sizes (tokens, loss tokens, image patches), each within the budget.
    budget: D ints, the room of a row (a huge number = no limit).
  Returns:
    rows: lists of item indices, every item exactly once, each row in input order, rows in order of creation.
  """
  sizes = np.asarray(sizes, np.int64).reshape(len(sizes), -1)
  budget = np.asarray(budget, np.int64)
  rows, used = [], []
  for i in sorted(range(len(sizes)), key=lambda i: -sizes[i, 0]):
    for r, total in enumerate(used):
      if np.all(total + sizes[i] <= budget):
        rows[r].append(i)
        used[r] = total + sizes[i]
        break
    else:
      rows.append([i])
      used.append(sizes[i].copy())
  return [sorted(r) for r in rows]


NO_LIMIT = np.iinfo(np.int64).max // 4


def pack(trajectories, length: int, num_loss: int, patches_per_row: int = 0) -> list[list[int]]:
  """Packs trajectories into rows of a fixed token budget (dynamic batch size, DESIGN.md §3): first-fit decreasing
  by token count (`first_fit`), so short trajectories share a row instead of each padding one to T.

  A row holds whole trajectories only (never cut), at most `length` tokens, `num_loss` loss tokens
  (`num_loss_tokens`) and, with `patches_per_row` > 0, that many image patches. Deterministic: ties keep the
  input order, and each row lists its trajectories in input order.

  Args:
    trajectories: `Trajectory` records.
    length, num_loss: T and K of a packed row, ints >= 1.
    patches_per_row: the image patches a row may hold, or 0 (no limit).
  Returns:
    rows: lists of indices into `trajectories`, every index exactly once, the longest trajectories' rows first.
  Raises:
    ValueError: a trajectory over a budget on its own (naming it, its size and the budget).
  """
  budget = (length, num_loss, patches_per_row or NO_LIMIT)
  sizes = []
  for t in trajectories:
    need = (len(t.token_ids), num_loss_tokens(t), sum(int(np.prod(im.grid_thw)) for im in t.images))
    for got, room, name in zip(need, budget, ('tokens', 'loss tokens', 'image patches')):
      if got > room:
        raise ValueError(f'trajectory {t.prompt_id!r} (sample {t.sample_index}) has {got} {name}, over the packed '
                         f'row budget of {room}')
    sizes.append(need)
  return first_fit(sizes, budget)


def collate(trajectories, *, length_multiple: int = 256, loss_multiple: int = 64, length: int | None = None,
            num_loss: int | None = None, rows: list[list[int]] | None = None) -> dict[str, np.ndarray]:
  """Pads a list of `Trajectory` into model inputs and gathered loss targets, one trajectory per row or packed.

  Args:
    trajectories: `osvl_jax.trajectory.Trajectory` records (token_ids, gen_mask, step_of_token, images).
    length_multiple: T is padded up to a multiple of this (limits recompiles).
    loss_multiple: K (loss positions per row) is padded up to a multiple of this.
    length, num_loss: fixed T and K instead (one compiled program for a whole run), at least the batch's own.
    rows: None (row b = trajectory b), or packed rows (`pack`): row r holds the trajectories rows[r] one after
      the other (an empty list = an all-padding row, to fill a fixed row count); every trajectory at most once.
  Returns:
    input_ids [B, T] int32 (`trajectory.model_input_ids` of each row, right padded with <|endoftext|>),
    attention_mask [B, T]: bool (True = real token) one trajectory per row; int32 segment ids when packed (0 on
      padding, j + 1 on the tokens of the row's j-th trajectory: each attends only within itself),
    position_ids [3, B, T] int32 (3-D MRoPE positions, `rope.get_rope_index` of each trajectory on its own, so
      they restart at every packed trajectory; 0 on padding),
    pixel_values [N, 1536] float32 (all images of all rows, in row order), image_grid_thw [I, 3] int32,
    loss_positions [B, K] int32 (t such that token t+1 was emitted by the policy; 0 on padding),
    loss_targets [B, K] int32 (token t+1), completion_mask [B, K] bool (M_gen at the loss positions: True on the
    policy's emitted tokens, False on padding), loss_step [B, K] int32 (step of token t+1; -1 on padding),
    rollout_logprobs [B, K] float32 (0 where unknown). A row's loss positions are those of its trajectories in
    order, so a loss (summed over the tokens, `losses.sft_loss`) is the same packed or not.
  Raises:
    ValueError: on an empty list, a fixed `length` / `num_loss` smaller than the batch needs, rows that name a
      trajectory twice or none that exists.
    trajectory.TrajectoryError: (a ValueError) when a trajectory breaks an invariant (`validate_trajectory`:
      pads per image, gen_mask only on assistant tokens, step_of_token order, ...); nothing is repaired here.
  """
  if not trajectories:
    raise ValueError('collate: trajectories is empty')
  for traj in trajectories:
    traj_lib.validate_trajectory(traj)
  packed = rows is not None
  rows = [[i] for i in range(len(trajectories))] if rows is None else [[int(i) for i in r] for r in rows]
  flat = [i for r in rows for i in r]
  if len(set(flat)) != len(flat) or any(not 0 <= i < len(trajectories) for i in flat):
    raise ValueError(f'collate: rows {rows} must name each of the {len(trajectories)} trajectories at most once')
  batch = len(rows)
  longest = max(sum(len(trajectories[i].token_ids) for i in r) for r in rows)
  most = max(sum(num_loss_tokens(trajectories[i]) for i in r) for r in rows)
  if (length is not None and length < longest) or (num_loss is not None and num_loss < most):
    raise ValueError(f'collate: fixed length={length} / num_loss={num_loss} is below the batch\'s '
                     f'{longest} tokens / {most} loss tokens per row')
  length = length or _round_up(longest, length_multiple)
  k = num_loss or _round_up(most, loss_multiple)

  input_ids = np.full((batch, length), PAD_ID, np.int32)
  attention_mask = np.zeros((batch, length), np.int32 if packed else bool)
  position_ids = np.zeros((3, batch, length), np.int32)
  loss_positions = np.zeros((batch, k), np.int32)
  loss_targets = np.zeros((batch, k), np.int32)
  completion_mask = np.zeros((batch, k), bool)
  loss_step = np.full((batch, k), -1, np.int32)
  rollout_logprobs = np.zeros((batch, k), np.float32)
  pixel_values, grids = [], []
  for b, row in enumerate(rows):
    offset, n = 0, 0   # tokens and loss positions of the row so far
    for j, i in enumerate(row):
      traj = trajectories[i]
      ids = np.asarray(traj.token_ids, np.int32)
      span = slice(offset, offset + len(ids))
      model_ids = traj_lib.model_input_ids(ids, traj.gen_mask)
      input_ids[b, span] = model_ids
      attention_mask[b, span] = j + 1 if packed else True
      own = np.stack([np.asarray(im.grid_thw, np.int32) for im in traj.images]) if traj.images else None
      position_ids[:, b, span] = rope.get_rope_index(np.asarray(model_ids)[None], own)[0][:, 0]
      targets = np.nonzero(np.asarray(traj.gen_mask, bool)[1:])[0] + 1  # emitted tokens (index >= 1)
      span = slice(n, n + len(targets))
      loss_positions[b, span] = offset + targets - 1
      loss_targets[b, span] = ids[targets]
      completion_mask[b, span] = True
      loss_step[b, span] = np.asarray(traj.step_of_token)[targets]
      if traj.rollout_logprobs is not None:
        rollout_logprobs[b, span] = np.asarray(traj.rollout_logprobs)[targets]
      for image in traj.images:
        pixel_values.append(np.asarray(image.pixel_values, np.float32))
        grids.append(np.asarray(image.grid_thw, np.int32))
      offset, n = offset + len(ids), n + len(targets)
  image_grid_thw = np.stack(grids).astype(np.int32) if grids else None
  return {
      'input_ids': input_ids,
      'attention_mask': attention_mask,
      'position_ids': position_ids,
      'pixel_values': np.concatenate(pixel_values) if pixel_values else None,
      'image_grid_thw': image_grid_thw,
      'loss_positions': loss_positions,
      'loss_targets': loss_targets,
      'completion_mask': completion_mask,
      'loss_step': loss_step,
      'rollout_logprobs': rollout_logprobs,
  }

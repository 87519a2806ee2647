"""The worker loop of `service.SamplerService`: continuous batching over `decode_batch.DecodeBatch`es.

One thread owns the sampler. Rows run in one `DecodeBatch` per distinct (temperature, top_p, stop strings); each
loop turn:
  1. collects jobs: when nothing runs it blocks for the first one, then keeps taking jobs while they arrive less
     than `batch_window_s` apart (at most 20 windows, up to `max_batch` rows); while rows run, it only takes the
     jobs already waiting;
  2. admits waiting rows, oldest first, into the batches: one prefill per batch and turn, into free slots; a row
     waits while admitting it would make the batches' KV-cache slots (their capacity, free slots included, summed
     over every sampling setting) exceed `max_batch`, the bound `/server_info` states as max_total_num_tokens;
  3. runs one chunk (`decode_steps` steps at most, ending early at the first finished row) of every batch and
     answers each job whose rows are all done.
So a short request waits at most one chunk before it is prefilled, never for a long one to finish. Each row's
limit (`max_new_tokens`, capped by `max_len`) and extra `stop_token_ids` are its own, applied on device and at
chunk boundaries. A weight update is a barrier: rows that arrived before it finish on the old weights, rows
after it are admitted once it ran, so no generation straddles an update (one version span each). A cache flush
runs at once, between two chunks, without waiting for running rows (a running row holds no prefix-cache slot:
its matched prefix was copied at admission), and the rows behind it are admitted in the same turn.
A row that makes its admission (the batched prefill) raise fails alone: the admitted rows are retried in halves.
A decode error fails the jobs with rows in that batch (the handler answers 500) and drops the batch.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import time
from typing import Any

import numpy as np

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import decode_batch, prefill_inputs


@dataclasses.dataclass
class _Pending:
  job: Any             # kept: its id() is the key of `Scheduler.pending`
  outputs: list
  left: int            # rows not answered yet
  version: str         # the weights its rows run on
  next_row: int = 0    # the first row not admitted yet
  failed: bool = False  # answered with an error: its other rows are dropped


class Scheduler:
  """Runs the jobs of `service` (a `service.SamplerService`: its queue, sampler, limits, `_row_output`, `_update`,
  `_flush`, `stats`) until a None job arrives and everything queued before it is answered."""

  def __init__(self, service):
    self.service = service
    self.backlog: collections.deque = collections.deque()
    self.batches: dict[tuple, decode_batch.DecodeBatch] = {}
    self.pending: dict[int, _Pending] = {}
    self.closing = False

  def run(self) -> None:
    while True:
      self._collect()
      if self.closing and not self.backlog and not self.batches:
        return
      try:
        self._admit()
        self._step()
      except Exception as e:  # pylint: disable=broad-except
        self._fail_all(e)   # a bug must answer every waiting request with an error, never stop the worker

  # -- 1. collect ----------------------------------------------------------------------------------------------
  def _take(self, block: bool, timeout: float | None = None) -> bool:
    """Moves one job from the queue to the backlog; False when none came (or the closing None)."""
    try:
      jobs = self.service._queue   # pylint: disable=protected-access
      job = jobs.get(timeout=timeout) if block else jobs.get_nowait()
    except queue.Empty:
      return False
    if job is None:
      self.closing = True
      return False
    self.backlog.append(job)
    return True

  def _collect(self) -> None:
    s = self.service
    if self.batches or self.backlog or self.closing:   # rows are running: only what is waiting
      while self._take(block=False):
        pass
      return
    if not self._take(block=True):
      return
    job = self.backlog[-1]
    rows = len(job.payload) if job.kind == 'generate' else 0
    linger = s.batch_window_s if job.kind == 'generate' else 0.0
    give_up = time.monotonic() + 20 * linger   # never linger longer than this in all
    while rows < s.max_batch:   # keep collecting while requests arrive less than `batch_window_s` apart
      wait = min(linger, give_up - time.monotonic())
      if not self._take(block=wait > 0, timeout=wait if wait > 0 else None):
        return
      job = self.backlog[-1]
      rows += len(job.payload) if job.kind == 'generate' else 0

  # -- 2. admit ------------------------------------------------------------------------------------------------
  def _admit(self) -> None:
    s = self.service
    groups: dict[tuple, list] = {}

    def fits(key: tuple) -> bool:   # the KV slots of every batch, with one more row of `key`, within max_batch
      keys = set(self.batches) | set(groups) | {key}
      slots = sum(self._slots_after(k, len(groups.get(k, ())) + (k == key)) for k in keys)
      return slots <= s.max_batch or not (self.batches or groups)   # one row always runs

    while self.backlog:
      job = self.backlog[0]
      if job.kind != 'generate':
        if job.kind == 'update' and (self.batches or groups):
          break                     # a barrier: the rows before it finish on the old weights first
        self.backlog.popleft()
        (s._update if job.kind == 'update' else s._flush)(job)  # pylint: disable=protected-access
        continue
      if job.future.done():         # answered already (a row of it failed): its other rows are dropped
        self.backlog.popleft()
        continue
      p = self._pending(job)
      if p is None:
        p = self.pending[id(job)] = _Pending(job, [None] * len(job.payload), len(job.payload), s.weight_version)
      while p.next_row < len(job.payload) and not p.failed:
        k, row = p.next_row, job.payload[p.next_row]
        key = (row.temperature, row.top_p, row.stop)
        if not fits(key):
          break
        p.next_row += 1
        if self._trivial(job, k, row):
          continue
        groups.setdefault(key, []).append((job, k, row))
      if p.next_row < len(job.payload) and not p.failed:
        break                       # no room for the rest of this job
      self.backlog.popleft()
    for key, items in groups.items():
      self._admit_group(key, [it for it in items if self._pending(it[0]) is not None])

  def _slots_after(self, key: tuple, rows: int) -> int:
    """KV-cache slots the batch of `key` holds after admitting `rows` more rows, as `DecodeBatch.admit` grows it
    (free slots first, then to the next power of two)."""
    batch = self.batches.get(key)
    if batch is None:
      pow2 = getattr(self.service.sampler, 'pad_batch_pow2', False)
      return 0 if not rows else decode_batch.next_pow2(rows) if pow2 else rows
    free = batch.capacity - batch.live
    return batch.capacity if rows <= free else max(batch.capacity, decode_batch.next_pow2(batch.capacity + rows - free))

  def _trivial(self, job, k: int, row) -> bool:
    """Answers a row that cannot run (a pad count that does not fit its images: ValueError, a 400) or has nothing
    to emit (an empty prompt, or one that fills max_len); True when it did."""
    s = self.service
    try:
      prefill_inputs.check_image_pads([row.context])
    except ValueError as e:
      self._fail([job], e)
      return True
    n = len(row.context.prompt_ids)
    if n and min(row.max_new_tokens, s.sampler.max_len - n) > 0:
      return False
    gen = engine_lib.Generation(np.zeros(0, np.int32), np.zeros(0, np.float32), '', engine_lib.FINISH_LENGTH)
    self._deliver([((job, k), gen, 0)])
    return True

  def _admit_group(self, key: tuple, items: list) -> None:
    if not items:
      return
    s, (temperature, top_p, stop) = self.service, key
    sampler = s.sampler
    batch = self.batches.get(key)
    try:
      if batch is None:
        chunk = min(s.decode_steps, decode_batch.STOP_CHUNK) if stop else s.decode_steps
        batch = decode_batch.DecodeBatch(sampler, stop, chunk=chunk, until_first_done=True,
                                         sampling=engine_lib.Sampling(temperature, top_p))
      limits = [min(row.max_new_tokens, sampler.max_len - len(row.context.prompt_ids)) for _, _, row in items]
      finished = batch.admit([row.context for _, _, row in items], limits, [(job, k) for job, k, _ in items],
                             [row.stop_token_ids for _, _, row in items])
    except Exception as e:  # pylint: disable=broad-except
      self._isolate(key, items, e)
      return
    self.batches[key] = batch
    s.stats['batches'] += 1
    s.stats['rows'] += len(items)
    s.stats['max_rows_per_batch'] = max(s.stats['max_rows_per_batch'], batch.live + len(finished))
    s.stats['peak_kv_slots'] = max(s.stats['peak_kv_slots'], sum(b.capacity for b in self.batches.values()))
    self._deliver(finished)
    self._retire(key)

  def _isolate(self, key: tuple, items: list, error: BaseException) -> None:
    """A failed admission: the halves are admitted apart (bisection), so only a row that fails alone fails; the
    running batch keeps its rows (an admission fails before any slot of it is written)."""
    if len(items) == 1:
      self.service.stats['failed_rows'] += 1
      self._fail([items[0][0]], error)
      return
    self.service.stats['isolation_retries'] += 1
    half = len(items) // 2
    for part in (items[:half], items[half:]):
      self._admit_group(key, [it for it in part if self._pending(it[0]) is not None])

  # -- 3. step -------------------------------------------------------------------------------------------------
  def _step(self) -> None:
    for key, batch in list(self.batches.items()):
      try:
        finished = batch.step()
      except Exception as e:  # pylint: disable=broad-except
        self._drop(key, batch, e)
        continue
      self._deliver(finished)
      self._retire(key)

  def _retire(self, key: tuple) -> None:
    batch = self.batches.get(key)
    if batch is not None and not batch.live:
      del self.batches[key]
      stats = dict(batch.stats)
      stats['decode_tokens_per_s'] = stats['emitted_tokens'] / max(stats['decode_s'], 1e-9)
      self.service.sampler.stats = stats   # `/server_info`'s last_batch

  def _pending(self, job) -> _Pending | None:
    """The pending state of a job not answered yet, else None."""
    p = self.pending.get(id(job))
    return p if p is not None and p.job is job else None

  def _deliver(self, finished: list) -> None:
    for (job, k), gen, cached in finished:
      p = self._pending(job)
      if p is None:   # failed (or answered) already
        continue
      row = job.payload[k]
      out = self.service._row_output(row, gen, p.version)   # pylint: disable=protected-access
      p.outputs[k] = {**out, 'cached_tokens': int(cached)}
      p.left -= 1
      if p.left == 0:
        del self.pending[id(job)]
        if not job.future.done():   # a cancelled request's future stays cancelled
          job.future.set_result(p.outputs)

  def _fail(self, jobs: list, error: BaseException) -> None:
    for job in jobs:
      p = self._pending(job)
      if p is not None:   # its rows still in a batch are dropped when they finish (`_deliver`)
        p.failed = True
        del self.pending[id(job)]
        if not job.future.done():
          job.future.set_exception(error)

  def _fail_all(self, error: BaseException) -> None:
    """Answers every job held here (running, pending or waiting) with `error` and forgets all batches."""
    jobs = [p.job for p in self.pending.values()] + list(self.backlog)
    self.pending.clear()
    self.backlog.clear()
    self.batches.clear()
    for job in jobs:
      if not job.future.done():
        job.future.set_exception(error)

  def _drop(self, key: tuple, batch, error: BaseException) -> None:
    """Fails every job with a row in `batch` and forgets the batch."""
    self._fail([slot.tag[0] for slot in batch.slots if slot is not None], error)
    self.batches.pop(key, None)

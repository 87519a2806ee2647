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

With compile-ahead (`compile_ahead.CompileAhead`, the service's `compile_ahead`): a sampling setting may run
several batches (lanes; the first is its main lane, where rows go by default, the others only take rows into free
slots). Text rows and image rows are admitted apart; each part goes to the first lane whose programs for it are
compiled, else to a new lane within the KV slots the turn leaves, else waits (deferred, holding no slot) while its
admission into the main lane is rehearsed on the compile thread, and is admitted on the first turn after it,
whatever its shapes then. A job of the other kind (text vs image) ends the collecting linger: waiting would not
batch it with the rows collected.
"""

from __future__ import annotations

import collections
import concurrent.futures
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
    self.batches: dict[tuple, decode_batch.DecodeBatch] = {}   # (sampling key, lane) -> its running batch
    self.pending: dict[int, _Pending] = {}
    self.closing = False
    self.ahead = getattr(service, 'compile_ahead', None)   # a `compile_ahead.CompileAhead`, or None
    self.deferred: list[tuple[Any, tuple, list]] = []       # (rehearsal future, sampling key, rows) waiting
    self._slack = 0                                         # KV slots this turn's groups leave free

  def run(self) -> None:
    while True:
      self._collect()
      if self.closing and not self.backlog and not self.batches and not self.deferred:
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
    if self.batches or self.backlog or self.closing or self.deferred:   # rows are running: only what is waiting
      if not self.batches and self.deferred:   # nothing decodes, rows wait for a rehearsal: no busy loop
        if self.backlog:   # (jobs the turn cannot admit yet, behind an update barrier)
          concurrent.futures.wait([d[0] for d in self.deferred], 0.005, concurrent.futures.FIRST_COMPLETED)
        else:
          self._take(block=True, timeout=0.005)
      while self._take(block=False):
        pass
      return
    if not self._take(block=True):
      return
    job = self.backlog[-1]
    rows = len(job.payload) if job.kind == 'generate' else 0
    linger = s.batch_window_s if job.kind == 'generate' else 0.0
    give_up = time.monotonic() + 20 * linger   # never linger longer than this in all
    kind = self._kind(job)
    while rows < s.max_batch:   # keep collecting while requests arrive less than `batch_window_s` apart
      wait = min(linger, give_up - time.monotonic())
      if not self._take(block=wait > 0, timeout=wait if wait > 0 else None):
        return
      job = self.backlog[-1]
      rows += len(job.payload) if job.kind == 'generate' else 0
      if self.ahead is not None and self._kind(job) != kind:
        return   # its rows are admitted apart from those collected (`_admit_group`): waiting batches it with none

  @staticmethod
  def _kind(job) -> tuple:
    """('generate', whether a row has images), or (the job's kind,)."""
    if job.kind != 'generate':
      return (job.kind,)
    return ('generate', any(row.context.images for row in job.payload))

  # -- 2. admit ------------------------------------------------------------------------------------------------
  def _admit(self) -> None:
    s = self.service
    groups: dict[tuple, list] = {}

    def slots(key: tuple | None = None) -> int:   # the KV slots of every batch after this turn (+ a row of `key`)
      rows = collections.Counter({k: len(v) for k, v in groups.items()})
      rows.update({k: len(v) for k, v in retry.items()})
      rows.update([key] if key is not None else [])
      return sum(self._slots_after(k, rows[k]) for k in {k for k, _ in self.batches} | set(rows))

    def fits(key: tuple) -> bool:   # ... within max_batch
      return slots(key) <= s.max_batch or not (self.batches or groups or retry)   # one row always runs

    retry: dict[tuple, list] = {}   # deferred rows whose rehearsal ended: admitted first, whatever their shapes
    for d in [d for d in self.deferred if d[0].done()]:
      rows = [it for it in d[2] if self._pending(it[0]) is not None and not it[0].future.done()]
      while rows and fits(d[1]):
        retry.setdefault(d[1], []).append(rows.pop(0))
      self.deferred.remove(d)
      if rows:   # no room yet: they wait for the next turn
        self.deferred.append((d[0], d[1], rows))
    while self.backlog:
      job = self.backlog[0]
      if job.kind != 'generate':
        if job.kind == 'update' and (self.batches or groups or retry or self.deferred):
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
    self._slack = s.max_batch - slots()
    for key, items in retry.items():
      self._admit_group(key, items, may_defer=False)
    for key, items in groups.items():
      self._admit_group(key, [it for it in items if self._pending(it[0]) is not None])

  def _lanes(self, key: tuple) -> list[int]:
    """The lanes of the batches of sampling `key`, the main one (where rows go by default) first."""
    return sorted(lane for k, lane in self.batches if k == key)

  def _slots_after(self, key: tuple, rows: int) -> int:
    """KV-cache slots the batches of `key` hold after admitting `rows` more rows into its main lane, as
    `DecodeBatch.admit` grows it (free slots first, then to the next power of two)."""
    lanes = self._lanes(key)
    others = sum(self.batches[(key, lane)].capacity for lane in lanes[1:])
    if not lanes:   # (with compile-ahead its text and image rows may enter apart: the second part grows it)
      pow2 = getattr(self.service.sampler, 'pad_batch_pow2', False) or self.ahead is not None
      return 0 if not rows else decode_batch.next_pow2(rows) if pow2 else rows
    batch = self.batches[(key, lanes[0])]
    free = batch.capacity - batch.live
    grown = batch.capacity if rows <= free else max(batch.capacity, decode_batch.next_pow2(batch.capacity + rows - free))
    return grown + others

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

  def _admit_group(self, key: tuple, items: list, may_defer: bool = True) -> None:
    """Admits `items` ((job, row index, Row)) of sampling `key`: into its main lane; with compile-ahead
    (`compile_ahead`), text rows and image rows apart, each into the first lane (or a new one, within the KV slots
    left) whose programs are compiled, else deferred while a rehearsal compiles them (`may_defer`: once per row),
    else into the main lane."""
    if not items:
      return
    if self.ahead is None:
      lanes = self._lanes(key)
      self._admit_into(key, lanes[0] if lanes else 0, items)
      return
    for part in ([it for it in items if not it[2].context.images], [it for it in items if it[2].context.images]):
      if part:
        self._place(key, part, may_defer)

  def _place(self, key: tuple, items: list, may_defer: bool) -> None:
    lanes = self._lanes(key)
    try:
      where = self._where(key, lanes, items, may_defer)
    except Exception:  # pylint: disable=broad-except
      where = None   # a row the planning refuses: the admission below raises it again and isolates the row
    if where is None:
      self._admit_into(key, lanes[0] if lanes else 0, items)
    elif where[0] == 'defer':
      self.deferred.append((self.ahead.rehearse(*where[1:]), key, items))
    else:
      self._admit_into(key, *where[1:])

  def _where(self, key: tuple, lanes: list[int], items: list, may_defer: bool) -> tuple | None:
    """('admit', lane, items, plan, batch): a lane whose programs for `items` are compiled; ('defer', rehearsal):
    none, and `items` may wait for a rehearsal of their admission into the main lane; None: the main lane."""
    contexts, limits = [row.context for _, _, row in items], self._limits(items)
    main = None   # (the main lane's batch, its plan for `items`)
    for lane in lanes:   # another lane than the main one: only into its free slots (the KV slots were counted)
      batch = self.batches[(key, lane)]
      if lane == lanes[0] or len(items) <= batch.capacity - batch.live:
        plan = batch.plan(contexts, limits)
        main = main or (batch, plan)
        if self.ahead.is_warm(batch.compiles(plan)) and (lane == lanes[0] or plan.batch == batch.capacity):
          return 'admit', lane, items, plan, batch
    fresh = self._new_batch(key)
    plan = fresh.plan(contexts, limits)
    if (not lanes or plan.batch <= self._slack) and self.ahead.is_warm(fresh.compiles(plan)):
      self._slack -= plan.batch if lanes else 0
      return 'admit', lanes[-1] + 1 if lanes else 0, items, plan, fresh
    if not may_defer:
      return None
    batch, plan = main or (fresh, plan)
    return 'defer', batch.rehearse(contexts, limits, plan)

  def _new_batch(self, key: tuple) -> decode_batch.DecodeBatch:
    s, (temperature, top_p, stop) = self.service, key
    chunk = min(s.decode_steps, decode_batch.STOP_CHUNK) if stop else s.decode_steps
    return decode_batch.DecodeBatch(s.sampler, stop, chunk=chunk, until_first_done=True,
                                    sampling=engine_lib.Sampling(temperature, top_p))

  def _limits(self, items: list) -> list[int]:
    return [min(row.max_new_tokens, self.service.sampler.max_len - len(row.context.prompt_ids)) for _, _, row in items]

  def _admit_into(self, key: tuple, lane: int, items: list, plan=None, batch=None) -> None:
    """Admits `items` into the batch of (key, lane) (made when there is none, or `batch`); `plan`: made for it."""
    if not items:
      return
    s = self.service
    batch = batch or self.batches.get((key, lane)) or self._new_batch(key)
    try:
      contexts, limits = [row.context for _, _, row in items], self._limits(items)
      plan = plan or batch.plan(contexts, limits)
      compiled = batch.compiles(plan) if self.ahead is not None else ()
      finished = batch.admit(contexts, limits, [(job, k) for job, k, _ in items],
                             [row.stop_token_ids for _, _, row in items], plan)
    except Exception as e:  # pylint: disable=broad-except
      self._isolate(key, lane, items, e)
      return
    if self.ahead is not None:
      self.ahead.note(compiled)
    self.batches[(key, lane)] = batch
    s.stats['batches'] += 1
    s.stats['rows'] += len(items)
    s.stats['max_rows_per_batch'] = max(s.stats['max_rows_per_batch'], batch.live + len(finished))
    s.stats['peak_kv_slots'] = max(s.stats['peak_kv_slots'], sum(b.capacity for b in self.batches.values()))
    self._deliver(finished)
    self._retire((key, lane))

  def _isolate(self, key: tuple, lane: int, items: list, error: BaseException) -> None:
    """A failed admission: the halves are admitted apart (bisection), so only a row that fails alone fails; the
    running batch keeps its rows (an admission fails before any slot of it is written)."""
    if len(items) == 1:
      self.service.stats['failed_rows'] += 1
      self._fail([items[0][0]], error)
      return
    self.service.stats['isolation_retries'] += 1
    half = len(items) // 2
    for part in (items[:half], items[half:]):
      self._admit_into(key, lane, [it for it in part if self._pending(it[0]) is not None])

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
    jobs = [p.job for p in self.pending.values()] + list(self.backlog) + [it[0] for d in self.deferred for it in d[2]]
    self.pending.clear()
    self.backlog.clear()   # (`deferred` keeps its rehearsals, rows dropped at their end: an update waits for them)
    self.batches.clear()
    for job in jobs:
      if not job.future.done():
        job.future.set_exception(error)

  def _drop(self, key: tuple, batch, error: BaseException) -> None:
    """Fails every job with a row in `batch` and forgets the batch."""
    self._fail([slot.tag[0] for slot in batch.slots if slot is not None], error)
    self.batches.pop(key, None)

"""Compiles off the serving thread: an admission whose programs are not compiled yet is rehearsed on a background
thread while the worker keeps decoding the rows it has, so a new shape (a batch size, a cache length, an image
patch count a request brings) stalls only the rows that bring it, never the requests already running or those
whose shapes are compiled (what SGLang gets from capturing its CUDA graphs at start, here without knowing the
shapes ahead).

`scheduler.Scheduler` asks `DecodeBatch.compiles(plan)` which programs an admission runs; when one of them is not in
`CompileAhead.warm`, the rows wait (deferred, holding no KV slot) while `DecodeBatch.rehearse` runs the same
admission on a scratch batch of the same shapes on this module's one thread, `request_limits.DECODE_NICENESS`
nicer than the worker. A row is deferred at most once: on its next turn it is admitted whatever its shapes.
Memory: a rehearsal holds a KV cache as large as the main lane's after the admission while it runs (the scratch
batch): with `--max_batch` sized to the device's memory, leave it off (`python -m osvl_jax.serve` runs it with
`--compile_ahead`). The prefix cache's
gather and store programs compile in the worker at their first (rows, cache length) (~0.1-0.2 s on CPU).
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Callable, Iterable

from osvl_jax.serve import request_limits


class CompileAhead:
  """The programs known compiled, and the thread that compiles more.

  Attributes:
    warm: keys of `DecodeBatch.compiles` whose programs ran (in the worker or in a rehearsal).
    rehearsals: rehearsals run; failed: those that raised (logged; the rows then compile when admitted).
  """

  def __init__(self):
    self.warm: set = set()
    self.rehearsals = 0
    self.failed = 0
    self._pool = concurrent.futures.ThreadPoolExecutor(1, 'osvl-compile-ahead',
                                                       initializer=request_limits._nicer_thread)  # pylint: disable=W0212

  def is_warm(self, keys: Iterable) -> bool:
    return all(k in self.warm for k in keys)

  def note(self, keys: Iterable) -> None:
    self.warm.update(keys)

  def rehearse(self, run: Callable[[], tuple]) -> concurrent.futures.Future:
    """Runs `run` (a `DecodeBatch.rehearse` function) on the compile thread; the keys it returns are warm once it
    returned (one that raised warms nothing: its rows compile when admitted, and the admission notes them)."""
    def job():
      try:
        self.warm.update(run())
      except Exception as e:  # pylint: disable=broad-except
        self.failed += 1
        logging.warning('compile-ahead rehearsal failed (the rows compile when admitted): %s: %s',
                        type(e).__name__, e)
      finally:
        self.rehearsals += 1
    return self._pool.submit(job)

  def info(self) -> dict:
    """/server_info's view: {'rehearsals', 'failed', 'warm_programs'}."""
    return {'rehearsals': self.rehearsals, 'failed': self.failed, 'warm_programs': len(self.warm)}

  def close(self) -> None:
    self._pool.shutdown(wait=True)

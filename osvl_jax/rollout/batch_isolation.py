"""Error isolation of the server's batched sampler calls (`osvl_jax.rollout.server`): one bad row must not fail
the rows batched with it."""


def sample(sampler, chunk: list, temperature: float, top_p: float, stop: tuple, failed: dict, stats: dict) -> list:
  """Runs `chunk`'s rows in one `sampler.generate` call; when the call raises, the two halves are retried apart
  (bisection), so only a row that fails alone fails.

  Args:
    sampler: the `JaxSampler` (its temperature / top_p are set here).
    chunk: [(job, row index, `server_requests.Row`)] sharing (temperature, top_p, stop).
    failed: job id -> the exception of its failed row; updated here, and rows of failed jobs are skipped.
    stats: the service's counters: batches, rows, max_rows_per_batch, failed_rows, isolation_retries.
  Returns:
    [(item, `engine.Generation`, cached prefix tokens)] of the rows that ran, in `chunk`'s order.
  """
  chunk = [it for it in chunk if id(it[0]) not in failed]
  if not chunk:
    return []
  try:
    sampler.temperature, sampler.top_p = temperature, top_p
    gens = sampler.generate([it[2].context for it in chunk],
                            max_new_tokens=max(it[2].max_new_tokens for it in chunk), stop=stop)
    cached = list(getattr(sampler, 'cached_tokens', None) or [0] * len(chunk))
  except Exception as e:  # pylint: disable=broad-except
    if len(chunk) == 1:
      failed[id(chunk[0][0])] = e
      stats['failed_rows'] += 1
      return []
    stats['isolation_retries'] += 1
    half = len(chunk) // 2
    first = sample(sampler, chunk[:half], temperature, top_p, stop, failed, stats)
    return first + sample(sampler, chunk[half:], temperature, top_p, stop, failed, stats)
  stats['batches'] += 1
  stats['rows'] += len(chunk)
  stats['max_rows_per_batch'] = max(stats['max_rows_per_batch'], len(chunk))
  return list(zip(chunk, gens, cached))

"""Continuous batching: a short request sent while a long one generates is answered about as fast as alone, with
the ids and log-probs it gets alone; rows joining a running `DecodeBatch` (into free slots, growing its slots
and cache length) decode exactly as they do alone; the KV slots of the batches of every sampling setting together
stay within `max_batch`."""

import concurrent.futures
import statistics
import time

import httpx
import numpy as np
import pytest

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import decode_batch, jax_sampler
from osvl_jax.serve import service as service_lib
from tests.serve.conftest import serve_in_thread

LONG, SHORT = 1500, 8


class NoEosSampler(jax_sampler.JaxSampler):
  """Never draws the end-of-sequence ids (as bench/sampler_speed.py), so every row runs to its length limit."""
  never_sampled = jax_sampler.JaxSampler.never_sampled + tuple(engine_lib.EOS_IDS)


def _prompt(seed, n):
  return [int(i) for i in np.random.default_rng(seed).integers(100, 150000, size=n)]


@pytest.fixture(scope='module')
def url(tiny_model, tokenizer, processor):
  sampler = NoEosSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=2048,
                         bucket=16)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0',
                                   default_max_new_tokens=SHORT, decode_steps=8)
  with serve_in_thread(svc) as u:
    yield u
  svc.close()


def _generate(url, ids, max_new):
  t0 = time.perf_counter()
  r = httpx.post(url + '/generate', json={'input_ids': ids, 'return_logprob': True,
                                          'sampling_params': {'max_new_tokens': max_new, 'temperature': 0}},
                 timeout=600)
  assert r.status_code == 200, r.text
  out = r.json()
  return time.perf_counter() - t0, out['output_ids'], [e[0] for e in out['meta_info']['output_token_logprobs']]


def _short_beside_long(url, short) -> tuple[float, float, list, list]:
  """(median solo latency, median latency beside a running long request, the solo and the beside results)."""
  solo = [_generate(url, short, SHORT) for _ in range(3)]
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    long_run = pool.submit(_generate, url, _prompt(2, 20), LONG)
    time.sleep(1.0)                                             # the long row is decoding
    beside = [_generate(url, short, SHORT) for _ in range(3)]
    assert not long_run.done(), 'the long request must still be generating while the short ones are answered'
    long_s, long_ids, _ = long_run.result()
  solo_s, beside_s = (statistics.median(t for t, _, _ in runs) for runs in (solo, beside))
  assert len(long_ids) == LONG and long_s > 10 * solo_s
  return solo_s, beside_s, solo, beside


def test_a_short_request_does_not_wait_for_a_long_one(url):
  short = _prompt(1, 9)
  _generate(url, short, SHORT)                                  # compiles the solo programs
  with concurrent.futures.ThreadPoolExecutor(1) as pool:        # compiles the two-row programs
    long_run = pool.submit(_generate, url, _prompt(2, 20), LONG)
    time.sleep(1.0)
    _generate(url, short, SHORT)
    long_run.result()
  # Latency on 2 shared cores moves with whatever else runs (the other test worker compiling): the bound must hold
  # in one of 3 paired measurements (solo, then beside the long request). Waiting for the whole long request
  # (seconds, > 10x solo) fails all three.
  tries = []
  for _ in range(3):
    solo_s, beside_s, solo, beside = _short_beside_long(url, short)
    tries.append((beside_s, solo_s))
    if beside_s < 2 * solo_s + 0.2:
      break
  assert beside_s < 2 * solo_s + 0.2, tries                     # before: the whole long request (seconds)
  assert all((ids, lps) == (solo[0][1], solo[0][2]) for _, ids, lps in solo)
  for _, ids, lps in beside:                                    # exact: the same ids and log-probs as alone
    assert ids == solo[0][1] and len(ids) == SHORT
    np.testing.assert_allclose(lps, solo[0][2], rtol=1e-6, atol=1e-6)   # float32 rounding


def test_rows_joining_a_running_batch_decode_as_they_do_alone(tiny_model, tokenizer):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, temperature=0.0, max_len=256, bucket=16)
  ctx = lambda seed, n: engine_lib.Context(np.asarray(_prompt(seed, n), np.int32), [])
  first = [ctx(3, 11), ctx(4, 5)]
  joining = [ctx(5, 7), ctx(6, 30), ctx(7, 13)]             # the second needs a longer cache; 3 need more slots
  limits = {0: 12, 1: 20, 2: 9, 3: 40, 4: 6}
  stop_id = sampler.generate([joining[2]], max_new_tokens=6)[0].ids[2]   # row 4 ends at its extra stop id
  stop_ids = {4: frozenset({int(stop_id)})}
  batch = decode_batch.DecodeBatch(sampler, chunk=4, until_first_done=True)
  got = dict((t, g) for t, g, _ in batch.admit(first, [limits[0], limits[1]], [0, 1]))
  got.update((t, g) for t, g, _ in batch.step())
  assert batch.live == 2 and batch.capacity == 2                # both still running after one chunk
  got.update((t, g) for t, g, _ in batch.admit(joining, [limits[2], limits[3], limits[4]], [2, 3, 4],
                                                [frozenset(), frozenset(), stop_ids[4]]))
  assert batch.capacity == 8 and batch.cache['mask'].shape[1] == 128   # grown: 2 + 3 rows; 30 + 40 ids: 2 x 64
  while batch.live:
    got.update((t, g) for t, g, _ in batch.step())
  for tag, c in enumerate(first + joining):   # ids equal; log-probs to float32 rounding (other cache length, slots)
    (alone,) = sampler.generate([c], max_new_tokens=limits[tag])
    want_ids = alone.ids.tolist()
    if tag in stop_ids:
      want_ids = want_ids[:want_ids.index(int(stop_id)) + 1]
    assert got[tag].ids.tolist() == want_ids, tag
    np.testing.assert_allclose(got[tag].logprobs, alone.logprobs[:len(want_ids)], rtol=1e-6, atol=1e-6)
    assert got[tag].finish_reason == (engine_lib.FINISH_STOP if tag in stop_ids else alone.finish_reason)


def test_the_kv_slots_of_every_sampling_setting_together_stay_within_max_batch(tiny_model, tokenizer, processor):
  """12 concurrent requests in 3 sampling settings on a server of max_batch 4: every batch (one per setting) counts
  its slots, free ones included, so at most 4 rows' KV exist at once (before: 4 live rows per setting, 12 slots and
  more), and every request is still answered, rows joining running batches."""
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0', max_batch=4,
                                   default_max_new_tokens=SHORT, decode_steps=4, batch_window_s=0.05)
  settings = [{'temperature': 0}, {'temperature': 0.7, 'top_p': 0.9}, {'temperature': 1.0}]

  def one(i):
    body = {'input_ids': _prompt(10 + i, 5 + i), 'sampling_params': {'max_new_tokens': 12, **settings[i % 3]}}
    return httpx.post(u + '/generate', json=body, timeout=600)

  with serve_in_thread(svc) as u, concurrent.futures.ThreadPoolExecutor(12) as pool:
    answers = list(pool.map(one, range(12)))
  svc.close()
  assert [r.status_code for r in answers] == [200] * 12, [r.text for r in answers if r.status_code != 200]
  assert all(r.json()['output_ids'] for r in answers)
  assert 2 <= svc.stats['peak_kv_slots'] <= 4, svc.stats
  assert svc.stats['rows'] == 12

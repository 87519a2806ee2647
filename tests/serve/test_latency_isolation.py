"""Latency isolation of the server (the mechanisms; bench/serve_latency.py times them): a cache flush runs between
two decode chunks and the requests behind it are admitted while a long request still runs; requests with images
wait for a decode thread in the image gate's queue, so a text request is answered while every decode thread is
busy and more image requests wait than the HTTP thread pool has threads, and small requests need no HTTP thread at
all; the decode threads run nicer than the server's others, so decoding yields the CPU to the sampler."""

import base64
import binascii
import concurrent.futures
import io
import os
import threading

import httpx
import numpy as np
import pytest
from PIL import Image

from osvl_jax import trajectory as tj
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.serve import app as app_lib
from osvl_jax.serve import request_limits
from osvl_jax.serve import service as service_lib
from osvl_jax.serve.requests import Row
from tests.serve.conftest import serve_in_thread, wait_until

LONG = 120       # new ids of the long request (decode_steps 2: 60 chunks)
HTTP_THREADS = 40   # anyio's default thread limiter: run_in_threadpool's threads


class NoEosSampler(jax_sampler.JaxSampler):
  """Never draws the end-of-sequence ids, so every row runs to its length limit."""
  never_sampled = jax_sampler.JaxSampler.never_sampled + tuple(engine_lib.EOS_IDS)


def _row(ids, max_new):
  return Row(context=engine_lib.Context(np.asarray(ids, np.int32), []), max_new_tokens=max_new,
             temperature=0.0, top_p=1.0, stop=(), stop_token_ids=frozenset())


def test_a_flush_runs_between_chunks_and_requests_behind_it_are_admitted(tiny_model, tokenizer, processor):
  sampler = NoEosSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                         bucket=16, prefix_cache_slots=4)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, default_max_new_tokens=8, decode_steps=2,
                                   batch_window_s=0.0)
  try:
    svc.submit_rows([_row([100, 101, 102], 2)]).result(timeout=120)   # compiles; fills a prefix-cache slot
    assert svc.prefix_cache_info()['used_slots'] == 1
    long = svc.submit_rows([_row([200, 201, 202, 203], LONG)])
    wait_until(lambda: svc.stats['rows'] == 2, 60, 'the long row admitted')
    seen = []
    flush = svc.submit_flush()
    flush.add_done_callback(lambda _: seen.append((svc.prefix_cache_info()['used_slots'], long.done())))
    short = svc.submit_rows([_row([300, 301], 2)])
    assert len(short.result(timeout=120)[0]['ids']) == 2
    assert not long.done()             # answered while the long request still runs (a barrier waited for it)
    assert seen == [(0, False)]        # the flush emptied the cache at once, with the long row running
    assert len(long.result(timeout=300)[0]['ids']) == LONG
  finally:
    svc.close()


def _png(seed):
  buf = io.BytesIO()
  Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, 'PNG')
  return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode()


def test_text_requests_do_not_wait_behind_image_requests_queued_for_decoding(tiny_model, tokenizer, processor):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16)
  limits = request_limits.RequestLimits(256, 32, max_concurrent_decodes=1)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, default_max_new_tokens=2, limits=limits)
  image_ids = [100, tj.VISION_START_ID, tj.IMAGE_PAD_ID, tj.VISION_END_ID, 101]
  n_images = HTTP_THREADS + 2
  release = threading.Event()
  with serve_in_thread(svc) as url, concurrent.futures.ThreadPoolExecutor(n_images) as pool:
    text = {'input_ids': [100, 200, 300], 'sampling_params': {'max_new_tokens': 2, 'temperature': 0}}
    assert httpx.post(url + '/generate', json=text, timeout=120).status_code == 200   # compiled
    svc.image_gate.submit(release.wait)      # the one decode thread is busy until released
    try:
      images = [pool.submit(httpx.post, url + '/generate', timeout=300,
                            json={**text, 'input_ids': image_ids, 'image_data': [_png(k)]}) for k in range(n_images)]
      wait_until(lambda: svc.image_gate.waiting >= HTTP_THREADS, 60, 'image requests queued for decoding')
      r = httpx.post(url + '/generate', json=text, timeout=60)   # before: no HTTP thread left to parse it
      assert r.status_code == 200 and len(r.json()['output_ids']) == 2
      assert not any(f.done() for f in images)
    finally:
      release.set()
    assert [f.result().status_code for f in images] == [200] * n_images
    assert svc.server_info()['request_limits']['peak_decodes'] == 1
  svc.close()


def test_decode_threads_run_nicer_than_the_server():
  gate = request_limits.ImageGate(request_limits.RequestLimits(256, 32, max_concurrent_decodes=2))
  nice = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
  base = nice()
  assert [gate.run(nice) for _ in range(4)] == [min(19, base + request_limits.DECODE_NICENESS)] * 4
  assert nice() == base   # the calling thread keeps its own


def test_small_requests_are_parsed_without_an_http_thread(tiny_model, tokenizer, processor, monkeypatch):
  """Behind a flood the HTTP threads are busy parsing large bodies: a small request never waits for one."""
  import starlette.concurrency
  on_threads = []
  run_in_threadpool = starlette.concurrency.run_in_threadpool

  async def recorded(fn, *args, **kwargs):
    on_threads.append(getattr(fn, '__name__', repr(fn)))
    return await run_in_threadpool(fn, *args, **kwargs)

  monkeypatch.setattr(starlette.concurrency, 'run_in_threadpool', recorded)   # read when the app is made
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, default_max_new_tokens=2)
  text = {'input_ids': [100, 200, 300], 'sampling_params': {'max_new_tokens': 2, 'temperature': 0}}
  chat = {'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 2, 'temperature': 0}
  with serve_in_thread(svc) as url:
    assert httpx.post(url + '/generate', json=text, timeout=120).status_code == 200
    assert httpx.post(url + '/v1/chat/completions', json=chat, timeout=120).status_code == 200
    assert on_threads == []
    large = {**text, 'rid': 'x' * app_lib.SMALL_BODY_BYTES}
    assert httpx.post(url + '/generate', json=large, timeout=120).status_code == 200
    assert on_threads == ['parse_body', 'parse_generate_request']
  svc.close()


def test_large_bodies_are_read_a_few_at_a_time(tiny_model, tokenizer, processor, monkeypatch):
  """Uploads stalled mid-body hold at most LARGE_BODY_READS readers; a small request is answered beside them."""
  import socket
  reading, peak = [0], [0]
  read_body = request_limits.read_body

  async def counted(request, limit):   # the large bodies being read
    large = int(request.headers['content-length']) > app_lib.SMALL_BODY_BYTES
    reading[0] += large
    peak[0] = max(peak[0], reading[0])
    try:
      return await read_body(request, limit)
    finally:
      reading[0] -= large

  monkeypatch.setattr(request_limits, 'read_body', counted)
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, default_max_new_tokens=2)
  uploads = []
  with serve_in_thread(svc) as url:
    port = int(url.rsplit(':', 1)[1])
    try:
      for _ in range(app_lib.LARGE_BODY_READS + 2):   # each sends its headers and half its body, then stalls
        s = socket.create_connection(('127.0.0.1', port))
        s.sendall(b'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                  b'Content-Length: 200000\r\n\r\n' + b' ' * 100000)
        uploads.append(s)
      wait_until(lambda: reading[0] >= app_lib.LARGE_BODY_READS, 30, 'large bodies being read')
      text = {'input_ids': [100, 200, 300], 'sampling_params': {'max_new_tokens': 2, 'temperature': 0}}
      assert httpx.post(url + '/generate', json=text, timeout=120).status_code == 200
      assert peak[0] == app_lib.LARGE_BODY_READS
    finally:
      for s in uploads:
        s.close()
  svc.close()


@pytest.mark.parametrize('wrap', [None, 76])
def test_image_data_decodes_as_the_standard_library_does(wrap):
  """The server's base64 decoder (SIMD pybase64: a flood's 4 MB uploads took ~10 ms each with the GIL held by the
  standard library's) reads strict base64 and MIME-wrapped lines alike, and refuses what the standard library
  refuses, naming the item."""
  raw = np.random.default_rng(0).integers(0, 256, 300_001, dtype=np.uint8).tobytes()
  text = base64.b64encode(raw).decode()
  if wrap:
    text = '\n'.join(text[i:i + wrap] for i in range(0, len(text), wrap))
  assert request_limits._image_bytes('data:image/png;base64,' + text, 'image_data[0]') == raw
  assert request_limits._image_bytes(text, 'image_data[0]') == base64.b64decode(text)
  for bad in ('abc', 'ab=c', 'é' * 8):
    with pytest.raises(request_limits.RequestError, match=r'cannot decode image_data\[3\]'):
      request_limits._image_bytes(bad, 'image_data[3]')
    with pytest.raises((ValueError, binascii.Error)):
      base64.b64decode(bad, validate=False)

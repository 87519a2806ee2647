"""Compile-ahead (`osvl_jax.serve.compile_ahead`): a request whose program shapes are new waits for their rehearsal
on the compile thread while a request with compiled shapes is answered; both get the ids the server gives without
compile-ahead; the KV slots of every lane stay within `max_batch`."""

import threading

import jax
import numpy as np
import pytest

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import decode_batch, jax_sampler
from osvl_jax.serve import compile_ahead, service as service_lib
from osvl_jax.serve.requests import Row
from osvl_jax import trajectory as tj

NEW = 6


def _gate(ahead: compile_ahead.CompileAhead) -> compile_ahead.CompileAhead:
  """`ahead` (the server's own) with its rehearsals started only once `ahead.gate` is set (a compile that lasts as
  long as the test wants); `ahead.submitted` counts them."""
  ahead.gate, ahead.submitted, rehearse = threading.Event(), 0, ahead.rehearse
  ahead.gate.set()

  def gated(run):
    ahead.submitted += 1

    def run_at_the_gate():
      assert ahead.gate.wait(120), 'the test never opened the gate'
      return run()
    return rehearse(run_at_the_gate)
  ahead.rehearse = gated
  return ahead


def _service(model, tokenizer, processor, ahead: bool, max_batch: int = 64):
  sampler = jax_sampler.JaxSampler(model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16, prefix_cache_slots=8)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, max_batch=max_batch, batch_window_s=0.0,
                                   decode_steps=4, compile_ahead=ahead, default_max_new_tokens=NEW)
  if ahead:
    _gate(svc.compile_ahead)
  return svc


def _row(ids, images=()):
  return Row(context=engine_lib.Context(np.asarray(ids, np.int32), list(images)), max_new_tokens=NEW,
             temperature=0.0, top_p=1.0, stop=(), stop_token_ids=frozenset(), return_logprob=True)


@pytest.fixture(scope='module')
def rows(processor):
  rng = np.random.default_rng(3)
  text = lambda n: [int(i) for i in rng.integers(100, 150000, size=n)]

  def image_row(side, seed):
    ref = processor.process(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8))
    return _row(text(3) + [tj.VISION_START_ID] + [tj.IMAGE_PAD_ID] * ref.num_tokens + [tj.VISION_END_ID] + text(2),
                [ref])
  return {'text': [_row(text(n)) for n in (9, 5, 12, 7)], 'image': [image_row(64, 1), image_row(48, 2)]}


def _ids(outs):
  return [list(o['ids']) for o in outs]


def test_a_request_with_new_shapes_waits_for_its_rehearsal_not_the_others(tiny_model, tokenizer, processor, rows):
  svc = _service(tiny_model, tokenizer, processor, ahead=True)
  try:
    ahead = svc.compile_ahead
    warm_text = svc.submit_rows([rows['text'][0]]).result(timeout=300)   # compiles the one-text-row programs
    assert ahead.submitted == 1 and ahead.rehearsals == 1 and ahead.failed == 0
    again = svc.submit_rows([rows['text'][0]]).result(timeout=300)         # and those of its prefix-cache hit
    assert again[0]['ids'] == warm_text[0]['ids'] and again[0]['cached_tokens'] > 0
    compiled = ahead.submitted
    assert svc.submit_rows([rows['text'][0]]).result(timeout=300)[0]['ids'] == warm_text[0]['ids']
    assert ahead.submitted == compiled, 'a request whose programs ran must not be rehearsed again'

    ahead.gate.clear()                                    # the image request's compile now lasts until the gate
    image = svc.submit_rows([rows['image'][0]])
    text = svc.submit_rows([rows['text'][0]]).result(timeout=300)
    assert not image.done(), 'the image request must wait for its rehearsal'
    assert ahead.submitted == compiled + 1 and ahead.rehearsals == compiled
    assert text[0]['ids'] == warm_text[0]['ids']
    ahead.gate.set()
    image_out = image.result(timeout=300)
    assert ahead.rehearsals == compiled + 1 and ahead.failed == 0
    info = svc.server_info()['internal_states'][0]['compile_ahead']
    assert info['rehearsals'] == compiled + 1 and info['failed'] == 0 and info['warm_programs'] >= 4
  finally:
    svc.close()
  plain = _service(tiny_model, tokenizer, processor, ahead=False)
  try:
    assert _ids(plain.submit_rows([rows['image'][0]]).result(timeout=300)) == _ids(image_out)
    assert _ids(plain.submit_rows([rows['text'][0]]).result(timeout=300)) == _ids(warm_text)
  finally:
    plain.close()


def test_compile_ahead_gives_the_ids_and_logprobs_of_the_plain_server(tiny_model, tokenizer, processor, rows):
  requests = [[r] for r in rows['text'] + rows['image']] + [[rows['text'][1], rows['image'][1]]]
  results = {}
  for ahead in (False, True):
    svc = _service(tiny_model, tokenizer, processor, ahead=ahead, max_batch=4)
    try:
      for _ in range(2):   # cold, then with the shapes compiled (the second round admits more rows at once)
        futures = [svc.submit_rows(r) for r in requests]
        outs = [f.result(timeout=600) for f in futures]
      results[ahead] = outs
      assert svc.stats['peak_kv_slots'] <= 4, svc.stats
      if ahead:
        assert svc.compile_ahead.failed == 0 and svc.compile_ahead.rehearsals >= 1
    finally:
      svc.close()
  for plain, ahead in zip(results[False], results[True]):
    assert _ids(plain) == _ids(ahead)
    for p, a in zip(plain, ahead):
      lp_p, lp_a = np.asarray(p['logprobs']), np.asarray(a['logprobs'])
      np.testing.assert_allclose(lp_a, lp_p, rtol=0, atol=1e-4 * max(1.0, float(np.abs(lp_p).max())))


def _compiled(caplog) -> list[str]:
  """The programs XLA compiled while `caplog` listened (jax's log_compiles lines)."""
  return [r.getMessage().split('of ')[1].split(' ')[0] for r in caplog.records
          if r.getMessage().startswith('Finished XLA compilation of ')]


def test_a_rehearsal_compiles_what_the_admission_and_its_chunk_run(tiny_model, tokenizer, processor, rows, caplog):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16)
  batch = decode_batch.DecodeBatch(sampler, chunk=4, until_first_done=True)
  batch.admit([rows['text'][2].context], [NEW], ['text'])         # a running batch of one text row
  image, other = rows['image'][0].context, rows['image'][1].context
  with jax.log_compiles(True):
    caplog.clear()
    keys = batch.rehearse([image], [NEW], batch.plan([image], [NEW]))()   # joining it: the batch grows, an image
    rehearsed = _compiled(caplog)                                          # prefill
    assert keys == batch.compiles(batch.plan([image], [NEW]))
    caplog.clear()
    batch.admit([image], [NEW], ['image'])
    batch.step()
    assert not [p for p in _compiled(caplog) if p.startswith(('jit(prefill', 'jit(decode', 'jit(_place'))]
    assert any(p.startswith('jit(prefill') for p in rehearsed) and any(p.startswith('jit(decode') for p in rehearsed)
    caplog.clear()                                               # without a rehearsal a new shape compiles here
    batch.admit([other, other], [NEW, NEW], ['a', 'b'])
    assert any(p.startswith('jit(prefill') for p in _compiled(caplog))


def test_a_rehearsal_of_a_prefix_cache_hit_leaves_the_cache_alone(tiny_model, tokenizer, processor, rows, caplog):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, temperature=0.0, max_len=256,
                                   bucket=16, prefix_cache_slots=4)
  first = decode_batch.DecodeBatch(sampler, chunk=8, until_first_done=True)
  text = rows['text'][0].context
  first.admit([text], [NEW], ['first'])
  while first.live:
    first.step()                                                 # its KV is stored in the prefix cache
  cache = sampler.prefix_cache
  batch = decode_batch.DecodeBatch(sampler, chunk=8, until_first_done=True)
  plan = batch.plan([text], [NEW])
  assert plan.prefix[0] > 0, 'the same prompt must hit the prefix cache'
  clock, last_used, pool_k = cache._clock, cache.last_used.copy(), cache.pool['k']   # pylint: disable=W0212
  run = batch.rehearse([text], [NEW], plan)
  with jax.log_compiles(True):
    caplog.clear()
    keys = run()
    assert keys == batch.compiles(plan)
    assert cache._clock == clock and (cache.last_used == last_used).all() and cache.pool['k'] is pool_k  # pylint: disable=W0212
    caplog.clear()
    out = batch.admit([text], [NEW], ['again'], plan=plan)
    assert not [p for p in _compiled(caplog) if p.startswith('jit(prefill')]
  assert out or batch.live == 1

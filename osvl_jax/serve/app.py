"""The HTTP app of `python -m osvl_jax.serve` (FastAPI): SGLang's native endpoints and OpenAI's chat over a
`service.SamplerService` (the endpoints, batching and limits: `service`'s docstring). Bodies are read and parsed so
that a flood of large uploads delays no small request: a body of at most `SMALL_BODY_BYTES` is parsed on the event
loop, a larger one on the HTTP threads, at most `LARGE_BODY_READS` larger ones at once; a request with images waits
in the image gate's queue for a decode thread (`request_limits.ImageGate`)."""

import asyncio
import time
import uuid
from typing import Any

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.serve import auth, request_fields, request_limits
from osvl_jax.serve.request_fields import RequestError, chat_sampling, check_chat_body
from osvl_jax.serve.requests import Row, render_messages
from osvl_jax.serve.service import SamplerService

SMALL_BODY_BYTES = 64 << 10   # a request body up to this size is parsed on the event loop (well under 1 ms)
LARGE_BODY_READS = 4          # larger bodies read at once (`create_app`)



def create_app(service: SamplerService, host: str = '', port: int = 0, api_key: str | None = None):
  """The FastAPI app of `service` (endpoints in the module docstring); with `api_key`, every request but OPTIONS
  and `/health*` needs `Authorization: Bearer <api_key>` (`auth`, as SGLang's `--api-key`)."""
  import fastapi  # pylint: disable=g-import-not-at-top
  from fastapi.responses import JSONResponse, PlainTextResponse  # pylint: disable=g-import-not-at-top
  from starlette.concurrency import run_in_threadpool  # pylint: disable=g-import-not-at-top

  app = fastapi.FastAPI(title='osvl_jax.serve')
  auth.add_api_key_middleware(app, api_key)

  def error(status: int, message: str):
    return JSONResponse(status_code=status, content={'error': {'message': message, 'type': 'invalid_request_error',
                                                               'code': status}})

  large_reads = asyncio.Semaphore(LARGE_BODY_READS)

  async def body_of(request) -> tuple[Any, bool]:
    """(the parsed and checked body, whether it is small: at most SMALL_BODY_BYTES, parsed on the event loop).
    At most LARGE_BODY_READS bodies announced larger, or not announced, are read and parsed at once: a flood of
    large uploads then leaves the event loop, and the GIL, to the small requests (the others wait unread, TCP
    holding them)."""
    announced = request.headers.get('content-length', '')
    if announced.isdigit() and int(announced) <= SMALL_BODY_BYTES:   # the server reads no more than announced
      return request_fields.parse_body(await request_limits.read_body(request, service.limits.max_body_bytes)), True
    async with large_reads:
      raw = await request_limits.read_body(request, service.limits.max_body_bytes)
      if len(raw) <= SMALL_BODY_BYTES:   # a small body sent without Content-Length
        return request_fields.parse_body(raw), True
      return await run_in_threadpool(request_fields.parse_body, raw), False

  async def off_loop(images: bool, small: bool, fn, *args):
    """`fn(*args)`, the parsing of a request: one with images waits in the image gate's queue for a decode thread
    (holding no HTTP thread, so a flood of image requests never delays parsing a text one); a small one runs on
    the event loop (no thread hop: behind a flood, each hop waits for the HTTP threads and the loop); the others
    run on the HTTP thread pool."""
    if images:
      return await asyncio.wrap_future(service.image_gate.submit(fn, *args))
    return fn(*args) if small else await run_in_threadpool(fn, *args)

  def refusal(e: RequestError):
    return error(413 if isinstance(e, request_limits.BodyTooLarge) else 400, str(e))

  @app.api_route('/generate', methods=['POST', 'PUT'])
  async def generate(request: fastapi.Request):
    started = time.time()
    try:
      body, small = await body_of(request)
      rows, is_batch = await off_loop(isinstance(body, dict) and bool(body.get('image_data')), small,
                                      service.parse_generate_request, body)
    except RequestError as e:
      return refusal(e)
    try:
      outs = await asyncio.wrap_future(service.submit_rows(rows))
    except ValueError as e:
      return error(400, str(e))
    except Exception as e:  # pylint: disable=broad-except
      return error(500, f'{type(e).__name__}: {e}')
    rid = body.get('rid') or uuid.uuid4().hex   # a batch: one rid per row, or `{rid}_{k}`
    answers = [service.generate_response(r, o, rid[k] if isinstance(rid, list) else f'{rid}_{k}' if is_batch
                                         else rid, started)
               for k, (r, o) in enumerate(zip(rows, outs))]
    return JSONResponse(answers if is_batch else answers[0])

  @app.post('/update_weights_from_disk')
  async def update_weights_from_disk(request: fastapi.Request):
    try:
      body, _ = await body_of(request)
    except RequestError as e:
      return refusal(e)
    if not isinstance(body, dict) or not isinstance(body.get('model_path'), str):
      return JSONResponse(status_code=400, content={'success': False, 'message': 'model_path (str) is required',
                                                    'num_paused_requests': 0})
    ok, message = await asyncio.wrap_future(service.submit_update(body))
    return JSONResponse(status_code=200 if ok else 400,
                        content={'success': ok, 'message': message, 'num_paused_requests': 0})

  @app.api_route('/flush_cache', methods=['GET', 'POST'])
  async def flush_cache():
    await asyncio.wrap_future(service.submit_flush())
    return PlainTextResponse('Cache flushed.\n')

  @app.get('/health')
  @app.get('/health_generate')
  @app.get('/ready')
  async def health():
    return fastapi.Response(status_code=200)

  @app.get('/model_info')
  @app.get('/get_model_info')
  async def model_info():
    return service.model_info()

  @app.get('/server_info')
  @app.get('/get_server_info')
  async def server_info():
    return service.server_info(host, port)

  @app.get('/v1/models')
  async def models():
    return {'object': 'list', 'data': [{'id': service.served_model_name, 'object': 'model',
                                        'created': int(service.started), 'owned_by': 'osvl_jax',
                                        'root': service.model_path}]}

  @app.post('/v1/chat/completions')
  async def chat_completions(request: fastapi.Request):
    try:
      body, small = await body_of(request)
      check_chat_body(body)
      sampling = chat_sampling(body, service.default_max_new_tokens, service.limits)
      images = any(isinstance(m.get('content'), list) and any(p['type'] == 'image_url' for p in m['content'])
                   for m in body['messages'])
      ids, refs = await off_loop(images, small, render_messages, service.tokenizer, service.image_processor,
                                 body['messages'], service.image_gate)
      service.limits.check_prompt(len(ids), 'messages')
      row = Row(context=engine_lib.Context(ids, refs), **sampling)
    except RequestError as e:
      return refusal(e)
    try:
      (out,) = await asyncio.wrap_future(service.submit_rows([row]))
    except ValueError as e:   # the sampler refusing the row
      return error(400, str(e))
    except Exception as e:  # pylint: disable=broad-except
      return error(500, f'{type(e).__name__}: {e}')
    text = service.text_of(out['ids'], False, out['matched_str'], no_stop_trim=False)
    n = len(out['ids'])
    return {'id': f'chatcmpl-{uuid.uuid4().hex}', 'object': 'chat.completion', 'created': int(time.time()),
            'model': service.served_model_name,
            'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': text},
                         'finish_reason': 'length' if out['finish_reason']['type'] == 'length' else 'stop',
                         'logprobs': None}],
            'usage': {'prompt_tokens': out['prompt_tokens'], 'completion_tokens': n,
                      'total_tokens': out['prompt_tokens'] + n},
            'metadata': {'weight_version': out['weight_version']}}

  return app

"""A TEST DOUBLE of an SGLang 0.5.23 server (SGLang needs a GPU, so it cannot run here), on a real HTTP socket.

Built from SGLang 0.5.23's documented `/generate` schema (`tests/serve/sglang_schema.json`, made from its
`io_struct.py` / `SamplingParams`) and from what its source does with the fields the client sends:

  * strict JSON (SGLang parses bodies with orjson: no NaN / Infinity); unknown fields -> 400;
  * `input_ids` with ONE `<|image_pad|>` per image; each `image_data` data URL decoded and processed (here by
    `trajectory.ImageProcessor`, SGLang's by the folder's `preprocessor_config.json`), and the i-th pad expanded
    to that image's feature count, the other ids kept verbatim (`SGLANG_MM_AVOID_RETOKENIZE`,
    `BaseMultimodalProcessor._expand_input_ids`); a pad/image count mismatch -> 400;
  * `meta_info.prompt_tokens` = the expanded prompt's length (`len(req.origin_input_ids)`), plus
    `prompt_tokens_offset` to play a server that drifted;
  * `GET /model_info` answers `model_info`; a worker in trouble is played by `status` (each `/generate` answered
    with that HTTP error) and `die_after` (after that many answered `/generate` requests, the next one's connection
    is dropped and the server stops listening: a killed worker);
  * the "model" prefers, at each position, the next id of a `ScriptedEngine` turn over the expanded context (the
    project's scripted policy), with logit 0, and a plain id ('x') with logit -5; `sampling_params.logit_bias` is
    added to those logits before the greedy choice and the returned log-probs, as SGLang's
    `SamplingBatchInfo.apply_logits_bias` does; the turn ends at a `stop_token_ids` id (kept: `no_stop_trim`) or
    at `max_new_tokens`.
"""

import base64
import contextlib
import io
import json
import math
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

from osvl_jax import trajectory as tj
from osvl_jax.rollout import engine as engine_lib

SCHEMA = json.loads((pathlib.Path(__file__).parents[1] / 'serve' / 'sglang_schema.json').read_text())
FALLBACK_LOGIT = -5.0


class BadRequest(ValueError):
  pass


def _strict(constant):
  raise BadRequest(f'{constant} is not JSON')


def _decode_image(url: str) -> np.ndarray:
  head, _, data = url.partition(',')
  if not head.startswith('data:image/') or not head.endswith(';base64'):
    raise BadRequest(f'image_data item {head[:40]!r} is not a base64 data URL')
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert('RGB'))


class SGLangDouble:
  """The double's state; `serve()` runs it on 127.0.0.1.

  Attributes:
    requests: the raw bytes of every `/generate` body, in arrival order.
    bodies: the same, parsed.
    model_info: the `GET /model_info` answer.
    status: 200, or the HTTP error status every `/generate` gets.
    die_after: None, or the `/generate` requests answered before the worker dies.
  """

  def __init__(self, tokenizer, processor: tj.ImageProcessor, script, prompt_tokens_offset: int = 0,
               model_info: dict | None = None):
    self.tokenizer, self.processor = tokenizer, processor
    self.policy = engine_lib.ScriptedEngine(script, tokenizer)
    self.prompt_tokens_offset = prompt_tokens_offset
    self.model_info = model_info or {'model_path': 'scripted-policy', 'weight_version': 'default'}
    self.status, self.die_after, self.answered = 200, None, 0
    self.fallback_id = tokenizer.encode('x', add_special_tokens=False)[0]
    self.requests: list[bytes] = []
    self.bodies: list[dict] = []
    self._lock = threading.Lock()

  def generate(self, raw: bytes) -> dict:
    """One `/generate` answer for the body `raw` (raises BadRequest for what SGLang refuses with a 400)."""
    try:
      body = json.loads(raw, parse_constant=_strict)
    except json.JSONDecodeError as e:
      raise BadRequest(f'not JSON: {e}') from e
    with self._lock:
      self.requests.append(raw)
      self.bodies.append(body)
    if set(body) - set(SCHEMA['GenerateReqInput']):
      raise BadRequest(f'unknown fields {set(body) - set(SCHEMA["GenerateReqInput"])}')
    sp = body.get('sampling_params') or {}
    if set(sp) - set(SCHEMA['SamplingParams']):
      raise BadRequest(f'unknown sampling_params {set(sp) - set(SCHEMA["SamplingParams"])}')
    images = [self.processor.process(_decode_image(u)) for u in body.get('image_data') or []]
    sent = [int(i) for i in body['input_ids']]
    if sent.count(tj.IMAGE_PAD_ID) != len(images):
      raise BadRequest(f'prompt has {sent.count(tj.IMAGE_PAD_ID)} image placeholder token(s) but '
                       f'{len(images)} image(s) were provided')
    counts = iter([im.num_tokens for im in images])
    ids = [t for i in sent for t in ([i] * next(counts) if i == tj.IMAGE_PAD_ID else [i])]
    (preferred,) = self.policy.generate([(np.asarray(ids, np.int32), images)])
    bias = {int(k): float(v) for k, v in (sp.get('logit_bias') or {}).items()}
    stop_ids = set(sp.get('stop_token_ids') or ())
    out, lps, reason = [], [], None
    for p in preferred.ids.tolist()[:int(sp.get('max_new_tokens', 128))]:
      logits = {p: 0.0 + bias.get(p, 0.0), self.fallback_id: FALLBACK_LOGIT + bias.get(self.fallback_id, 0.0)}
      chosen = max(logits, key=logits.get)
      top = max(logits.values())
      lps.append(logits[chosen] - top - math.log(sum(math.exp(v - top) for v in logits.values())))
      out.append(chosen)
      if chosen in stop_ids:
        reason = {'type': 'stop', 'matched': chosen}
        break
    reason = reason or {'type': 'length', 'length': len(out)}
    return {'text': self.tokenizer.decode(out), 'output_ids': out, 'meta_info': {
        'id': f'r{len(self.bodies)}', 'finish_reason': reason, 'weight_version': 'default',
        'prompt_tokens': len(ids) + self.prompt_tokens_offset, 'completion_tokens': len(out), 'cached_tokens': 0,
        'output_token_logprobs': [[lp, i, None] for lp, i in zip(lps, out)]}}

  @contextlib.contextmanager
  def serve(self, port: int = 0):
    """Runs the double on `port` (0: a free one) of 127.0.0.1 in a thread; yields its base URL."""
    double = self

    class Handler(BaseHTTPRequestHandler):
      def log_message(self, *args):  # quiet
        pass

      def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def do_GET(self):  # pylint: disable=invalid-name
        if self.path == '/model_info':
          return self._send(200, double.model_info)
        self._send(200 if self.path == '/health' else 404, {})

      def do_POST(self):  # pylint: disable=invalid-name
        raw = self.rfile.read(int(self.headers.get('Content-Length', 0)))
        if self.path != '/generate':
          return self._send(404, {'error': self.path})
        if double.status != 200:
          return self._send(double.status, {'error': {'message': f'scripted status {double.status}'}})
        with double._lock:  # pylint: disable=protected-access
          dies = double.die_after is not None and double.answered >= double.die_after
          double.answered += not dies
        if dies:  # killed: this connection dropped unanswered, the port closed
          self.close_connection = True
          threading.Thread(target=httpd.shutdown, daemon=True).start()
          httpd.socket.close()
          return None
        try:
          return self._send(200, double.generate(raw))
        except BadRequest as e:
          return self._send(400, {'error': {'message': str(e)}})

    httpd = ThreadingHTTPServer(('127.0.0.1', port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
      yield f'http://127.0.0.1:{httpd.server_address[1]}'
    finally:
      httpd.shutdown()
      httpd.server_close()
      thread.join(timeout=10)

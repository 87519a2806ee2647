"""A TEST DOUBLE of an API model behind an OpenAI-compatible `/v1/chat/completions` endpoint (a frontier model cannot
run here), on a real HTTP socket of 127.0.0.1.

It answers each request with what `answer(body, n)` returns (n: the request's arrival index, from 0): a reply
text, a `Reply` (text, finish_reason, reasoning_content, native tool_calls, usage, or an HTTP error status with
its Retry-After), and records every parsed body and its `Authorization` header; `GET /v1/models` lists `models`.
`answer` runs in the request's server thread: it may sleep (a slow endpoint).
It checks what an OpenAI endpoint checks of the vision schema: `model`, a non-empty `messages` list of
{role, content: str | [text / image_url parts]}, every image a base64 PNG / JPEG data URL (decoded into `images`).
"""

import base64
import contextlib
import dataclasses
import io
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


@dataclasses.dataclass
class Reply:
  text: str = ''
  finish_reason: str = 'stop'
  reasoning_content: str | None = None
  status: int = 200   # != 200: answered with this HTTP status and an OpenAI error body
  usage: dict | None = None   # the reply's `usage`; None: USAGE
  tool_calls: list | None = None   # the message's native `tool_calls` ([{'name', 'arguments': JSON text}])
  retry_after: str | None = None   # the `Retry-After` header of an error answer


USAGE = {'prompt_tokens': 100, 'completion_tokens': 7, 'total_tokens': 107}


def decode_image(url: str) -> np.ndarray:
  head, _, data = url.partition(',')
  if not head.startswith('data:image/') or not head.endswith(';base64'):
    raise ValueError(f'image_url {head[:40]!r} is not a base64 data URL')
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert('RGB'))


class ChatDouble:
  """The double's state; `serve()` runs it.

  Attributes:
    bodies: every request body, parsed, in arrival order.
    auth: the `Authorization` header of every request (None when absent), in arrival order.
    images: per request, the decoded images (uint8 [H, W, 3]) of its messages, in order.
    models: the model cards `GET /v1/models` lists.
  """

  def __init__(self, answer: Callable[[dict, int], str | Reply], models: list[dict] | None = None):
    self.answer = answer
    self.models = list(models or [])
    self.bodies: list[dict] = []
    self.images: list[list[np.ndarray]] = []
    self.auth: list[str | None] = []
    self._lock = threading.Lock()

  def complete(self, body: dict, auth: str | None = None) -> tuple[int, dict, dict]:
    """(status, JSON answer, extra headers) of one request (`auth`: its Authorization header)."""
    if not isinstance(body.get('model'), str) or not body['model']:
      return 400, {'error': {'message': 'model is required'}}, {}
    messages = body.get('messages')
    if not isinstance(messages, list) or not messages:
      return 400, {'error': {'message': 'messages must be a non-empty list'}}, {}
    images = []
    for m in messages:
      if m.get('role') not in ('system', 'user', 'assistant') or not isinstance(m.get('content'), (str, list)):
        return 400, {'error': {'message': f'bad message {m!r}'[:200]}}, {}
      for part in m['content'] if isinstance(m['content'], list) else ():
        if part.get('type') == 'image_url':
          images.append(decode_image(part['image_url']['url']))
        elif part.get('type') != 'text' or not isinstance(part.get('text'), str):
          return 400, {'error': {'message': f'bad part {part!r}'[:200]}}, {}
    with self._lock:
      n = len(self.bodies)
      self.bodies.append(body)
      self.images.append(images)
      self.auth.append(auth)
    reply = self.answer(body, n)
    reply = reply if isinstance(reply, Reply) else Reply(str(reply))
    if reply.status != 200:
      headers = {'Retry-After': reply.retry_after} if reply.retry_after is not None else {}
      return reply.status, {'error': {'message': f'scripted status {reply.status}', 'type': 'server_error'}}, headers
    message = {'role': 'assistant', 'content': reply.text}
    if reply.reasoning_content is not None:
      message['reasoning_content'] = reply.reasoning_content
    if reply.tool_calls is not None:
      message['tool_calls'] = [{'id': f'call_{k}', 'type': 'function', 'function': call}
                               for k, call in enumerate(reply.tool_calls)]
    return 200, {'id': f'chatcmpl-{n}', 'object': 'chat.completion', 'created': 0, 'model': body['model'],
                 'choices': [{'index': 0, 'message': message, 'finish_reason': reply.finish_reason}],
                 'usage': dict(USAGE if reply.usage is None else reply.usage)}, {}

  @contextlib.contextmanager
  def serve(self):
    """Runs the double on a free port of 127.0.0.1 in a thread; yields its base URL (with '/v1')."""
    double = self

    class Handler(BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):  # quiet
        pass

      def do_GET(self):  # pylint: disable=invalid-name
        if self.path == '/v1/models':
          self._send(200, {'object': 'list', 'data': double.models}, {})
        else:
          self._send(404, {'error': {'message': self.path}}, {})

      def do_POST(self):  # pylint: disable=invalid-name
        raw = self.rfile.read(int(self.headers.get('Content-Length', 0)))
        if self.path != '/v1/chat/completions':
          status, out, headers = 404, {'error': {'message': self.path}}, {}
        else:
          status, out, headers = double.complete(json.loads(raw), self.headers.get('Authorization'))
        self._send(status, out, headers)

      def _send(self, status, out, headers):
        data = json.dumps(out).encode()
        try:
          self.send_response(status)
          for k, v in headers.items():
            self.send_header(k, v)
          self.send_header('Content-Type', 'application/json')
          self.send_header('Content-Length', str(len(data)))
          self.end_headers()
          self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
          pass

    httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
      yield f'http://127.0.0.1:{httpd.server_address[1]}/v1'
    finally:
      httpd.shutdown()
      httpd.server_close()
      thread.join(timeout=10)

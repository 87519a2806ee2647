"""Test doubles of the remote services (not the services): small HTTP servers on 127.0.0.1, each a thread in the
test process, answering with the documented request/response JSON of Serper, the Jina reader, an
OpenAI-compatible chat endpoint, SerpApi Google Lens and PaddleX OCR serving (see tools/remote.py).

A double's `mode` selects its behaviour: `ok`, `429` (always, or `429_once` then ok), `500`, `slow` (sleeps
`delay` s before answering), `malformed` (2xx with a body that is not JSON). `requests` records
(method, path, headers, body) of every request it got.
"""

import http.server
import json
import threading
import time
import urllib.parse


class ServiceDouble:
  """A test double HTTP server on 127.0.0.1 (a daemon thread); use as a context manager.

  Attributes:
    url: `http://127.0.0.1:<port>`.
    mode: behaviour (see module docstring); may be changed between requests.
    delay: seconds a `slow` answer waits.
    requests: list of dicts {method, path, query, headers, body}.
  """

  def __init__(self, respond, mode: str = 'ok', delay: float = 1.0):
    self.respond, self.mode, self.delay = respond, mode, delay
    self.requests: list[dict] = []
    double = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):  # Quiet.
        pass

      def _handle(self, method):
        n = int(self.headers.get('content-length') or 0)
        raw = self.rfile.read(n) if n else b''
        parts = urllib.parse.urlsplit(self.path)
        req = {'method': method, 'path': parts.path, 'query': dict(urllib.parse.parse_qsl(parts.query)),
               'headers': {k.lower(): v for k, v in self.headers.items()},
               'body': json.loads(raw) if raw else None}
        double.requests.append(req)
        mode = double.mode
        if mode == '429_once':
          double.mode = 'ok'
        if mode == 'slow':
          time.sleep(double.delay)
        if mode in ('429', '429_once', '500'):
          status, body = int(mode[:3]), b'{"message": "error"}'
        elif mode == 'malformed':
          status, body = 200, b'{"organic": [ not json'
        else:
          status, body = 200, json.dumps(double.respond(req)).encode()
        self.send_response(status)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        try:
          self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
          pass

      def do_GET(self):
        self._handle('GET')

      def do_POST(self):
        self._handle('POST')

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self._server.daemon_threads = True
    self.url = f'http://127.0.0.1:{self._server.server_address[1]}'
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()


def serper(req):
  """Serper /search: `{"organic": [{"title", "link", "snippet", "position"}]}`."""
  q = req['body']['q']
  return {'searchParameters': {'q': q}, 'organic': [
      {'title': f'{q} - Wikipedia', 'link': 'http://127.0.0.1:9/wiki', 'snippet': f'{q} is a famous monument.',
       'position': 1},
      {'title': f'Visit {q}', 'link': 'http://127.0.0.1:9/visit', 'snippet': 'Opening hours and tickets.',
       'position': 2}][:req['body'].get('num', 10)]}


def jina(req):
  """Jina reader GET /<url> with Accept: application/json: `{"code": 200, "data": {"title", "url", "content"}}`."""
  return {'code': 200, 'status': 20000, 'data': {'title': 'Page title', 'url': req['path'][1:],
                                                 'content': 'The monument was built between 1631 and 1653.'}}


def chat(req):
  """OpenAI-compatible /chat/completions: `{"choices": [{"message": {"role", "content"}}]}`."""
  return {'id': 'x', 'object': 'chat.completion', 'choices': [
      {'index': 0, 'message': {'role': 'assistant', 'content': 'Built 1631-1653 in Agra.'},
       'finish_reason': 'stop'}]}


def lens(req):
  """SerpApi Google Lens /search.json: `{"visual_matches": [{"position", "title", "link", "source"}]}`."""
  return {'search_metadata': {'status': 'Success'}, 'visual_matches': [
      {'position': 1, 'title': 'Taj Mahal, Agra', 'link': 'https://en.wikipedia.org/wiki/Taj_Mahal',
       'source': 'Wikipedia'}]}


def paddlex_ocr(req):
  """PaddleX serving /ocr: `{"errorCode": 0, "result": {"ocrResults": [{"prunedResult": {rec_texts, ...}}]}}`."""
  assert req['body']['fileType'] == 1 and req['body']['file']
  return {'logId': 'x', 'errorCode': 0, 'errorMsg': 'Success', 'result': {'ocrResults': [{'prunedResult': {
      'rec_texts': ['WORLD', 'HELLO'], 'rec_scores': [0.99, 0.98],
      'rec_boxes': [[60, 10, 120, 30], [0, 12, 50, 30]]}}], 'dataInfo': {'width': 128, 'height': 64}}}

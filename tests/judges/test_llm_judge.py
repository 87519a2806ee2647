"""LLM judges over an OpenAI-compatible endpoint (osvl_jax/judges/llm.py, registry.py).

`FakeChatServer` is a TEST DOUBLE: a thread on 127.0.0.1 that implements the OpenAI `/v1/chat/completions`
request / response schema and answers from a script (a reply text, HTTP 500, or a stall past the client timeout).
"""

import http.server
import json
import threading
import time

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.judges import base as judges_base
from osvl_jax.judges import llm, registry, rule
from osvl_jax.train import grpo, rollouts
from tools import base


class FakeChatServer:
  """Test double of an OpenAI-compatible chat server.

  `script` is a list of actions consumed one per request (the last one repeats): a str is the reply content;
  ('status', 500) answers that HTTP error; ('sleep', s) stalls s seconds before replying 'Correct';
  ('raw', body) sends a non-schema JSON body. Every request body is kept in `requests`.
  """

  def __init__(self, script):
    self.script, self.requests = list(script), []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        server.requests.append({'path': self.path, 'body': body, 'auth': self.headers.get('Authorization')})
        action = server.script.pop(0) if len(server.script) > 1 else server.script[0]
        if isinstance(action, tuple) and action[0] == 'status':
          return self._send(action[1], {'error': {'message': 'boom', 'type': 'server_error'}})
        if isinstance(action, tuple) and action[0] == 'raw':
          return self._send(200, action[1])
        if isinstance(action, tuple) and action[0] == 'sleep':
          time.sleep(action[1])
          action = 'Correct'
        if self.path != '/v1/chat/completions':
          return self._send(404, {'error': {'message': 'not found'}})
        self._send(200, {
            'id': 'chatcmpl-test', 'object': 'chat.completion', 'created': int(time.time()),
            'model': body['model'],
            'choices': [{'index': 0, 'finish_reason': 'stop',
                         'message': {'role': 'assistant', 'content': action}}],
            'usage': {'prompt_tokens': 1, 'completion_tokens': 1, 'total_tokens': 2}})

      def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        try:
          self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
          pass

    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.httpd.daemon_threads = True
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
    self.thread.start()
    self.base_url = f'http://127.0.0.1:{self.httpd.server_address[1]}/v1'

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def serve():
  servers = []

  def start(script):
    servers.append(FakeChatServer(script))
    return servers[-1]

  yield start
  for s in servers:
    s.close()


def _judge(server, **overrides):
  cfg = dict(name='llm', base_url=server.base_url, model='judge-model', timeout_s=2.0, max_retries=2,
             retry_backoff_s=0.0)
  cfg.update(overrides)
  return registry.get_judge(cfg)


def test_accuracy_judge_sends_the_openai_schema_and_reads_the_verdict(serve, monkeypatch):
  monkeypatch.setenv('OPENAI_API_KEY', 'sk-test')
  server = serve(['Correct', 'Incorrect'])
  judge = _judge(server)
  assert judge.accuracy('Which city?', 'It is Agra.', ['Agra']) == judges_base.Verdict(1.0, None, 'Correct')
  assert judge.accuracy('Which city?', 'Delhi', ['Agra']).score == 0.0
  request = server.requests[0]
  assert request['path'] == '/v1/chat/completions' and request['auth'] == 'Bearer sk-test'
  assert request['body']['model'] == 'judge-model' and request['body']['temperature'] == 0.0
  prompt = request['body']['messages'][0]['content']
  assert 'Ground-truth answer (aliases separated by " | "): Agra' in prompt and 'It is Agra.' in prompt


def test_no_response_and_no_tool_calls_need_no_judge_call(serve):
  server = serve(['Correct'])
  judge = _judge(server)
  assert judge.accuracy('q', None, ['a']).score == 0.0
  assert judge.accuracy('q', '   ', ['a']).score == 0.0
  assert judge.query_quality('q', [], []).score == 0.0
  assert server.requests == []


def test_query_judge_scores_the_pre_fatal_calls(serve):
  server = serve(['<think>fine queries</think>\nScore: 0.75'])
  calls = [('text_search', {'query': 'Taj Mahal city'}), ('crop', {'image': 'img_1'})]
  results = [base.ToolResult(ok=True, text='[1] Taj Mahal: a mausoleum in Agra'),
             base.error('bad_arguments', "missing argument 'x'")]
  verdict = _judge(server).query_quality('Which city?', calls, results)
  assert verdict.score == 0.75 and verdict.error is None
  prompt = server.requests[0]['body']['messages'][0]['content']
  assert '[1] text_search {"query": "Taj Mahal city"}' in prompt and 'mausoleum in Agra' in prompt
  assert "error (bad_arguments): missing argument 'x'" in prompt


@pytest.mark.parametrize('text, want', [
    ('Correct', 1.0), ('**Incorrect**', 0.0), ('The response is correct.', 1.0), ('It is not correct.', 0.0),
    ('{"correct": true}', 1.0), ('{"correct": false}', 0.0), ('yes', 1.0), ('1', 1.0), ('0', 0.0),
    ('<think>maybe incorrect? no</think>Correct', 1.0),
    # the paper's format: the field decides, whatever words the reasoning uses
    ('correct: no\nreasoning: the response is correct about the city but names the wrong year', 0.0),
    ('Correct: Yes\nReasoning: it is not incorrect to say Agra.', 1.0), ('**correct:** no', 0.0),
    ('reasoning: the answer matches.\ncorrect: yes', 1.0), ('CORRECT = NO', 0.0),
])
def test_parse_binary(text, want):
  assert llm.parse_binary(text) == want


@pytest.mark.parametrize('text, want', [
    ('Score: 0.7', 0.7), ('score = 7/10', 0.7), ('**Score:** 70%', 0.7), ('{"score": 0.25}', 0.25),
    ('0.4', 0.4), ('8', 0.8), ('60%', 0.6), ('I would say 3 out of 4', 0.75), ('Score: 1', 1.0),
])
def test_parse_score(text, want):
  assert llm.parse_score(text) == pytest.approx(want)


@pytest.mark.parametrize('text', ['', None, 'Maybe.', 'Score: 250', 'Score: -1', '<think>Correct</think>',
                                  'correct: yes\nreasoning: on reflection\ncorrect: no'])
def test_unparseable_replies_raise_parse_error(text):
  with pytest.raises(llm.JudgeParseError):
    llm.parse_score(text) if text and 'Score' in text else llm.parse_binary(text)


def test_malformed_reply_and_500_are_retried_then_succeed(serve):
  server = serve(['I cannot decide.', ('status', 500), ('raw', {'unexpected': 'body'}), 'Correct'])
  judge = _judge(server, max_retries=3)
  verdict = judge.accuracy('q', 'Agra', ['Agra'])
  assert verdict == judges_base.Verdict(1.0, None, 'Correct')
  assert len(server.requests) == 4
  assert judge.stats()['retries'] == 3 and judge.stats()['errors'] == 0


def test_errors_after_bounded_retries_are_recorded_and_fall_back(serve):
  server = serve([('status', 500)])
  judge = _judge(server, max_retries=2)
  verdict = judge.accuracy('q', 'It is Agra', ['Agra'])
  assert len(server.requests) == 3  # 1 + max_retries, then give up
  assert verdict.score == 1.0 and 'InternalServerError' in verdict.error  # on_error='rule': the rule judge's value
  assert judge.stats()['errors'] == 1
  zero = _judge(server, max_retries=0, on_error='zero').accuracy('q', 'It is Agra', ['Agra'])
  assert zero.score == 0.0 and zero.error


def test_timeout_is_retried_then_recorded_never_raised(serve):
  server = serve([('sleep', 1.5)])
  judge = _judge(server, timeout_s=0.3, max_retries=1)
  t0 = time.time()
  verdict = judge.query_quality('q', [('text_search', {'query': 'x'})], [base.ToolResult(ok=True, text='hit')])
  assert time.time() - t0 < 1.5
  assert verdict.error is not None and 'Timeout' in verdict.error
  assert 0.0 <= verdict.score <= 1.0  # the rule judge's query_quality
  assert judge.stats() == {'calls': 1, 'errors': 1, 'retries': 1, 'cache_hits': 0}


def test_identical_judgements_are_cached(serve):
  server = serve(['Correct'])
  judge = _judge(server)
  for _ in range(3):
    assert judge.accuracy('q', 'Agra', ['Agra']).score == 1.0
  assert len(server.requests) == 1 and judge.stats()['cache_hits'] == 2


def test_registry_names_and_config_errors():
  assert registry.JUDGES.names() == ['llm', 'rule']
  assert isinstance(registry.get_judge(None), rule.RuleJudge)
  with pytest.raises(ValueError, match='not one of'):
    registry.get_judge({'name': 'gpt'})
  with pytest.raises(ValueError, match='base_url'):
    registry.get_judge({'name': 'llm'})


ANSWER = tj.render_assistant_text('It is Agra.', response='Agra')
SEARCH = tj.render_assistant_text('Look it up.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})


def _trajectory(texts, results):
  tokenizer = tj.load_tokenizer()
  builder = tj.TrajectoryBuilder(tokenizer, tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64), [])
  builder.start('Which city is this?', np.zeros((32, 32, 3), np.uint8))
  for text, result in zip(texts, results):
    builder.append_assistant_text(text)
    if result is not None:
      builder.append_observation(result)
  return builder.finish(answers=['Agra'])


def test_rollout_score_and_prepare_batch_use_the_configured_judge(serve):
  server = serve(['Correct', 'Score: 0.5', 'Incorrect'])
  traj = _trajectory([SEARCH, ANSWER], [base.ToolResult(ok=True, text='[1] Agra: a city'), None])
  judge = _judge(server)
  s = rollouts.score(traj, alpha=0.8, judge=judge)
  # r = r_fmt · (0.8 r_acc + 0.2 r_query) = 1 · (0.8 · 1 + 0.2 · 0.5) = 0.9
  assert (s['r_fmt'], s['r_acc'], s['r_query'], s['reward'], s['judge_errors']) == (1.0, 1.0, 0.5, 0.9, 0)
  # a judge that is down: scoring still completes, the errors are counted, the rule judge's values are used
  down = serve([('status', 500)])
  s = rollouts.score(traj, judge=_judge(down, max_retries=1))
  assert s['judge_errors'] == 2 and s['r_acc'] == 1.0
  cfg = grpo.ml_collections.ConfigDict(dict(alpha=0.8, num_generations=2, fatal_mode='mask_clamp', delta=1e-6,
                                            length_multiple=64, loss_multiple=32))
  _, _, scores, _ = grpo.prepare_batch([traj, traj], cfg, _judge(down, max_retries=0, max_concurrency=2))
  assert [x['judge_errors'] for x in scores] == [2, 2]

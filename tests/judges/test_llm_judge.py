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
from osvl_jax.train import grpo, grpo_batch, rollouts
from tools import base

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets (batching.bucket_sizes)


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
  prompt = request['body']['messages'][0]['content']   # accuracy_v2, the default
  assert 'Reference answer (equivalent forms separated by " | "): Agra' in prompt
  assert "The agent's response:\nIt is Agra.\n" in prompt
  assert prompt.endswith('correct: <yes or no>\nreasoning: <one or two sentences on why>')


def test_defaults_are_the_paper_protocols_and_the_old_versions_one_value_away(serve):
  server = serve(['correct: yes\nreasoning: the response names Agra.', 'Correct'])
  judge = _judge(server)
  assert judge.prompt_names == {'accuracy': 'accuracy_v2', 'query_quality': 'query_quality_v3', 'process': 'process_v1'}
  verdict = judge.accuracy('Which city?', 'It is Agra, in India.', ['Agra', 'Agra city'])
  assert verdict == judges_base.Verdict(1.0, None, 'correct: yes\nreasoning: the response names Agra.')
  assert 'separated by " | "): Agra | Agra city' in server.requests[0]['body']['messages'][0]['content']
  old = _judge(server, prompts={'accuracy': 'accuracy_v1', 'query_quality': 'query_quality_v2'})
  assert old.prompt_names['accuracy'] == 'accuracy_v1' and old.prompt_names['query_quality'] == 'query_quality_v2'
  assert old.accuracy('Which city?', 'Agra', ['Agra']).score == 1.0
  assert server.requests[1]['body']['messages'][0]['content'].endswith('exactly one word: Correct or Incorrect.')


def test_no_response_and_no_tool_calls_need_no_judge_call(serve):
  server = serve(['Correct'])
  judge = _judge(server)
  assert judge.accuracy('q', None, ['a']).score == 0.0
  assert judge.accuracy('q', '   ', ['a']).score == 0.0
  assert judge.query_quality('q', [], []).score == 0.0
  assert server.requests == []


CALLS = [('text_search', {'query': 'Taj Mahal city'}), ('crop', {'image': 'img_1'})]
RESULTS = [base.ToolResult(ok=True, text='[1] Taj Mahal: a mausoleum in Agra'),
           base.error('bad_arguments', "missing argument 'x'")]


def test_query_judge_v2_scores_the_pre_fatal_calls(serve):
  server = serve(['<think>fine queries</think>\nScore: 0.75'])
  judge = _judge(server, prompts={'query_quality': 'query_quality_v2'})   # the earlier wording, by name
  verdict = judge.query_quality('Which city?', CALLS, RESULTS, answers=['Agra'], response='Agra')
  assert verdict.score == 0.75 and verdict.error is None
  prompt = server.requests[0]['body']['messages'][0]['content']
  assert '[1] text_search {"query": "Taj Mahal city"}' in prompt and 'mausoleum in Agra' in prompt
  assert "error (bad_arguments): missing argument 'x'" in prompt
  assert 'Agra |' not in prompt and 'final answer:' not in prompt   # v2 has no answer fields: they are left out


def test_query_judge_v3_sees_answers_final_answer_and_the_summary(serve):
  reply = 'score: 0.7\nreasoning: The text search found the city at once. A score of 0.3 would undervalue it.'
  server = serve([reply])
  verdict = _judge(server).query_quality('Which city?', CALLS, RESULTS, answers=['Agra', 'Agra city'],
                                         response='  It is Agra.  ')
  assert verdict == judges_base.Verdict(0.7, None, reply)   # the `score:` line decides, not the reasoning's 0.3
  prompt = server.requests[0]['body']['messages'][0]['content']
  assert prompt.startswith('You are assessing the searches')
  assert 'Rate only its search calls (text_search, image_search);' in prompt
  assert ('Question: Which city?\nReference answer: Agra | Agra city\nThe agent\'s final answer: It is Agra.\n'
          in prompt)
  assert ('\nStep 1 [search] text_search {"query": "Taj Mahal city"}\n  -> ok: [1] Taj Mahal: a mausoleum in Agra'
          "\nStep 2 [other] crop {\"image\": \"img_1\"}\n  -> error (bad_arguments): missing argument 'x'\n\n"
          in prompt)
  assert prompt.endswith('score: <a number between 0 and 1>\nreasoning: <2-3 sentences>')
  _judge(server).query_quality('Which city?', CALLS, RESULTS)   # no answers, no final response
  prompt = server.requests[1]['body']['messages'][0]['content']
  assert "Reference answer: (not given)\nThe agent's final answer: (none: the agent gave no final answer)\n" in prompt


def test_the_trajectory_summary_keeps_20_steps_200_argument_and_400_result_characters():
  assert (llm.SUMMARY_MAX_STEPS, llm.SUMMARY_ARGUMENT_CHARS, llm.SUMMARY_RESULT_CHARS) == (20, 200, 400)
  calls = ([('text_search', {'query': 'q' * 250}),
            ('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 10, 'height': 10})] +
           [('image_search', {'image': 'img_1'})] * 18 + [('text_search', {'query': 'x'})] * 2)
  results = ([base.ToolResult(ok=True, text='r' * 450), base.error('bad_arguments', 'box  outside\nthe image')] +
             [base.error('no_result', 'No visual matches.')] * 18 + [None] * 2)
  lines = llm.summarize_trajectory(calls, results).split('\n')
  # '{"query": "' is 11 characters: 189 q's fill the 200; the result keeps 400 of its 450 r's
  assert lines[:4] == ['Step 1 [search] text_search {"query": "' + 'q' * 189 + ' ...', '  -> ok: ' + 'r' * 400 + ' ...',
                       'Step 2 [other] crop {"height": 10, "image": "img_1", "width": 10, "x": 0, "y": 0}',
                       '  -> error (bad_arguments): box outside the image']
  assert lines[4:6] == ['Step 3 [search] image_search {"image": "img_1"}', '  -> nothing found: No visual matches.']
  assert lines[38:] == ['Step 20 [search] image_search {"image": "img_1"}', '  -> nothing found: No visual matches.',
                        '(2 later tool calls not shown; the summary keeps the first 20)']
  assert len(lines) == 41
  exact = llm.summarize_trajectory([('text_search', {'query': 'q' * 187})], [None])   # 11 + 187 + 2 = 200: not cut
  assert exact == 'Step 1 [search] text_search {"query": "' + 'q' * 187 + '"}\n  -> no result: '
  assert llm.summarize_trajectory(calls[:21], results[:21]).endswith('(1 later tool call not shown; the summary '
                                                                     'keeps the first 20)')
  assert llm.summarize_trajectory([], []) == ''
  with pytest.raises(ValueError, match='max_steps=0'):
    llm.summarize_trajectory(calls, results, max_steps=0)


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


def test_check_config_names_the_missing_fields_before_any_judge_is_built():
  registry.check_config(None)                          # the rule judge needs nothing
  with pytest.raises(ValueError, match=r"judge.name='llm' needs judge.base_url and judge.model \(empty\).*"
                                       r'--config.judge.base_url=http://127.0.0.1:8000/v1 --config.judge.model=MODEL'):
    registry.check_config({'name': 'llm'})
  with pytest.raises(ValueError, match=r"needs judge.model \(empty\)"):
    registry.check_config({'name': 'llm', 'base_url': 'http://127.0.0.1:1/v1', 'model': '  '})
  ok = {'name': 'llm', 'base_url': 'http://127.0.0.1:1/v1', 'model': 'm'}
  registry.check_config(ok)                            # no request: nothing listens on port 1
  with pytest.raises(ValueError, match="judge.name: judge 'gpt' is not one of"):
    registry.check_config({'name': 'gpt'})
  with pytest.raises(ValueError, match=r"judge.prompts.accuracy='query_quality_v3'.*\['final_answer', "
                                       r"'search_tools', 'trajectory'\] that the judge does not fill"):
    registry.check_config({**ok, 'prompts': {'accuracy': 'query_quality_v3'}})
  with pytest.raises(ValueError, match=r"judge.prompts.accuracy='accuracy_v9'.*not found"):
    registry.check_config({**ok, 'prompts': {'accuracy': 'accuracy_v9'}})
  with pytest.raises(ValueError, match="judge.on_error='retry'"):
    registry.check_config({**ok, 'on_error': 'retry'})


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
  server = serve(['correct: yes\nreasoning: Agra.', 'score: 0.5\nreasoning: one search.', 'Incorrect'])
  traj = _trajectory([SEARCH, ANSWER], [base.ToolResult(ok=True, text='[1] Agra: a city'), None])
  judge = _judge(server)
  s = rollouts.score(traj, alpha=0.8, judge=judge)
  # r = r_fmt · (0.8 r_acc + 0.2 r_query) = 1 · (0.8 · 1 + 0.2 · 0.5) = 0.9
  assert (s['r_fmt'], s['r_acc'], s['r_query'], s['reward'], s['judge_errors']) == (1.0, 1.0, 0.5, 0.9, 0)
  prompt = server.requests[1]['body']['messages'][0]['content']   # the query judge got the answer and the response
  assert ("Reference answer: Agra\nThe agent's final answer: Agra\n" in prompt and
          '\nStep 1 [search] text_search {"query": "Agra"}\n  -> ok: [1] Agra: a city\n' in prompt)
  # a judge that is down: scoring still completes, the errors are counted, the rule judge's values are used
  down = serve([('status', 500)])
  s = rollouts.score(traj, judge=_judge(down, max_retries=1))
  assert s['judge_errors'] == 2 and s['r_acc'] == 1.0
  cfg = grpo.ml_collections.ConfigDict(dict(alpha=0.8, num_generations=2, fatal_mode='mask_clamp', delta=1e-6,
                                            length_buckets=LENGTH_BUCKETS, loss_bucket=32))
  _, _, scores, _ = grpo_batch.prepare_batch([traj, traj], cfg, _judge(down, max_retries=0, max_concurrency=2))
  assert [x['judge_errors'] for x in scores] == [2, 2]

"""The model expert: K episodes per item through the agent loop, the two-stage rejection, the selection."""


import pytest

from data_pipeline import experts, synthesize
from osvl_jax import paths as osvl_paths
from tests.serve.conftest import healthy, serve_process, wait_until

TINY_PIXELS = dict(min_pixels=32 * 32, max_pixels=64 * 64)   # `osvl_jax.serve --tiny`'s image processor


def model_config(**overrides):
  c = experts.default_config()
  c.expert, c.base_url, c.model = 'model', 'http://127.0.0.1:1', 'scripted'
  c.update(overrides)
  return c


def _scripts(answer: str, wrong: str):
  """Four experts' episodes (assistant texts per step) and their rule process scores (`rule.query_quality`)."""
  from osvl_jax import trajectory as traj_lib
  call = lambda think: traj_lib.render_assistant_text(think, tool_call={'name': 'image_search',
                                                                        'arguments': {'image': 'img_1'}})
  say = lambda think, text: traj_lib.render_assistant_text(think, response=text)
  return {
      # The same call twice: success 1, novelty 1/2 -> r_query 0.75; correct.
      'twice': [call('A: look it up.'), call('A: again.'), say('A: done.', answer)],
      # No tool call: r_query 0 < 0.5 -> rejected by the process judge although correct.
      'no tools': [say('B: I just know.', answer)],
      # Wrong answer -> rejected by the answer judge.
      'wrong': [call('C: look it up.'), say('C: done.', wrong)],
      # One call, success 1, novelty 1 -> r_query 1.0; correct: the best.
      'once': [call('D: look it up.'), say('D: done.', answer)],
  }


def _engine(scripts, tokenizer):
  """A ScriptedEngine that gives each new episode the next script (sample order) and follows it by its first
  think (the contexts of one item's samples are identical until their first turn)."""
  from osvl_jax.rollout import engine as engine_lib
  names, started = list(scripts), []

  def turn(step, context):
    if step == 0:
      started.append(names[len(started) % len(names)])
      return scripts[started[-1]][0]
    text = tokenizer.decode(context.prompt_ids.tolist(), skip_special_tokens=False)
    name = next(n for n in names if scripts[n][0].split('</think>')[0] in text)
    return scripts[name][min(step, len(scripts[name]) - 1)]
  return engine_lib.ScriptedEngine(turn, tokenizer), started


@pytest.fixture(scope='module')
def item(accepted_items):
  return accepted_items[0]


@pytest.mark.parametrize('keep_per_item, kept', [(1, ['once']), (0, ['twice', 'once'])])
def test_two_stage_rejection_keeps_the_best_passing_samples(graph, item, keep_per_item, kept):
  from osvl_jax import trajectory as traj_lib
  tokenizer = traj_lib.load_tokenizer()
  scripts = _scripts(item['answers'][0], 'Atlantis')
  engine, started = _engine(scripts, tokenizer)
  config = model_config(num_samples=4, keep_per_item=keep_per_item, max_turns=4)
  records, counts = synthesize.synthesize([item], graph, osvl_paths.data_dir(), config=config, engine=engine)
  assert sorted(started) == sorted(scripts)  # K = 4 episodes of the one item, one per script
  assert counts['episodes'] == 4 and counts['in'] == 1 and counts['items_kept'] == 1
  assert counts['reasons'] == {'answer: incorrect': 1, 'process: below min_process_score': 1}
  assert counts['rejected'] == 2 and counts['passed'] == 2 and counts['kept'] == len(kept)
  assert counts['surplus'] == 2 - len(kept)
  assert counts['process_score_mean'] == pytest.approx((0.75 + 1.0) / 2)
  trajs = [traj_lib.Trajectory.from_record(r) for r in records]
  assert len(trajs) == len(kept)
  for name, traj in zip(kept, trajs):  # kept in sample order
    assert traj.steps[0].text == scripts[name][0]
    assert len(traj.steps) == len(scripts[name])
    assert traj.final_response == item['answers'][0] and traj.rollout_logprobs is not None


def _api_model(scripts):
  """A scripted API model behind an OpenAI-compatible endpoint (`tests.rollout.openai_double`): each new episode
  (a request with system + user only) gets the next script in arrival order, later turns follow the script of
  the episode's first assistant message."""
  import threading
  from tests.rollout.openai_double import ChatDouble
  names, started, lock = list(scripts), [], threading.Lock()

  def answer(body, n):
    messages = body['messages']
    if len(messages) == 2:
      with lock:
        started.append(names[len(started) % len(names)])
        return scripts[started[-1]][0]
    name = next(k for k in names if scripts[k][0] == messages[2]['content'])
    return scripts[name][min((len(messages) - 2) // 2, len(scripts[name]) - 1)]
  return ChatDouble(answer), started


@pytest.mark.parametrize('keep_per_item, kept', [(1, {'once'}), (0, {'twice', 'once'})])
def test_the_openai_expert_samples_k_per_item_and_keeps_what_passes_both_stages(graph, item, keep_per_item, kept):
  """`expert=openai` over real HTTP: K = 4 episodes of an API model per item, each turn sent as OpenAI vision
  messages (the item's image, the search results), the replies rendered into token-exact records (no log-probs);
  the two-stage rejection keeps the best (keep_per_item=1) or every passing one (0)."""
  from osvl_jax import trajectory as traj_lib
  scripts = _scripts(item['answers'][0], 'Atlantis')
  double, started = _api_model(scripts)
  with double.serve() as url:
    config = model_config(expert='openai', base_url=url, model='frontier', num_samples=4,
                          keep_per_item=keep_per_item, max_turns=4, max_new_tokens=256, temperature=0.7)
    records, counts = synthesize.synthesize([item], graph, osvl_paths.data_dir(), config=config)
  assert sorted(started) == sorted(scripts)   # K = 4 episodes of the one item, one per script
  assert {b['model'] for b in double.bodies} == {'frontier'} and {b['temperature'] for b in double.bodies} == {0.7}
  assert all(len(images) >= 1 for images in double.images)   # the item's image goes with every turn
  assert counts['expert'] == 'openai' and counts['model'] == 'frontier'
  assert counts['episodes'] == 4 and counts['items_kept'] == 1 and counts['kept'] == len(kept)
  assert counts['reasons'] == {'answer: incorrect': 1, 'process: below min_process_score': 1}
  assert counts['process_score_mean'] == pytest.approx((0.75 + 1.0) / 2)
  trajs = [traj_lib.Trajectory.from_record(r) for r in records]
  assert {next(k for k in scripts if scripts[k][0] == t.steps[0].text) for t in trajs} == kept
  for traj in trajs:
    assert traj_lib.check_trajectory(traj) == [] and traj.rollout_logprobs is None
    assert traj.final_response == item['answers'][0] and traj.steps[0].result.ok


def test_an_openai_expert_config_without_its_endpoint_is_refused_naming_the_fields():
  with pytest.raises(ValueError, match=r"data.synthesize.expert='openai' needs data.synthesize.base_url"):
    experts.check_config(model_config(expert='openai', model=''))
  with pytest.raises(ValueError, match=r'data.synthesize.base_url'):
    experts.check_config(model_config(expert='openai', base_url='127.0.0.1:1/v1'))


def test_judge_trajectory_reasons_and_the_min_score(graph, item):
  """The threshold decides stage 2: 0.75 passes at 0.75 and fails at 0.8; an empty response is stage 1's."""
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.judges import rule
  tokenizer = traj_lib.load_tokenizer()
  scripts = {'twice': _scripts(item['answers'][0], 'x')['twice']}
  engine, _ = _engine(scripts, tokenizer)
  config = model_config(num_samples=1, max_turns=4)
  records, _ = synthesize.synthesize([item], graph, osvl_paths.data_dir(), config=config, engine=engine)
  traj = traj_lib.Trajectory.from_record(records[0])
  judge = rule.RuleJudge()
  assert experts.judge_trajectory(traj, judge, 0.75) == ('ok', 0.75)
  assert experts.judge_trajectory(traj, judge, 0.8) == ('process: below min_process_score', 0.75)
  traj.final_response = None
  assert experts.judge_trajectory(traj, judge, 0.5) == ('answer: no response (response)', 0.0)


def test_a_judge_with_a_process_judge_scores_stage_2_with_it(graph, item):
  """The LLM judge declares a process judge: stage 2 is its score of the whole transcript (prompt process_v1), not
  r_query; its failure is a 'process: judge error'. Real HTTP against a scripted judge model."""
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.judges import llm, registry
  from tests.rollout.openai_double import ChatDouble
  tokenizer = traj_lib.load_tokenizer()
  engine, _ = _engine({'twice': _scripts(item['answers'][0], 'x')['twice']}, tokenizer)
  records, _ = synthesize.synthesize([item], graph, osvl_paths.data_dir(), config=model_config(num_samples=1,
                                                                                               max_turns=4),
                                     engine=engine)
  traj = traj_lib.Trajectory.from_record(records[0])
  replies = ['correct: yes', 'score: 0.9', 'correct: yes', 'Maybe.']
  double = ChatDouble(lambda body, n: replies[min(n, len(replies) - 1)])
  with double.serve() as url:
    judge = registry.get_judge({'name': 'llm', 'base_url': url, 'model': 'judge', 'max_retries': 0})
    assert experts.judge_trajectory(traj, judge, 0.8) == ('ok', 0.9)   # r_query would be 0.75 < 0.8
    judge = registry.get_judge({'name': 'llm', 'base_url': url, 'model': 'judge', 'max_retries': 0})
    assert experts.judge_trajectory(traj, judge, 0.8) == ('process: judge error', 0.0)
  assert llm.format_transcript(traj.steps) in double.bodies[1]['messages'][0]['content']


def test_a_bad_synthesize_config_is_refused_naming_the_field():
  with pytest.raises(ValueError, match=r'data.synthesize.expert'):
    experts.check_config(model_config(expert='gpt'))
  with pytest.raises(ValueError, match=r"data.synthesize.base_url=''"):
    experts.check_config(model_config(base_url=''))
  with pytest.raises(ValueError, match=r'data.synthesize.num_samples'):
    experts.check_config(model_config(num_samples=0))
  with pytest.raises(ValueError, match=r'data.synthesize.min_process_score'):
    experts.check_config(model_config(min_process_score=1.5))


@pytest.fixture(scope='module')
def tiny_server(tmp_path_factory):
  """`python -m osvl_jax.serve --tiny` on 127.0.0.1 (a random model: it answers garbage)."""
  log = tmp_path_factory.mktemp('serve') / 'serve.log'
  with serve_process(log, '--max_len=2048', '--bucket=256', '--max_new_tokens=8', '--batch_window_ms=50') as (
      url, proc):
    wait_until(lambda: healthy(url), 180, 'osvl_jax.serve', proc, log)
    yield url


@pytest.mark.parametrize('expert', ['model', 'openai'])
def test_model_expert_against_a_real_server_rejects_garbage_with_reasons(graph, accepted_items, tiny_server, expert):
  """K = 5 episodes per item from SGLang's /generate API ('model', token-exact) or the same server's
  /v1/chat/completions ('openai', text rendered by the builder); the random model answers nothing right."""
  from osvl_jax import trajectory as traj_lib
  items = accepted_items[:2]
  url = tiny_server if expert == 'model' else f'{tiny_server}/v1'
  config = model_config(expert=expert, base_url=url, model='osvl-jax', num_samples=5, max_turns=2,
                        max_new_tokens=8, temperature=1.0, max_concurrency=10, timeout_s=120.0, retries=1)
  records, counts = synthesize.synthesize(items, graph, osvl_paths.data_dir(), config=config,
                                          processor=traj_lib.ImageProcessor(**TINY_PIXELS))
  assert records == [] and counts['in'] == 2 and counts['episodes'] == 10 and counts['kept'] == 0
  assert counts['rejected'] == 10 and sum(counts['reasons'].values()) == 10
  assert all(r.startswith('answer: ') for r in counts['reasons']), counts['reasons']
  assert not any('(error)' in r for r in counts['reasons']), counts['reasons']  # the server answered every turn


def test_the_model_expert_calls_tools_in_the_official_profile(graph, item):
  """`tool_schema='official'` in the pipeline's tool config: the expert's `text_search{q, hl}` is parsed in the
  profile the env runs (`rollout.factory.make_builder`), the search runs and the trajectory is kept."""
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.rollout import engine as engine_lib
  tokenizer = traj_lib.load_tokenizer()
  call = traj_lib.render_assistant_text('Search.', tool_call={'name': 'text_search', 'arguments': {
      'q': item['question'][:60], 'hl': 'en'}})
  engine = engine_lib.ScriptedEngine([call, traj_lib.render_assistant_text('Done.', response=item['answers'][0])],
                                     tokenizer)
  records, counts = synthesize.synthesize([item], graph, osvl_paths.data_dir(), config=model_config(num_samples=1),
                                          engine=engine, tool_config={'enabled': ('text_search',),
                                                                      'tool_schema': 'official'})
  assert counts['kept'] == 1, counts
  step = traj_lib.Trajectory.from_record(records[0]).steps[0]
  assert set(step.action.arguments) == {'query'} and step.result.ok and step.format_ok

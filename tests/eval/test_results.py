"""The results store: keyed by the settings' fingerprint and the item's content; judge errors judged again on
resume; Pass@1 over every item run (a judge error is not correct), n/a without a judgement."""

import json

import pytest

from osvl_jax.data import benchmarks
from osvl_jax.eval import policy, results, runner
from osvl_jax.judges import base as judges_base
from osvl_jax.rollout import engine as engine_lib

from tests.eval.conftest import SCRIPT, CountingJudge, small_config


class ScriptedJudge(judges_base.Judge):
  """Verdict by question: 'right', 'wrong' or 'error' (a judge error, as the LLM judge reports one)."""
  name = 'scripted'

  def __init__(self, outcome):
    super().__init__()
    self.outcome, self.judged = outcome, []

  def accuracy(self, question, response, answers, *, hints=None):
    self.judged.append(question)
    what = self.outcome(question)
    if what == 'error':
      return judges_base.Verdict(0.0, 'JudgeParseError: no Correct/Incorrect verdict', 'Maybe.')
    return judges_base.Verdict(1.0 if what == 'right' else 0.0)

  def query_quality(self, question, tool_calls, results_, *, answers=(), response=None):
    return judges_base.Verdict(0.0)


def _direct(tokenizer):
  return engine_lib.ScriptedEngine([SCRIPT[1]], tokenizer)


def _records(workdir):
  return [json.loads(l) for l in (workdir / 'results.jsonl').read_text().splitlines() if l.strip()]


def test_pass_at_1_counts_judge_errors_as_not_correct_over_all_items(tmp_path, tokenizer, env):
  fvqa = [it.question for it in benchmarks.load_benchmark('fvqa', limit=5)]
  plan = dict(zip(fvqa, ['right', 'right', 'wrong', 'error', 'error']))
  judge = ScriptedJudge(lambda q: plan.get(q, 'error'))  # every mmsearch item: a judge error
  config = small_config(benchmarks=('fvqa', 'mmsearch'), max_items_per_benchmark=5, modes=('direct',))
  rep = runner.evaluate(config, tmp_path, engine=_direct(tokenizer), judge=judge, env=env, tokenizer=tokenizer)
  run = rep['runs']['direct']
  fv, mm = run['benchmarks']['fvqa'], run['benchmarks']['mmsearch']
  # By hand: 5 items run, 3 with a verdict (2 right, 1 wrong), 2 judge errors -> Pass@1 = 2 / 5 = 0.4 (not 2 / 3).
  assert (fv['items'], fv['judged'], fv['correct'], fv['judge_errors']) == (5, 3, 2, 2)
  assert fv['pass_at_1'] == pytest.approx(0.4, rel=1e-12) and fv['judge_error_rate'] == pytest.approx(0.4, rel=1e-12)
  # No judgement at all: n/a (not 0.0), and the average says it covers fvqa alone.
  assert mm['items'] == 5 and mm['judged'] == 0 and mm['pass_at_1'] is None and mm['judge_errors'] == 5
  assert run['average_pass_at_1'] == pytest.approx(0.4, rel=1e-12) and run['average_covers'] == ['fvqa']
  assert run['average_excludes'] == {'mmsearch': 'no judgement (5 judge errors of 5 items that ran)'}
  md = (tmp_path / 'report.md').read_text()
  assert '| fvqa | 5 | 0 (0.0%) | 5 | 3 | 40.0 | 2 (40.0%) |' in md
  assert '| mmsearch | 5 | 0 (0.0%) | 5 | 0 | n/a | 5 (100.0%) |' in md
  assert '**Avg.** (over fvqa)' in md and 'Left out of the average: mmsearch' in md


def test_judge_errors_are_judged_again_on_resume_without_a_new_rollout(tmp_path, tokenizer, env):
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=3, modes=('direct',))
  first = ScriptedJudge(lambda q: 'error')
  runner.evaluate(config, tmp_path, engine=_direct(tokenizer), judge=first, env=env, tokenizer=tokenizer)
  assert len(first.judged) == 3 and all(r['judge_error'] for r in _records(tmp_path))
  engine = _direct(tokenizer)
  second = ScriptedJudge(lambda q: 'right')
  rep = runner.evaluate(config, tmp_path, engine=engine, judge=second, env=env, tokenizer=tokenizer)
  assert len(second.judged) == 3 and engine.calls == []  # judged again on the stored responses, no rollout
  s = rep['runs']['direct']['benchmarks']['fvqa']
  assert (s['judged'], s['correct'], s['judge_errors'], s['pass_at_1']) == (3, 3, 0, 1.0)
  assert rep['meta']['judge_errors_rejudged'] == 3
  third = ScriptedJudge(lambda q: 'wrong')
  rep = runner.evaluate(config, tmp_path, engine=engine, judge=third, env=env, tokenizer=tokenizer)
  assert third.judged == [] and rep['runs']['direct']['benchmarks']['fvqa']['pass_at_1'] == 1.0  # final: kept
  assert len(_records(tmp_path)) == 6  # three judge-error lines, then the three records that replaced them
  with pytest.raises(ValueError, match='already in'):
    runner.Evaluator(config, tmp_path, engine=engine, judge=third, env=env, tokenizer=tokenizer).store.append(
        _records(tmp_path)[-1])


class DescribedJudge(ScriptedJudge):
  """A scripted judge that describes a model setting and records the hints it is given."""

  def __init__(self, outcome, model):
    super().__init__(outcome)
    self.model, self.hints = model, []

  def accuracy(self, question, response, answers, *, hints=None):
    self.hints.append(hints)
    return super().accuracy(question, response, answers)

  def describe(self):
    return {**super().describe(), 'settings': {'model': self.model}}


def test_the_judge_describes_itself_into_the_settings_and_the_report(tmp_path, tokenizer, env):
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=2, modes=('direct',))
  judge = DescribedJudge(lambda q: 'right', 'judge-a')
  rep = runner.evaluate(config, tmp_path, engine=_direct(tokenizer), judge=judge, env=env, tokenizer=tokenizer)
  assert rep['meta']['judge_identity'] == judge.describe() == {
      'name': 'scripted', 'class': f'{__name__}.DescribedJudge', 'prompt_names': {}, 'prompts': {},
      'settings': {'model': 'judge-a'}}
  assert rep['meta']['judge_prompt'] == 'scripted (no prompt)'
  assert json.loads((tmp_path / results.SETTINGS_FILE).read_text())['judge'] == judge.describe()
  items = benchmarks.load_benchmark('fvqa', limit=2)
  assert sorted(map(repr, judge.hints)) == sorted(repr(it.metadata) for it in items)   # each item's own hints
  # A judge that describes itself otherwise produced other results: the workdir refuses it, naming the field.
  with pytest.raises(results.SettingsMismatch, match=r"judge.settings.model: recorded 'judge-a', asked 'judge-b'"):
    runner.evaluate(config, tmp_path, engine=_direct(tokenizer), judge=DescribedJudge(lambda q: 'right', 'judge-b'),
                    env=env, tokenizer=tokenizer)


def _browsecomp(path, rows):
  path.write_text(''.join(json.dumps({'question': q, 'image_path': 'x.jpg', 'answers': [a]}) + '\n' for q, a in rows))


def test_results_are_keyed_by_item_content_not_by_line_number(tmp_path, tokenizer, env):
  data = tmp_path / 'bc_vl_level1.jsonl'
  _browsecomp(data, [('Q one?', 'A1'), ('Q two?', 'A2'), ('Q three?', 'A3')])
  config = small_config(benchmarks=('browsecomp_vl',), modes=('direct',), max_items_per_benchmark=0)
  config.benchmark_files.browsecomp_vl = str(data)
  answer_of = {'Q one?': 'A1', 'Q two?': 'A2', 'Q three?': 'A3', 'Q four?': 'A4'}
  judge = CountingJudge()
  runner.evaluate(config, tmp_path / 'w', engine=_direct(tokenizer), judge=judge, env=env, tokenizer=tokenizer)
  assert sorted(judge.judged) == ['Q one?', 'Q three?', 'Q two?']
  # Another file in the same place: lines moved, 'Q two?' replaced. Line ids now name other questions.
  _browsecomp(data, [('Q four?', 'A4'), ('Q three?', 'A3'), ('Q one?', 'A1')])
  second = CountingJudge()
  rep = runner.evaluate(config, tmp_path / 'w', engine=_direct(tokenizer), judge=second, env=env,
                        tokenizer=tokenizer)
  assert second.judged == ['Q four?']  # only the new question; moved ones are found by content
  assert rep['items'] == 3 and rep['runs']['direct']['benchmarks']['browsecomp_vl']['items'] == 3
  items = {it.id: it for it in benchmarks.load_benchmark('browsecomp_vl', files=data)}
  reported = [r for r in _records(tmp_path / 'w') if r['item_key'] in {benchmarks.item_key(i) for i in items.values()}]
  assert len(reported) == 3
  for r in reported:  # each reported record is of the question its key names, whatever line it now has
    question = next(q for q, a in answer_of.items() if r['answers'] == [a])
    assert benchmarks.item_key(next(i for i in items.values() if i.question == question)) == r['item_key']
  # Same question, another answer: another item (the old verdict is not reused).
  _browsecomp(data, [('Q one?', 'B1')])
  third = CountingJudge()
  runner.evaluate(config, tmp_path / 'w', engine=_direct(tokenizer), judge=third, env=env, tokenizer=tokenizer)
  assert third.judged == ['Q one?']


def test_a_rerun_with_other_settings_is_refused_naming_them(tmp_path, tokenizer, env):
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=1, modes=('direct',))
  kw = dict(engine=_direct(tokenizer), env=env, tokenizer=tokenizer)
  runner.evaluate(config, tmp_path, judge=CountingJudge(), **kw)
  settings = json.loads((tmp_path / 'eval_settings.json').read_text())
  # No checkpoint (a given engine): config.system_prompt 'checkpoint' falls back to the paper's agent prompt.
  assert settings['rollout']['temperature'] == 0.0 and settings['prompts']['system_prompt']['name'] == 'agent_system_v3'
  for field, change, named in [
      ('rollout', lambda c: setattr(c.rollout, 'temperature', 0.7), 'rollout.temperature'),
      ('system prompt', lambda c: setattr(c, 'system_prompt', 'builder_default'), 'prompts.system_prompt.name'),
      ('tool budget', lambda c: setattr(c, 'max_tool_calls', 5), 'max_tool_calls'),
      ('seed', lambda c: setattr(c, 'seed', 3), 'seed'),
      ('tools', lambda c: setattr(c.tools, 'enabled', ('crop',)), 'tools.enabled')]:
    other = small_config(benchmarks=('fvqa',), max_items_per_benchmark=1, modes=('direct',))
    change(other)
    with pytest.raises(results.SettingsMismatch, match=named.replace('.', r'\.')):
      runner.Evaluator(other, tmp_path, judge=CountingJudge(), **kw)
  with pytest.raises(results.SettingsMismatch, match=r'judge\.class'):  # another judge
    runner.Evaluator(config, tmp_path, judge=ScriptedJudge(lambda q: 'right'), **kw)
  # Asking for more (another mode, more items, another benchmark) extends the same evaluation.
  more = small_config(benchmarks=('fvqa', 'mmsearch'), max_items_per_benchmark=2, modes=('direct', 'agentic'))
  judge = CountingJudge()
  runner.evaluate(more, tmp_path, judge=judge, **kw)
  assert len(judge.judged) == 2 * 4 - 1
  # Results without recorded settings, or of another fingerprint: refused, never reported as this run's.
  (tmp_path / 'eval_settings.json').unlink()
  with pytest.raises(results.SettingsMismatch, match='settings are unknown'):
    runner.Evaluator(config, tmp_path, judge=CountingJudge(), **kw)
  (tmp_path / 'eval_settings.json').write_text(json.dumps(settings))
  with (tmp_path / 'results.jsonl').open('a') as f:
    f.write(json.dumps({**_records(tmp_path)[0], 'fingerprint': 'f' * 16}) + '\n')
  with pytest.raises(results.SettingsMismatch, match='another evaluation'):
    runner.Evaluator(config, tmp_path, judge=CountingJudge(), **kw)


def test_policy_identity_names_the_checkpoint_step_and_content(tmp_path):
  from osvl_jax import checkpoints
  config = small_config()
  config.model.text.num_hidden_layers = 1
  model = checkpoints.build_model(config)
  mngr = checkpoints.manager(tmp_path, 'sft_ckpt')
  checkpoints.save(mngr, 1, model, None, {'note': 'a'})
  config.checkpoint = str(tmp_path / 'sft_ckpt')
  first = policy.policy_identity(config)
  assert first['checkpoint'] == str((tmp_path / 'sft_ckpt').resolve()) and first['step'] == 1
  assert policy.policy_identity(config) == first  # stable
  checkpoints.save(mngr, 2, model, None, {'note': 'b'})
  second = policy.policy_identity(config)
  assert second['step'] == 2 and second['meta_sha256'] != first['meta_sha256']
  # the evaluator loads the step its fingerprint names, not whatever is latest by the time it loads
  _, described = policy.build(config, step=first['step'])
  assert described.endswith('step 1')
  assert policy.build(config)[1].endswith('step 2')
  assert policy.policy_identity(small_config()) == {'model': small_config().model.to_dict(), 'seed': 0}


def test_the_agent_prompt_is_the_checkpoints_unless_the_config_names_one(tmp_path):
  """One system prompt per run: evaluation defaults to the one the checkpoint's meta records
  (train.policy_config.checkpoint_meta), 'builder_default' for a checkpoint from before it was recorded, the paper's
  agent prompt for an HF folder."""
  from osvl_jax import trajectory as traj_lib
  from osvl_jax import checkpoints
  from osvl_jax.train import policy_config
  config = small_config()
  config.model.text.num_hidden_layers = 1
  model = checkpoints.build_model(config)
  trained = small_config()
  trained.system_prompt = 'agent_system_v2'
  checkpoints.save(checkpoints.manager(tmp_path / 'new', 'sft_ckpt'), 1, model, None,
                   policy_config.checkpoint_meta(trained))
  checkpoints.save(checkpoints.manager(tmp_path / 'old', 'sft_ckpt'), 1, model, None, {'note': 'before'})
  assert config.system_prompt == 'checkpoint'
  config.checkpoint = str(tmp_path / 'new' / 'sft_ckpt')
  v2 = traj_lib.system_prompt_text('agent_system_v2')
  assert policy.system_prompt(config) == ('checkpoint:agent_system_v2', v2) and r'\boxed{' in v2
  config.checkpoint = str(tmp_path / 'old' / 'sft_ckpt')
  assert policy.system_prompt(config) == ('checkpoint:builder_default', traj_lib.DEFAULT_INSTRUCTIONS)
  config.system_prompt = 'agent_system_v1'   # told otherwise
  assert policy.system_prompt(config) == ('agent_system_v1', traj_lib.system_prompt_text('agent_system_v1'))
  config.system_prompt, config.checkpoint = 'checkpoint', ''
  assert policy.system_prompt(config) == ('agent_system_v3', traj_lib.system_prompt_text('agent_system_v3'))
  config.system_prompt = 'agent_sytem_v2'
  with pytest.raises(ValueError, match="system_prompt='agent_sytem_v2'"):
    policy.system_prompt(config)


def test_the_judges_cost_is_in_the_report(tmp_path, tokenizer, env):
  """An LLM judge on a real endpoint (127.0.0.1): its requests and tokens in report.json's meta and report.md."""
  from osvl_jax.judges import registry
  from tests.rollout.openai_double import USAGE, ChatDouble
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=2, modes=('direct',))
  double = ChatDouble(lambda body, n: 'Correct')
  with double.serve() as url:
    judge = registry.get_judge({'name': 'llm', 'base_url': url, 'model': 'judge-model', 'max_retries': 0})
    rep = runner.evaluate(config, tmp_path, engine=_direct(tokenizer), judge=judge, env=env, tokenizer=tokenizer)
  asked = len(double.bodies)
  assert asked == rep['runs']['direct']['all']['judged'] == 2      # one request per answered item
  assert rep['meta']['judge_usage'] == {'requests': 2, 'prompt_tokens': 2 * USAGE['prompt_tokens'],
                                        'completion_tokens': 2 * USAGE['completion_tokens'],
                                        'total_tokens': 2 * USAGE['total_tokens']}
  md = (tmp_path / 'report.md').read_text()
  assert (f"- judge cost (this invocation): 2 requests, {2 * USAGE['prompt_tokens']} prompt + "
          f"{2 * USAGE['completion_tokens']} completion tokens") in md


def test_a_prompt_edited_under_its_name_is_another_setting(tmp_path, tokenizer, env, monkeypatch):
  """The eval fingerprint hashes each agent prompt's text as the file holds it now, even in a process that read the
  old text before (a sweep driver, a notebook): an edited `agent_direct_v1` is refused on resume, and the
  rollouts render the text that was fingerprinted."""
  import shutil
  from osvl_jax.judges import prompts
  folder = tmp_path / 'prompts'
  shutil.copytree(prompts.PROMPT_DIR, folder)
  monkeypatch.setattr(prompts, 'PROMPT_DIR', folder)
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=1, modes=('direct',))
  kw = dict(env=env, tokenizer=tokenizer, judge=CountingJudge())
  runner.evaluate(config, tmp_path / 'w', engine=_direct(tokenizer), **kw)
  (folder / 'agent_direct_v1.txt').write_text('Answer in one word, inside <response></response>.\n')
  with pytest.raises(results.SettingsMismatch, match=r'prompts\.direct_prompt\.sha256'):
    runner.Evaluator(config, tmp_path / 'w', engine=_direct(tokenizer), **kw)
  engine = _direct(tokenizer)
  runner.evaluate(config, tmp_path / 'other', engine=engine, **kw)
  assert 'Answer in one word, inside' in tokenizer.decode(engine.calls[0][0].prompt_ids.tolist())

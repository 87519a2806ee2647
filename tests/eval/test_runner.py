"""The eval runner: resume after a kill (no item judged twice), judge errors, report fields, every mode end to end."""

import json

import numpy as np
import pytest

from osvl_jax.eval import degrade, policy, results, runner, runs
from osvl_jax.rollout import engine as engine_lib

from tests.eval.conftest import SCRIPT, CountingJudge, small_config


def test_resume_after_a_kill_judges_no_item_twice(tmp_path, tokenizer, env):
  config = small_config()
  engine = engine_lib.ScriptedEngine(SCRIPT, tokenizer)
  first = CountingJudge(kill_at=4)
  with pytest.raises(KeyboardInterrupt):
    runner.evaluate(config, tmp_path, engine=engine, judge=first, env=env, tokenizer=tokenizer)
  stored = [json.loads(l) for l in (tmp_path / 'results.jsonl').read_text().splitlines()]
  assert len(stored) == 3
  with (tmp_path / 'results.jsonl').open('a') as f:
    f.write('{"run": "agentic", "benchm')  # a line torn by the kill
  second = CountingJudge()
  rep = runner.evaluate(config, tmp_path, engine=engine, judge=second, env=env, tokenizer=tokenizer)
  assert len(second.judged) == 3  # only the three items not stored
  assert not set(first.judged) & set(second.judged)
  keys = [results.ResultStore.key(json.loads(l)) for l in (tmp_path / 'results.jsonl').read_text().splitlines()
          if l.startswith('{"run"') and l.endswith('}')]
  assert len(keys) == len(set(keys)) == 6
  assert rep['meta']['torn_result_lines'] == 1 and rep['items'] == 6
  third = CountingJudge()
  runner.evaluate(config, tmp_path, engine=engine, judge=third, env=env, tokenizer=tokenizer)
  assert third.judged == []  # everything stored: nothing rolled out or judged again

  run = rep['runs']['agentic']
  fv = run['benchmarks']['fvqa']
  assert fv['items'] == 3 and fv['judged'] == 3 and 0 < fv['pass_at_1'] < 1  # one of the three is the Tagus item
  assert run['benchmarks']['mmsearch']['image_problem_rate'] == 1.0  # URL images: reported, items kept
  assert run['all']['tool_usage'] == {'crop': 6} and run['all']['tool_calls']['mean'] == 1.0
  assert set(run['all']['turns']) == {'mean', 'median', 'p90'} and run['all']['gen_tokens']['mean'] > 0
  assert 0 < run['average_pass_at_1'] < 1
  md = (tmp_path / 'report.md').read_text()
  assert '| fvqa | 3 | 0 (0.0%) | 3 | 3 |' in md and 'infoseek' not in md
  assert rep['meta']['sampling'] == 'greedy (temperature 0)' and '- sampling: `greedy (temperature 0)`' in md


def test_judge_errors_are_neither_right_nor_wrong(tmp_path, tokenizer, env):
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=2)
  engine = engine_lib.ScriptedEngine(SCRIPT, tokenizer)
  rep = runner.evaluate(config, tmp_path, engine=engine, judge=CountingJudge(error=True), env=env,
                        tokenizer=tokenizer)
  s = rep['runs']['agentic']['benchmarks']['fvqa']
  assert s['judged'] == 0 and s['judge_error_rate'] == 1.0 and s['judge_errors'] == 2
  assert s['pass_at_1'] is None and rep['runs']['agentic']['average_pass_at_1'] is None  # n/a, not 0.0
  assert rep['runs']['agentic']['average_covers'] == [] and 'fvqa' in rep['runs']['agentic']['average_excludes']
  assert '| fvqa | 2 | 0 (0.0%) | 2 | 0 | n/a | 2 (100.0%) |' in (tmp_path / 'report.md').read_text()
  records = [json.loads(l) for l in (tmp_path / 'results.jsonl').read_text().splitlines()]
  assert all(r['correct'] is None and r['judge_error'].startswith('JudgeParseError') for r in records)


def test_abstention_and_no_answer(tmp_path, tokenizer, env):
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=2, modes=('direct',))
  engine = engine_lib.ScriptedEngine(['<think>unclear</think>\n<response>I cannot determine this.</response>'],
                                     tokenizer)
  rep = runner.evaluate(config, tmp_path, engine=engine, env=env, tokenizer=tokenizer)
  s = rep['runs']['direct']['benchmarks']['fvqa']
  assert s['abstention_rate'] == 1.0 and s['pass_at_1'] == 0.0 and s['no_answer_rate'] == 0.0
  assert runner.is_abstention('Unable to tell from the image') and not runner.is_abstention('Lisbon')


def test_degradations_keep_shape_and_change_pixels():
  image = (np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8)
  for kind in degrade.KINDS:
    out = degrade.degrade(image, kind)
    assert out.shape == image.shape and out.dtype == np.uint8 and not np.array_equal(out, image)
  assert degrade.kind_for('fvqa_train_1') == degrade.kind_for('fvqa_train_1')
  with pytest.raises(ValueError):
    degrade.degrade(image, 'rotate')


def test_plan_runs_and_bad_modes():
  planned = runs.plan_runs(small_config(modes=('agentic', 'direct'), budgets=(2, 4)))
  assert [(r.key, r.mode, r.max_tool_calls) for r in planned] == [
      ('agentic', 'agentic', 2), ('direct', 'direct', 0), ('budget_2', 'agentic', 2), ('budget_4', 'agentic', 4)]
  with pytest.raises(ValueError, match='eval mode'):
    runs.plan_runs(small_config(modes=('sideways',)))


def test_tiny_policy_every_mode_and_budget_sweep(tmp_path, env):
  """The tiny random model through the embedded JaxSampler: a complete report in every mode, and the plot."""
  config = small_config(benchmarks=('fvqa', 'infoseek'), max_items_per_benchmark=1, max_tool_calls=1,
                        modes=('agentic', 'direct', 'rag', 'degrade'), budgets=(1,))
  config.rollout.max_new_tokens = 4
  config.rollout.max_total_tokens = 1024
  config.model.text.num_hidden_layers = 1
  rep = runner.evaluate(config, tmp_path, env=env)
  assert list(rep['runs']) == ['agentic', 'direct', 'rag', 'degrade', 'budget_1']
  for run in rep['runs'].values():
    assert run['benchmarks']['fvqa']['items'] == 1 and 'average_pass_at_1' in run
  assert 'infoseek' in rep['benchmarks_not_run']
  assert (tmp_path / 'budget_sweep.png').stat().st_size > 0 and len(rep['budget_sweep']) == 1
  assert (tmp_path / 'report.md').is_file() and json.loads((tmp_path / 'report.json').read_text())['items'] == 1
  records = [json.loads(l) for l in (tmp_path / 'results.jsonl').read_text().splitlines()]
  assert next(r for r in records if r['run'] == 'degrade')['degrade'] in degrade.KINDS
  assert next(r for r in records if r['run'] == 'rag')['rag_status'] == 'ok'


def test_tool_usage_keys_are_tool_names_or_unknown_tool():
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.eval import runner
  from tools import base as tools_base

  def step(name, result):
    action = traj_lib.ParsedAction(think='', kind='tool_call', name=name, arguments={}, response=None, error=None,
                                   format_ok=True, problems=[])
    return traj_lib.Step(index=0, text='', action=action, result=result, format_ok=True, seconds=0.0)

  garbage = 'arguments": "img_197 | "Toronto'
  assert runner._tool_label(step(garbage, tools_base.error('unknown_tool', 'no such tool'))) == 'unknown_tool'
  assert runner._tool_label(step('crop', tools_base.error('bad_arguments', 'box'))) == 'crop'
  assert runner._tool_label(step('text_search', tools_base.ToolResult(ok=True, error_kind=None, text='x', images=[],
                                                                      seconds=0.0))) == 'text_search'


def test_benchmarks_merged_into_the_training_set_are_evaluated_on_their_held_out_part(tmp_path, tokenizer, env):
  from osvl_jax.data import benchmarks
  data = tmp_path / 'data'
  data.mkdir()
  (data / 'build_config.json').write_text(json.dumps(
      {'merge_external': True, 'merge_sources': ['fvqa'], 'merge_holdout': 0.3}))
  all_fvqa = benchmarks.load_benchmark('fvqa')
  unseen = [it.id for it in all_fvqa if benchmarks.holdout_key('fvqa', str(it.id)) < 0.3]
  assert 0 < len(unseen) < len(all_fvqa)
  ev = runner.Evaluator(small_config(train_data=str(data), max_items_per_benchmark=0), tmp_path / 'ev',
                        engine=engine_lib.ScriptedEngine([SCRIPT[1]], tokenizer), judge=CountingJudge(), env=env,
                        tokenizer=tokenizer)
  loaded, _ = ev.load_items()
  assert [it.id for it in loaded['fvqa']] == unseen  # the merged (possibly trained-on) items are left out
  assert ev.trained_on == {'fvqa': len(all_fvqa) - len(unseen)}
  assert len(loaded['mmsearch']) == len(benchmarks.load_benchmark('mmsearch'))  # not merged: all items
  # The limit applies after the held-out cut; a build without merge_external leaves every benchmark whole.
  ev.config.max_items_per_benchmark = 2
  assert [it.id for it in ev.load_items()[0]['fvqa']] == unseen[:2]
  (data / 'build_config.json').write_text(json.dumps({'merge_external': False, 'merge_sources': ['fvqa']}))
  assert len(ev.load_items()[0]['fvqa']) == 2 and ev.trained_on == {}
  with pytest.raises(FileNotFoundError, match='train_data='):
    policy.train_settings(tmp_path / 'nowhere')
  # A merging build whose recorded settings lack a field: an error, not a guess that could leak trained-on items.
  with pytest.raises(ValueError, match='merge_holdout'):
    benchmarks.held_out_items('fvqa', all_fvqa, {'merge_external': True, 'merge_sources': ['fvqa']})


def test_bad_entries_are_counted_per_benchmark_by_kind_and_the_rest_evaluated(tmp_path, tokenizer, env):
  data = tmp_path / 'vdr.jsonl'
  data.write_text('\ufeff' + '\n'.join([
      '{"id": "v1", "question": "Which river?", "answer": "Tagus River"}',
      '{"id": "v2", "question": "torn',
      '"a string"',
      '{"id": "v1", "question": "Which bridge?", "answer": "x"}',
      '{"id": "v4", "question": "No gold?"}',
      '{"id": "v5", "question": "Which sea?", "answer": "Tagus River"}']) + '\n', encoding='utf-8')
  config = small_config(benchmarks=('vdr_bench',), modes=('direct',), max_items_per_benchmark=0)
  config.benchmark_files.vdr_bench = str(data)
  judge = CountingJudge()
  rep = runner.evaluate(config, tmp_path / 'w', engine=engine_lib.ScriptedEngine([SCRIPT[1]], tokenizer),
                        judge=judge, env=env, tokenizer=tokenizer)
  assert sorted(judge.judged) == ['Which river?', 'Which sea?']
  s = rep['runs']['direct']['benchmarks']['vdr_bench']
  assert s['items'] == 2 and s['pass_at_1'] == 1.0
  assert rep['rejected'] == {'vdr_bench': {
      'entries': 4, 'by_kind': {'bad_json': 1, 'not_an_object': 1, 'duplicate_id': 1, 'no_answer': 1},
      'examples': rep['rejected']['vdr_bench']['examples']}}
  assert rep['rejected']['vdr_bench']['examples'][0].startswith(f'{data}:2 (bad_json)')
  assert 'vdr_bench' not in rep['benchmarks_not_run']
  assert "- vdr_bench: 4 entr(y/ies), by kind {'bad_json': 1" in (tmp_path / 'w' / 'report.md').read_text()


def test_rule_judge_scores_letter_replies_on_real_livevqa_items(tmp_path, tokenizer, env):
  """The offline judge through the runner: item '1' (gold option A) and '4' (gold B), both answered 'B'."""
  config = small_config(benchmarks=('livevqa',), modes=('direct',), max_items_per_benchmark=2)
  engine = engine_lib.ScriptedEngine(['<think>the second option</think>\n<response>(B)</response>'], tokenizer)
  rep = runner.evaluate(config, tmp_path, engine=engine, env=env, tokenizer=tokenizer)
  records = {r['id']: r['correct'] for r in map(json.loads, (tmp_path / 'results.jsonl').read_text().splitlines())}
  assert records == {'1': False, '4': True}
  assert rep['runs']['direct']['benchmarks']['livevqa']['pass_at_1'] == 0.5


def test_an_official_profile_call_is_parsed_and_run_in_that_profile(tmp_path, tokenizer):
  """Evaluation with `tools.tool_schema='official'`: the policy's `text_search{q, hl}` is parsed in the profile the
  tool env runs (`rollout.factory.make_builder`) and the search runs."""
  from osvl_jax import trajectory as tj
  from tools import env as tools_env
  env = tools_env.ToolEnv({'enabled': ('text_search',), 'tool_schema': 'official'})
  call = ('<think>Search.</think>\n<tool_call>{"name": "text_search", "arguments": {"q": "Tagus River Lisbon", '
          '"hl": "en"}}</tool_call>')
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=1)
  runner.evaluate(config, tmp_path, engine=engine_lib.ScriptedEngine([call, SCRIPT[1]], tokenizer),
                  judge=CountingJudge(), env=env, tokenizer=tokenizer)
  (record,) = [json.loads(line) for line in (tmp_path / 'results.jsonl').read_text().splitlines()]
  assert record['tools'] == {'text_search': 1} and record['tool_errors'] == 0 and record['malformed_steps'] == 0
  (_, traj), = results.read_trajectories(tmp_path)
  step = traj.steps[0]
  assert step.action.arguments == {'query': 'Tagus River Lisbon'} and step.result.ok and step.format_ok
  assert 'Tagus' in step.result.text and tj.Trajectory.from_json(traj.to_json()).steps[0].result.ok

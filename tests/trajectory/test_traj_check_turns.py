"""Per-turn invariants of `check_trajectory` and the formats `python -m osvl_jax.trajectory --check` reads.

Turns (DESIGN.md §4: token-exact; osvl_jax/trajectory/check.py): each step's generated ids decode to its stored
text; each assistant turn ends in <|im_end|> (emitted, or added with gen_mask 0 after a cut / <|endoftext|>
turn); gen_mask is one contiguous run per turn. Formats: JSON lines, and HF datasets folders / .arrow files as the
data pipeline writes them (`data_pipeline.dataset_folder.save_split`, the writer of `<dataset>/sft`).
"""

import dataclasses

import numpy as np

from data_pipeline import dataset_folder
from osvl_jax import trajectory as tj
from tools.base import ToolResult


def _replace(traj, **fields):
  return dataclasses.replace(traj, **fields)


def _turn(traj, step):
  """Positions of step `step`'s emitted tokens."""
  return np.flatnonzero((traj.step_of_token == step) & traj.gen_mask)


def _broken(traj, tokenizer):
  """name -> (trajectory breaking one turn invariant, text its problem must contain)."""
  turn0, turn1 = _turn(traj, 0), _turn(traj, 1)
  ids = traj.token_ids.copy()
  # step 1 is '<think>\nIt is the Taj Mahal.\n</think>\n<response>Agra</response>': one text token changed.
  changed = int(turn1[-4])  # a text token of '...</response>' before <|im_end|>
  ids[changed] = tokenizer.encode(' Delhi')[0]
  no_end = traj.token_ids.copy()
  assert no_end[turn0[-1]] == tj.IM_END_ID
  no_end[turn0[-1]] = tokenizer.encode('.')[0]  # the turn's <|im_end|> replaced by another id
  hole = traj.gen_mask.copy()
  hole[turn0[len(turn0) // 2]] = False  # a 0 in the middle of the turn
  last_end = traj.token_ids.copy()
  last_end[turn1[-1]] = tj.ENDOFTEXT_ID  # the last turn: ends in <|endoftext|> and nothing after it
  return {
      'token_changed': (_replace(traj, token_ids=ids), 'step 1: its generated ids decode to a text that differs'),
      'im_end_replaced': (_replace(traj, token_ids=no_end), 'step 0: the assistant turn does not end in <|im_end|>'),
      'gen_hole': (_replace(traj, gen_mask=hole), 'step 0: gen_mask is not one contiguous run'),
      'last_im_end_replaced': (_replace(traj, token_ids=last_end),
                               'step 1: the assistant turn does not end in <|im_end|>'),
  }


def test_each_broken_turn_is_named(tokenizer, small_processor, rng, two_step):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  assert tj.check_trajectory(traj, tokenizer=tokenizer) == []
  for name, (bad, problem) in _broken(traj, tokenizer).items():
    problems = tj.check_trajectory(bad, tokenizer=tokenizer)
    assert any(problem in p for p in problems), (name, problems)
  token_changed = _broken(traj, tokenizer)['token_changed'][0]
  assert ' Delhi' in ''.join(tj.check_trajectory(token_changed, tokenizer=tokenizer))
  assert tj.check_trajectory(token_changed) == []  # the text check needs the tokenizer


def test_builder_turn_variants_are_sound(tokenizer, small_processor, rng):
  """Neighbours: a turn cut at max_new_tokens, one ending in <|endoftext|>, one with no token, expert text."""
  b = tj.TrajectoryBuilder(tokenizer, small_processor, [])
  b.start('Where?', rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
  cut = tokenizer.encode('<think>\nLet me se', add_special_tokens=False)
  b.append_assistant(cut, cut=True)  # im_end added with gen_mask 0
  b.append_observation(ToolResult(ok=False, error_kind='malformed_call', text='cut'))
  eot = tokenizer.encode('<think>\nhm\n</think>\n<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>',
                         add_special_tokens=False) + [tj.ENDOFTEXT_ID]
  b.append_assistant(eot)
  b.append_observation(ToolResult(ok=False, error_kind='unknown_tool', text='no x'))
  b.append_assistant([])  # an empty turn: only the added <|im_end|>
  b.append_observation(ToolResult(ok=False, error_kind='malformed_call', text='empty'))
  b.append_assistant_text(tj.render_assistant_text('Cafe\u0301 is Agra.', response='Agra'))  # not NFC
  traj = b.finish(prompt_id='p', stop_reason='response')
  assert tj.check_trajectory(traj, tokenizer=tokenizer) == []
  assert [int(traj.gen_mask[_turn(traj, 0)[-1] + 1])] == [0]  # the cut turn's im_end is not generated


def test_agent_loop_trajectories_pass_the_decoding_check(tokenizer, tmp_path):
  """The real agent loop (scripted policy, real tools): a fatal cascade, a cut turn, a response, each stored as
  JSON lines and read back, pass every check with the tokenizer."""
  from osvl_jax.rollout import agent_loop  # pylint: disable=import-outside-toplevel
  from osvl_jax.rollout import engine as engine_lib  # pylint: disable=import-outside-toplevel
  from tools import env as tools_env  # pylint: disable=import-outside-toplevel
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  crop = tj.render_assistant_text('Crop.', tool_call={'name': 'crop', 'arguments': {
      'image': 'img_1', 'x': 0, 'y': 0, 'width': 32, 'height': 16}})
  unknown = tj.render_assistant_text('Browse.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
  scripts = {'a': [crop, tj.render_assistant_text('Done.', response='Agra')], 'b': [unknown], 'c': [crop],
             'd': ['<think>\n' + 'word ' * 100]}  # d: every turn cut at max_new_tokens (malformed -> fatal)

  def script(step, context):
    key = next(k for k in scripts if f'question {k}' in tokenizer.decode(context.prompt_ids.tolist()))
    texts = scripts[key]
    return texts[min(step, len(texts) - 1)]

  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  items = [{'prompt_id': k, 'question': f'question {k}', 'image': image, 'answers': ['Agra']} for k in scripts]
  engine = engine_lib.ScriptedEngine(script, tokenizer, max_new_tokens=64)
  trajs = agent_loop.run_episodes(engine, env, lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                  items, num_generations=2, max_turns=4, fatal_k=3, fatal_index='first')
  assert [t.stop_reason for t in trajs] == ['response'] * 2 + ['fatal'] * 2 + ['max_turns'] * 2 + ['fatal'] * 2
  assert 'turn cut' in trajs[-1].steps[0].action.error
  path = tmp_path / 'rollouts.jsonl'
  tj.write_jsonl(trajs, path)
  assert tj.check_file(path, tokenizer) == (8, [])
  for t in trajs:
    assert tj.check_trajectory(t, tokenizer=tokenizer) == []


def test_check_command_reports_each_broken_turn(tokenizer, small_processor, rng, two_step, tmp_path, capsys):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  broken = _broken(traj, tokenizer)
  path = tmp_path / 'turns.jsonl'
  tj.write_jsonl([traj] + [bad for bad, _ in broken.values()], path)
  assert tj.main(['--check', str(path)]) == 1
  out = capsys.readouterr().out.strip().splitlines()
  assert out[-1] == f'trajectories=5 invalid={len(broken)}'
  for line_no, (_, problem) in enumerate(broken.values(), 2):
    assert any(l.startswith(f'{path}:{line_no}: ') and problem in l for l in out), (line_no, out)


# -- formats -------------------------------------------------------------------------------------------------

def _save(trajectories, folder):
  dataset_folder.save_split([t.to_record() for t in trajectories], folder, {'kept': len(trajectories)},
              tj.record_features())


def test_check_reads_the_pipelines_datasets_folder_and_arrow_file(tokenizer, small_processor, rng, two_step,
                                                                  tmp_path, capsys):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  bad = _broken(traj, tokenizer)['gen_hole'][0]
  _save([traj, traj], tmp_path / 'sft')
  _save([traj, bad], tmp_path / 'mixed')
  arrow = sorted((tmp_path / 'sft').glob('*.arrow'))
  assert arrow and tj.check_file(arrow[0], tokenizer) == (2, [])
  assert tj.check_file(tmp_path / 'sft', tokenizer) == (2, [])
  n, invalid = tj.check_file(tmp_path / 'mixed', tokenizer)
  assert n == 2 and [(w, who) for w, who, _ in invalid] == [('row 1', "prompt_id='q7' sample_index=3")]
  assert tj.main(['--check', str(tmp_path / 'sft'), str(arrow[0]), str(tmp_path / 'mixed')]) == 1
  out = capsys.readouterr().out.strip().splitlines()
  assert out[-1] == 'trajectories=6 invalid=1'
  assert out[0].startswith(f'{tmp_path / "mixed"}:row 1: ') and 'gen_mask is not one contiguous run' in out[0]


def test_check_names_the_formats_it_reads(tmp_path, capsys):
  dataset_folder.save_split([{'prompt_id': 'a', 'question': 'q'}], tmp_path / 'items', {})
  (tmp_path / 'blob.bin').write_bytes(bytes(range(256)) * 4)  # not UTF-8
  (tmp_path / 'log.txt').write_text('INFO starting\n{"x": 1}\n')
  (tmp_path / 'plain').mkdir()
  for path, why in [('items', "without the Trajectory record column(s) ['sample_index'"),
                    ('blob.bin', 'not a UTF-8 JSON-lines file'), ('log.txt', 'not JSON lines'),
                    ('plain', 'not a datasets folder'), ('missing.jsonl', 'no such file')]:
    assert tj.main(['--check', str(tmp_path / path), '--no-decode']) == 2, path
    captured = capsys.readouterr()
    assert why in captured.err, (path, captured.err)
    assert 'unreadable=1' in captured.out
    if path != 'missing.jsonl':
      assert 'JSON-lines files of Trajectory.to_json() records' in captured.err and '.arrow' in captured.err

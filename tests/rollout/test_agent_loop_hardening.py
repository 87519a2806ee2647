"""The agent loop never lets a tool, the image processor or the builder abort a batch (DESIGN §4): thin crops,
vision ids and end-of-sequence ids from the policy, ids outside the vocabulary, and 1,000 random turns."""

import json
import re

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.train import batching
from tools import env as tools_env

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets (batching.bucket_sizes)

ANSWER = tj.render_assistant_text('I know it now.', response='Agra')


def _crop(x, y, width, height, image='img_1'):
  return tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
      'image': image, 'x': x, 'y': y, 'width': width, 'height': height}})


def _items(*prompt_ids, size=300):
  image = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
  return [{'prompt_id': p, 'question': f'Question {p}: where is this?', 'image': image, 'answers': ['Agra']}
          for p in prompt_ids]


def _by_question(tokenizer, scripts):
  """fn(step, context) for ScriptedEngine: the script of the item whose question is in the context."""
  def turn(step, context):
    text = tokenizer.decode(context.prompt_ids.tolist())
    for key, script in scripts.items():
      if f'Question {key}:' in text:
        return script[min(step, len(script) - 1)]
    raise AssertionError('unknown item')
  return turn


def _run(tokenizer, env, make_builder, scripts, items, **kw):
  engine = engine_lib.ScriptedEngine(_by_question(tokenizer, scripts), tokenizer)
  return agent_loop.run_episodes(engine, env, make_builder, items, **{'max_turns': 4, **kw}), engine


def _solo(tokenizer, env, make_builder, key, script):
  (traj,), _ = _run(tokenizer, env, make_builder, {key: script}, _items(key))
  return traj


@pytest.mark.parametrize('box', [(0, 0, 300, 1), (0, 0, 1, 300)])
def test_thin_crop_is_a_typed_error_and_the_batch_goes_on(tokenizer, env, make_builder, box):
  scripts = {'thin': [_crop(*box), ANSWER], 'ok': [_crop(0, 0, 150, 100), ANSWER]}
  trajs, _ = _run(tokenizer, env, make_builder, scripts, _items('thin', 'ok'))
  thin, ok = trajs
  assert thin.stop_reason == 'response' and thin.final_response == 'Agra'
  result = thin.steps[0].result
  assert (result.ok, result.error_kind) == (False, 'bad_arguments')
  assert 'crop returned a result that cannot be shown' in result.text and 'aspect ratio' in result.text
  assert len(thin.images) == 1 and thin.step_format_ok == [False, True]
  assert 'aspect ratio' in tokenizer.decode(thin.token_ids.tolist())  # the model is told why
  assert tj.check_trajectory(thin) == []
  # The other episode is exactly what it is alone.
  alone = _solo(tokenizer, env, make_builder, 'ok', scripts['ok'])
  assert ok.token_ids.tolist() == alone.token_ids.tolist() and len(ok.images) == 2
  batch = batching.collate(trajs, length_multiple=64, loss_multiple=16)
  assert batch['image_grid_thw'].shape == (3, 3)


def _with_id(text, token, where='img'):
  """`text` with `token` (an added-token string) inserted before the first `where`."""
  k = text.index(where)
  return text[:k] + token + text[k:]


@pytest.mark.parametrize('token', ['<|image_pad|>', '<|vision_start|><|vision_end|>', '<|video_pad|>'])
def test_vision_ids_in_a_call_are_a_malformed_step_and_never_break_the_pad_count(tokenizer, env, make_builder,
                                                                                 token):
  scripts = {'pad': [_with_id(_crop(0, 0, 150, 100), token), _crop(0, 0, 150, 100), ANSWER],
             'ok': [_crop(0, 0, 150, 100), ANSWER]}
  trajs, engine = _run(tokenizer, env, make_builder, scripts, _items('pad', 'ok'))
  pad, ok = trajs
  assert [s.action.kind for s in pad.steps] == ['malformed', 'tool_call', 'response']
  assert 'vision tokens' in pad.steps[0].result.text and pad.steps[0].result.error_kind == 'malformed_call'
  assert pad.stop_reason == 'response' and len(pad.images) == 2  # img_1 + the crop of step 1
  emitted = engine.emitted[0].ids.tolist()
  start = int(np.flatnonzero(pad.step_of_token == 0)[0])
  assert pad.token_ids[start:start + len(emitted)].tolist() == emitted  # kept as emitted
  for context in engine.calls[1] + engine.calls[2]:  # what the policy saw next: pads == image features
    assert np.sum(context.prompt_ids == tj.IMAGE_PAD_ID) == sum(im.num_tokens for im in context.images)
  assert tj.check_trajectory(pad) == [] and ok.final_response == 'Agra'
  batch = batching.collate(trajs, length_multiple=64, loss_multiple=16)
  n_pad_inputs = int(np.sum(batch['input_ids'] == tj.IMAGE_PAD_ID))
  assert n_pad_inputs == sum(im.num_tokens for t in trajs for im in t.images)


def test_vision_ids_in_a_response_make_it_no_answer(tokenizer, env, make_builder):
  scripts = {'r': [_with_id(ANSWER, '<|vision_start|>', 'Agra'), ANSWER]}
  (traj,), _ = _run(tokenizer, env, make_builder, scripts, _items('r'))
  assert [s.action.kind for s in traj.steps] == ['malformed', 'response'] and traj.final_response == 'Agra'
  assert tj.check_trajectory(traj) == []


@pytest.mark.parametrize('eos', ['<|endoftext|>', '<|im_end|>'])
def test_either_end_of_sequence_id_ends_the_turn(tokenizer, env, make_builder, eos):
  scripts = {'e': [ANSWER + eos + _crop(0, 0, 10, 10)]}
  (traj,), engine = _run(tokenizer, env, make_builder, scripts, _items('e'))
  gen = engine.emitted[0]
  assert gen.finish_reason == engine_lib.FINISH_STOP and gen.ids[-1] == tokenizer.convert_tokens_to_ids(eos)
  assert gen.text == ANSWER
  assert traj.stop_reason == 'response' and traj.final_response == 'Agra' and traj.step_format_ok == [True]
  assert traj.token_ids[-1] == tj.IM_END_ID and tj.check_trajectory(traj) == []


class _RawEngine(engine_lib.Engine):
  """Returns fixed id lists per prompt (by a marker in the question), else the answer."""

  def __init__(self, tokenizer, ids_by_key):
    self.tokenizer, self.ids_by_key = tokenizer, ids_by_key

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    out = []
    for c in map(engine_lib.as_context, contexts):
      text = self.tokenizer.decode(c.prompt_ids.tolist())
      ids = next((v for k, v in self.ids_by_key.items() if f'Question {k}:' in text), None)
      if ids is None:
        ids = self.tokenizer.encode(ANSWER, add_special_tokens=False) + [tj.IM_END_ID]
      out.append(engine_lib.Generation(np.asarray(ids), np.zeros(len(ids)), '', engine_lib.FINISH_STOP))
    return out


def test_ids_outside_the_vocabulary_end_only_that_trajectory(tokenizer, env, make_builder):
  engine = _RawEngine(tokenizer, {'bad': [9707, tj.VOCAB_SIZE + 5, tj.IM_END_ID]})
  bad, ok = agent_loop.run_episodes(engine, env, make_builder, _items('bad', 'ok'), max_turns=3)
  assert (bad.stop_reason, bad.steps, bad.final_response) == ('error', [], None)
  assert 'outside the vocabulary' in bad.error and ok.error is None
  assert bad.gen_mask.sum() == 0 and tj.check_trajectory(bad) == []
  assert (ok.stop_reason, ok.final_response) == ('response', 'Agra')
  batch = batching.collate([bad, ok], length_multiple=64, loss_multiple=16)
  assert batch['completion_mask'][0].sum() == 0 and batch['completion_mask'][1].sum() == ok.gen_mask[1:].sum()


def test_an_observation_that_cannot_be_appended_at_all_ends_the_trajectory(tokenizer, env, make_builder):
  class Refusing(tj.TrajectoryBuilder):
    def append_observation(self, result):
      raise ValueError('refused')
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  builders = iter([Refusing(tokenizer, processor, env.schemas()), make_builder()])
  scripts = {'a': [_crop(0, 0, 150, 100), ANSWER], 'b': [_crop(0, 0, 150, 100), ANSWER]}
  engine = engine_lib.ScriptedEngine(_by_question(tokenizer, scripts), tokenizer)
  refused, ok = agent_loop.run_episodes(engine, env, lambda: next(builders), _items('a', 'b'), max_turns=3)
  assert (refused.stop_reason, refused.steps) == ('error', [])  # the step that could not be answered is dropped
  assert 'observation of step 0 cannot be appended' in refused.error and 'refused' in refused.error
  assert refused.token_ids.tolist() == engine.calls[0][0].prompt_ids.tolist()
  assert tj.check_trajectory(refused) == [] and ok.final_response == 'Agra'


@pytest.mark.parametrize('bad_image, why', [
    (np.zeros((1, 300, 3), np.uint8), 'aspect ratio'),     # aspect > 200
    (np.zeros((64, 64), np.uint8), 'img_1'),               # not RGB
    (np.zeros((64, 64, 4), np.uint8), 'img_1'),            # RGBA
    (np.zeros((64, 64, 3), np.float32), 'img_1'),          # not uint8
])
def test_a_refused_prompt_image_ends_only_its_own_trajectories(tokenizer, env, make_builder, bad_image, why):
  """The processor refuses one item's input image: its G samples are prompt-only trajectories (stop_reason
  'error', the reason stored, no steps), the other item's samples are exactly what they are alone, and the whole
  batch goes through GRPO's `prepare_batch` (the failed group has zero advantages and no loss tokens)."""
  scripts = {'bad': [ANSWER], 'ok': [_crop(0, 0, 150, 100), ANSWER]}
  items = [{**_items('bad')[0], 'image': bad_image}, _items('ok')[0]]
  trajs, engine = _run(tokenizer, env, make_builder, scripts, items, num_generations=2)
  assert [(t.prompt_id, t.sample_index) for t in trajs] == [('bad', 0), ('bad', 1), ('ok', 0), ('ok', 1)]
  for bad in trajs[:2]:
    assert (bad.stop_reason, bad.steps, bad.images, bad.final_response) == ('error', [], [], None)
    assert bad.error.startswith("prompt_id='bad': the prompt cannot be rendered: ValueError") and why in bad.error
    assert not bad.gen_mask.any() and bad.question == items[0]['question'] and tj.check_trajectory(bad) == []
    assert 'Question bad: where is this?' in tokenizer.decode(bad.token_ids.tolist())  # the text-only prompt
    assert tj.Trajectory.from_json(bad.to_json()).error == bad.error
  assert all('Question bad:' not in tokenizer.decode(c.prompt_ids.tolist()) for c, *_ in engine.calls)
  alone = _solo(tokenizer, env, make_builder, 'ok', scripts['ok'])
  for ok in trajs[2:]:
    assert (ok.stop_reason, ok.final_response, ok.error) == ('response', 'Agra', None)
    assert ok.token_ids.tolist() == alone.token_ids.tolist() and len(ok.images) == 2
  import ml_collections  # pylint: disable=g-import-not-at-top
  from osvl_jax.train import grpo_batch  # pylint: disable=g-import-not-at-top
  cfg = ml_collections.ConfigDict(dict(alpha=0.8, delta=1e-6, fatal_mode='mask_clamp', estimator='grpo',
                                       std_ddof=1, num_generations=2, length_buckets=LENGTH_BUCKETS, loss_bucket=16))
  batch, _, scores, _ = grpo_batch.prepare_batch(trajs, cfg)
  assert [s['r_fmt'] for s in scores[:2]] == [0.0, 0.0]
  np.testing.assert_array_equal(batch['advantages'][:2], [0, 0])
  assert not batch['loss_mask'][:2].any() and batch['loss_mask'][2:].any()


# ---------------------------------------------------------------------------------------------------------------
# Robustness: 1,000+ random assistant turns.
# ---------------------------------------------------------------------------------------------------------------

SPECIAL_IDS = list(range(151643, 151669))
_NUMBERS = [0, 1, -1, 7, 31, 300, 10 ** 6, 10 ** 30, -10 ** 30, 1e308, float('inf'), 2.5, '12', 'abc', None, [],
            {'x': 1}]
_IMAGES = ['img_1', 'img_2', 'img_3', 'img_0', 'img_-1', 'img_99', 'img_999999999999', '', 'IMG_1', None, 3]


class _FuzzEngine(engine_lib.Engine):
  """Random turns: raw ids (every special id, ids past the tokenizer, out-of-vocabulary ids) or random calls."""

  def __init__(self, tokenizer, seed):
    self.tokenizer = tokenizer
    self.rng = np.random.default_rng(seed)
    self.turns = 0
    self.emitted: set[int] = set()

  def _call_text(self):
    rng = self.rng
    name = rng.choice(['crop', 'crop', 'crop', 'sharpen', 'text_search', 'zoom', ''])
    args = {'image': _IMAGES[rng.integers(len(_IMAGES))]}
    for key in ('x', 'y', 'width', 'height', 'amount')[:rng.integers(0, 6)]:
      args[key] = _NUMBERS[rng.integers(len(_NUMBERS))]
    if rng.random() < 0.3:  # a thin or huge box
      args.update(x=int(rng.integers(-5, 64)), y=int(rng.integers(-5, 64)), width=int(rng.choice([1, 2, 64, 10 ** 9])),
                  height=int(rng.choice([1, 64, 300])))
    body = json.dumps({'name': str(name), 'arguments': args}, allow_nan=True)
    text = f'<think>{rng.integers(1000)}</think>\n<tool_call>\n{body}\n</tool_call>'
    if rng.random() < 0.2:
      text = text[:rng.integers(len(text))]  # cut anywhere
    return text

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    out = []
    for _ in contexts:
      rng = self.rng
      kind = rng.random()
      if kind < 0.45:
        ids = self.tokenizer.encode(self._call_text(), add_special_tokens=False)
      elif kind < 0.5:
        ids = self.tokenizer.encode(ANSWER, add_special_tokens=False)
      else:
        ids = []
      n = int(rng.integers(0, 30))
      noise = rng.integers(0, 151643, n)
      specials = rng.choice(SPECIAL_IDS, n)
      noise = np.where(rng.random(n) < 0.4, specials, noise)
      if self.turns < len(SPECIAL_IDS):
        noise = np.append(noise, SPECIAL_IDS[self.turns])  # every special id at least once
      if rng.random() < 0.01:
        noise = np.append(noise, rng.choice([tj.VOCAB_SIZE, 10 ** 6, -3]))
      if rng.random() < 0.03:
        noise = np.append(noise, rng.integers(151669, tj.VOCAB_SIZE))  # rows past the tokenizer's table
      ids = list(ids)
      for t in noise:
        ids.insert(int(rng.integers(0, len(ids) + 1)), int(t))
      if rng.random() < 0.7:
        ids.append(tj.IM_END_ID)
      if max_new_tokens is not None and len(ids) > max_new_tokens:
        ids = ids[:max_new_tokens]
      reason = engine_lib.FINISH_STOP if ids and ids[-1] in tj.EOS_IDS else engine_lib.FINISH_LENGTH
      self.emitted.update(ids)
      self.turns += 1
      logprobs = None if rng.random() < 0.1 else -rng.random(len(ids))
      out.append(engine_lib.Generation(np.asarray(ids, np.int64), logprobs, '', reason))
    return out


def test_random_turns_never_escape_and_every_trajectory_trains(tokenizer, make_builder):
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})
  engine = _FuzzEngine(tokenizer, seed=0)
  items = [{'prompt_id': f'p{i}', 'question': f'Question {i}?',
            'image': np.random.default_rng(i).integers(0, 256, (48, 80, 3), dtype=np.uint8)} for i in range(80)]
  trajs = agent_loop.run_episodes(engine, env, make_builder, items, num_generations=4, max_turns=6, fatal_k=5,
                                  max_total_tokens=6000, max_new_tokens=96)
  assert engine.turns >= 1000
  assert set(SPECIAL_IDS) <= engine.emitted
  assert [(t.prompt_id, t.sample_index) for t in trajs] == [(f'p{i}', g) for i in range(80) for g in range(4)]
  for t in trajs:
    assert tj.check_trajectory(t, tokenizer=tokenizer) == [], (t.prompt_id, t.sample_index)
    assert t.num_tokens <= 6000
  reasons = {t.stop_reason for t in trajs}
  assert reasons <= set(tj.STOP_REASONS) and {'error', 'fatal', 'response', 'context_full'} <= reasons
  kinds = {s.result.error_kind for t in trajs for s in t.steps if s.result is not None}
  assert {'malformed_call', 'bad_arguments'} <= kinds
  for k in range(0, len(trajs), 80):
    batch = batching.collate(trajs[k:k + 80], length_multiple=256, loss_multiple=64)
    pads = int(np.sum(batch['input_ids'] == tj.IMAGE_PAD_ID))
    assert pads == sum(im.num_tokens for t in trajs[k:k + 80] for im in t.images)
    assert batch['completion_mask'].sum() == sum(int(t.gen_mask[1:].sum()) for t in trajs[k:k + 80])


class _ValuesEngine(engine_lib.Engine):
  """Returns fixed (ids, log-probs) per prompt (by a marker in the question), else the answer with log-probs -0.1."""

  def __init__(self, tokenizer, turns_by_key):
    self.tokenizer, self.turns_by_key = tokenizer, turns_by_key

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    out = []
    for c in map(engine_lib.as_context, contexts):
      text = self.tokenizer.decode(c.prompt_ids.tolist())
      answer = self.tokenizer.encode(ANSWER, add_special_tokens=False) + [tj.IM_END_ID]
      ids, logprobs = next((v for k, v in self.turns_by_key.items() if f'Question {k}:' in text),
                           (answer, [-0.1] * len(answer)))
      out.append(engine_lib.Generation(np.asarray(ids), np.asarray(logprobs), '', engine_lib.FINISH_STOP))
    return out


@pytest.mark.parametrize('ids, logprobs, why', [
    ([9707, tj.VOCAB_SIZE + 5, tj.IM_END_ID], [-0.1] * 3, r'id 151941 at position 1 is outside the vocabulary '
                                                          r'\[0, 151936\)'),
    ([9707, -2, tj.IM_END_ID], [-0.1] * 3, r'id -2 at position 1 is outside the vocabulary'),
    ([9707, 11, tj.IM_END_ID], [-0.1, float('nan'), -0.2], r'log-prob nan at position 1 \(id 11\)'),
    ([9707, 11, tj.IM_END_ID], [-0.1, -0.3, float('-inf')], r'log-prob -inf at position 2'),
    ([9707, 11, tj.IM_END_ID], [2.5, -0.3, -0.1], r'log-prob 2.5 at position 0'),
])
def test_an_engine_output_out_of_range_is_an_engine_error_naming_the_value(tokenizer, env, make_builder, ids,
                                                                           logprobs, why):
  """Ids outside the model's vocabulary and log-probs that are not finite numbers <= 0 are an engine fault: that
  trajectory ends at its last whole step with an engine error naming the value (never a turn appended with them, so
  NaN never reaches the trainer's log-prob mismatch); the other trajectories go on."""
  engine = _ValuesEngine(tokenizer, {'bad': (ids, logprobs)})
  bad, ok = agent_loop.run_episodes(engine, env, make_builder, _items('bad', 'ok'), max_turns=3)
  assert (bad.stop_reason, bad.steps) == ('error', [])
  assert bad.error.startswith('engine _ValuesEngine failed at step 0: ')
  assert re.search(why, bad.error), bad.error
  assert bad.gen_mask.sum() == 0 and tj.check_trajectory(bad) == []
  assert (ok.stop_reason, ok.final_response, ok.error) == ('response', 'Agra', None)
  assert np.all(np.isfinite(ok.rollout_logprobs))

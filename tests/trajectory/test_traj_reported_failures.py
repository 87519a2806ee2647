"""Small inputs taken from failures reported against public multimodal agent-RL code, each with the right value.

1. A tool returns an image in the last turn and the budget is hit right after: the image is fully in or out.
2. A prompt with an image over the prompt budget: a clear error recorded in its trajectory (prompt-only, no
   image, no steps), never a silently cut placeholder run.
3. Three images (64x64, 96x160, 200x120) across three turns: positions equal HF `get_rope_index`.
4. Tool-call JSON with trailing commas / single quotes is accepted (as json5 is by the official code); two calls in
   one turn are a format violation (r_fmt^(l) = 0) and only the first is executed.
"""

import re

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.rl import rewards
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.train import batching
from tools import env as tools_env
from tools.base import ToolResult

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 48, 'height': 40}})
ANSWER = tj.render_assistant_text('Done.', response='Agra')


@pytest.fixture(scope='module')
def env():
  return tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})


@pytest.fixture(scope='module')
def make_builder(tokenizer, env):
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=128 * 128)
  return lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas())


def _item(rng_seed=0, size=(64, 64)):
  image = np.random.default_rng(rng_seed).integers(0, 256, (*size, 3), dtype=np.uint8)
  return {'prompt_id': 'q0', 'question': 'In which city is this building?', 'image': image, 'answers': ['Agra']}


def _run(tokenizer, env, make_builder, script, **kw):
  engine = engine_lib.ScriptedEngine(script, tokenizer)
  return agent_loop.run_episodes(engine, env, make_builder, [_item()], **{'max_turns': 4, **kw})[0]


# 1 ------------------------------------------------------------------------------------------------------------

def test_an_image_returned_just_before_the_budget_is_fully_in_or_fully_out(tokenizer, env, make_builder):
  full = _run(tokenizer, env, make_builder, [CROP, ANSWER])
  assert len(full.images) == 2
  prompt_end = int(np.flatnonzero(full.step_of_token == -1)[-1]) + 1
  step0_end = int(np.flatnonzero(full.step_of_token == 0)[-1]) + 1  # after img_2's span + '<|im_start|>assistant\n'
  span = np.flatnonzero(full.token_ids == tj.VISION_START_ID)[1]
  # Budgets: exactly the step, one short, inside img_2's pad run, right at its <|vision_start|>.
  for budget, image_in in [(step0_end, True), (step0_end - 1, False), (span + 5, False), (span + 1, False)]:
    cut = _run(tokenizer, env, make_builder, [CROP, ANSWER], max_total_tokens=budget)
    assert cut.stop_reason == 'token_budget' and cut.truncated and cut.num_tokens <= budget
    assert tj.check_trajectory(cut) == []
    batch = batching.collate([cut], length_multiple=64, loss_multiple=16)
    n_pads = int(np.sum(batch['input_ids'] == tj.IMAGE_PAD_ID))
    if image_in:  # ids, pads and pixels of img_2 all present, identical to the uncut run
      assert len(cut.images) == 2 and len(cut.steps) == 1
      np.testing.assert_array_equal(cut.token_ids, full.token_ids[:step0_end])
      np.testing.assert_array_equal(batch['pixel_values'], full.pixel_values)
      assert n_pads == sum(im.num_tokens for im in full.images)
    else:  # the whole step (call + observation + img_2) is gone: nothing of img_2 remains
      assert len(cut.images) == 1 and len(cut.steps) == 0
      np.testing.assert_array_equal(cut.token_ids, full.token_ids[:prompt_end])
      np.testing.assert_array_equal(batch['pixel_values'], full.images[0].pixel_values)
      assert n_pads == full.images[0].num_tokens
      assert int(np.sum(cut.token_ids == tj.VISION_START_ID)) == 1


# 2 ------------------------------------------------------------------------------------------------------------

def _assert_prompt_only_error(traj, match, budget):
  """A prompt that could not be rendered: stop_reason 'error' with the reason, no steps, no image, within the
  budget, and still a valid trajectory the trainer batches (it carries no gradient)."""
  assert (traj.stop_reason, traj.steps, traj.images, traj.final_response) == ('error', [], [], None)
  assert re.search(match, traj.error), traj.error
  assert traj.num_tokens <= budget and not traj.gen_mask.any() and (traj.step_of_token == -1).all()
  assert not np.isin(traj.token_ids, tj.VISION_IDS).any() and traj.question == _item()['question']
  assert tj.check_trajectory(traj) == []
  batch = batching.collate([traj], length_multiple=64, loss_multiple=16)
  assert batch['pixel_values'] is None and not np.asarray(batch['completion_mask']).any()


def test_a_prompt_with_an_image_over_the_prompt_budget_is_a_clear_error(tokenizer, env, make_builder):
  builder = make_builder()
  builder.start(_item()['question'], _item()['image'])
  length = builder.num_tokens
  image_start = int(np.flatnonzero(builder.prompt_ids() == tj.VISION_START_ID)[0])
  for budget in (length - 1, image_start + 3):  # just short; inside the image's pad run
    traj = _run(tokenizer, env, make_builder, [ANSWER], max_prompt_tokens=budget)
    _assert_prompt_only_error(traj, r"prompt_id='q0'.*PromptTooLongError.*image span.*never cut", budget)
    refused = make_builder()
    with pytest.raises(tj.PromptTooLongError, match=f'over the prompt budget of {budget}'):
      refused.start(_item()['question'], _item()['image'], max_tokens=budget)
    assert refused.num_tokens == 0 and refused.images == []  # transactional: nothing of the prompt is kept
  traj = _run(tokenizer, env, make_builder, [ANSWER], max_total_tokens=length)  # no room left to generate
  _assert_prompt_only_error(traj, 'max_total_tokens', length)
  traj = _run(tokenizer, env, make_builder, [ANSWER], max_prompt_tokens=length)  # exactly at the budget: fine
  assert traj.final_response == 'Agra'


# 3 ------------------------------------------------------------------------------------------------------------

def _three_image_builder(tokenizer, rng):
  """A builder holding: prompt image 64x64, crop -> 96x160 image, crop -> 200x120 image, answer (3 steps)."""
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=256 * 256)
  b = tj.TrajectoryBuilder(tokenizer, processor, [])
  image = lambda h, w: rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
  b.start('Where is it?', image(64, 64))
  b.append_assistant_text(CROP)
  b.append_observation(ToolResult(ok=True, text='Here is the crop.', images=[image(96, 160)]))
  b.append_assistant_text(CROP)
  b.append_observation(ToolResult(ok=True, text='And another.', images=[image(200, 120)]))
  b.append_assistant_text(ANSWER)
  return b


def _three_image_trajectory(tokenizer, rng):
  return _three_image_builder(tokenizer, rng).finish(prompt_id='three')


def test_three_images_across_three_turns_get_hf_positions(tokenizer, rng):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=g-import-not-at-top
  long = _three_image_trajectory(tokenizer, rng)
  assert long.image_grid_thw.tolist() == [[1, 4, 4], [1, 6, 10], [1, 12, 8]]
  short = _run_short(tokenizer, rng)  # a second, shorter row: right padding in the batch
  batch = batching.collate([long, short], length_multiple=64, loss_multiple=16)
  torch.manual_seed(0)
  hf = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**Qwen3VLConfig.tiny().to_hf_dict()))
  ids = torch.tensor(batch['input_ids'], dtype=torch.long)
  ref, ref_deltas = hf.model.get_rope_index(
      ids, torch.tensor((batch['input_ids'] == tj.IMAGE_PAD_ID).astype(np.int32)),
      torch.tensor(batch['image_grid_thw'], dtype=torch.long),
      attention_mask=torch.tensor(batch['attention_mask'].astype(np.int64)))
  np.testing.assert_array_equal(batch['position_ids'], ref.numpy())
  _, deltas = rope.get_rope_index(batch['input_ids'], batch['image_grid_thw'], batch['attention_mask'])
  np.testing.assert_array_equal(deltas, ref_deltas.numpy())
  # The 200x120 image (merged grid 6x4) spans 6 positions on the height axis after its <|vision_start|>.
  vs = np.flatnonzero(long.token_ids == tj.VISION_START_ID)[2]
  p = batch['position_ids'][:, 0]
  assert p[1, vs + 1 + 23] - p[1, vs + 1] == 5 and p[2, vs + 1 + 23] - p[2, vs + 1] == 3
  assert (p[:, vs + 1 + 24] == p[0, vs + 1] + 6).all()  # <|vision_end|> resumes at start + max(6, 4)


def test_positions_after_a_cut_at_a_token_budget_get_hf_positions(tokenizer, rng):
  """The three-image trajectory cut at a token budget that falls inside its second step, the way the agent loop
  cuts (`TrajectoryBuilder.truncate` to whole steps): the cut row (two images, ending at
  '<|im_start|>assistant\n'), next to a right-padded row, gets HF's position ids and rope deltas."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=g-import-not-at-top
  b = _three_image_builder(tokenizer, rng)
  full = b.finish()
  kept = int(np.flatnonzero(full.step_of_token <= 0)[-1]) + 1   # end of step 0 (its observation included)
  budget = kept + 30                      # inside the second step: the whole step (and its image) goes
  assert kept < budget < full.num_tokens
  b.truncate(1)
  cut = b.finish(prompt_id='cut', stop_reason='token_budget')
  assert cut.num_tokens == kept and cut.image_grid_thw.tolist() == [[1, 4, 4], [1, 6, 10]] and cut.truncated
  batch = batching.collate([_run_short(tokenizer, rng), cut], length_multiple=64, loss_multiple=16)
  torch.manual_seed(0)
  hf = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**Qwen3VLConfig.tiny().to_hf_dict()))
  ref, ref_deltas = hf.model.get_rope_index(
      torch.tensor(batch['input_ids'], dtype=torch.long),
      torch.tensor((batch['input_ids'] == tj.IMAGE_PAD_ID).astype(np.int32)),
      torch.tensor(batch['image_grid_thw'], dtype=torch.long),
      attention_mask=torch.tensor(batch['attention_mask'].astype(np.int64)))
  np.testing.assert_array_equal(batch['position_ids'], ref.numpy())
  pos, deltas = rope.get_rope_index(batch['input_ids'], batch['image_grid_thw'], batch['attention_mask'])
  np.testing.assert_array_equal(pos, ref.numpy())
  np.testing.assert_array_equal(deltas, ref_deltas.numpy())
  # The cut row ends right after its last real token: position of the last token + 1 == length + delta.
  last = kept - 1
  assert pos[0, 1, last] + 1 == kept + deltas[1, 0]


def _run_short(tokenizer, rng):
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=256 * 256)
  b = tj.TrajectoryBuilder(tokenizer, processor, [])
  b.start('Where?', rng.integers(0, 256, (64, 96, 3), dtype=np.uint8))
  b.append_assistant_text(ANSWER)
  return b.finish(prompt_id='short')


# 4 ------------------------------------------------------------------------------------------------------------

LENIENT = ("<think>\nzoom\n</think>\n<tool_call>\n{'name': 'crop', 'arguments': {'image': 'img_1', 'x': 0, 'y': 0, "
           "'width': 48, 'height': 40,},}\n</tool_call>")
BARE_KEYS = ("<think>\nzoom\n</think>\n<tool_call>\n{name: 'sharpen', arguments: {image: 'img_1', amount: 2,}}"
             "\n</tool_call>")
TWO_BLOCKS = ('<think>\nboth\n</think>\n<tool_call>\n{"name": "crop", "arguments": {"image": "img_1", "x": 0, "y": 0, '
              '"width": 48, "height": 40}}\n</tool_call>\n<tool_call>\n{"name": "sharpen", "arguments": '
              '{"image": "img_1"}}\n</tool_call>')
TWO_IN_ONE = ('<think>\nboth\n</think>\n<tool_call>\n[{"name": "crop", "arguments": {"image": "img_1", "x": 0, "y": 0, '
              '"width": 48, "height": 40}}, {"name": "sharpen", "arguments": {"image": "img_1"}}]\n</tool_call>')


@pytest.mark.parametrize('text, name, arguments', [
    (LENIENT, 'crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 48, 'height': 40}),
    (BARE_KEYS, 'sharpen', {'image': 'img_1', 'amount': 2}),
])
def test_trailing_commas_single_quotes_and_bare_keys_are_accepted(tokenizer, env, make_builder, text, name,
                                                                   arguments):
  action = tj.parse_action(text)
  assert (action.kind, action.name, action.arguments, action.format_ok) == ('tool_call', name, arguments, True)
  traj = _run(tokenizer, env, make_builder, [text, ANSWER])
  assert traj.steps[0].result.ok and len(traj.images) == 2  # executed: the tool's image is in the trajectory
  assert traj.step_format_ok == [True, True]
  assert rewards.format_reward(traj.step_format_ok, traj.fatal_step) == 1.0


@pytest.mark.parametrize('text', [TWO_BLOCKS, TWO_IN_ONE], ids=['two_blocks', 'list_in_one_block'])
def test_two_tool_calls_in_one_turn_break_the_format_and_only_the_first_runs(tokenizer, env, make_builder, text):
  action = tj.parse_action(text)
  assert action.kind == 'tool_call' and action.name == 'crop' and not action.format_ok
  assert any('first is executed' in p for p in action.problems)
  traj = _run(tokenizer, env, make_builder, [text, ANSWER])
  step = traj.steps[0]
  assert step.result.ok and step.result.text.startswith('Cropped') and len(step.result.images) == 1
  assert step.result.images[0].shape == (40, 48, 3)  # the crop, not a sharpened 64x64
  assert len(traj.images) == 2  # img_1 + the one crop: the second call never ran
  assert traj.step_format_ok == [False, True]  # r_fmt^(0) = 0
  assert rewards.format_reward(traj.step_format_ok, traj.fatal_step) == 0.5

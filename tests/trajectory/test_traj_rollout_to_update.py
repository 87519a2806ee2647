"""Rollout -> update identity: the tensors the loss sees (`batching.collate`) are exactly the ids, images and masks
the policy saw and emitted during a multi-turn rollout whose tools return images; earlier <think> blocks stay."""

import numpy as np
import pytest
from PIL import Image

from osvl_jax import paths
from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.train import batching
from tools import image_ops
from tools import env as tools_env

CROP_1 = {'image': 'img_1', 'x': 40, 'y': 10, 'width': 160, 'height': 96}
CROP_3 = {'image': 'img_3', 'x': 16, 'y': 16, 'width': 64, 'height': 48}
SCRIPT = [
    tj.render_assistant_text('The dome matters; zoom in on it.', tool_call={'name': 'crop', 'arguments': CROP_1}),
    tj.render_assistant_text('The crop is soft; sharpen it.', tool_call={'name': 'sharpen',
                                                                          'arguments': {'image': 'img_2'}}),
    tj.render_assistant_text('Look closer at the arch.', tool_call={'name': 'crop', 'arguments': CROP_3}),
    tj.render_assistant_text('White marble, Mughal dome: the Taj Mahal.', response='Agra'),
]


@pytest.fixture(scope='module')
def env():
  return tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})


@pytest.fixture(scope='module')
def processor():
  return tj.ImageProcessor(min_pixels=32 * 32, max_pixels=128 * 128)


@pytest.fixture(scope='module')
def photo():
  return np.asarray(Image.open(paths.data_dir() / 'images' / 'landmarks' / 'taj-mahal.jpg').convert('RGB'))


@pytest.fixture(scope='module')
def rollout(tokenizer, env, processor, photo):
  engine = engine_lib.ScriptedEngine(SCRIPT, tokenizer)
  item = {'prompt_id': 'taj', 'question': 'In which city is this building?', 'image': photo, 'answers': ['Agra']}
  (traj,) = agent_loop.run_episodes(engine, env, lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                    [item], max_turns=6)
  return traj, engine


def test_update_tensors_are_exactly_the_rollouts_ids_images_and_masks(rollout, processor, photo):
  traj, engine = rollout
  assert traj.final_response == 'Agra' and traj.stop_reason == 'response' and len(traj.images) == 4
  batch = batching.collate([traj], length_multiple=64, loss_multiple=16)
  t = traj.num_tokens
  ids = batch['input_ids'][0]
  # Ids: every context the engine saw is a prefix of the update's ids; the emitted ids follow it verbatim.
  contexts = [calls[0] for calls in engine.calls]
  assert len(contexts) == 4
  for k, context in enumerate(contexts):
    n = len(context.prompt_ids)
    np.testing.assert_array_equal(ids[:n], context.prompt_ids)
    np.testing.assert_array_equal(ids[n:n + engine.emitted[k].ids.size], engine.emitted[k].ids)
  np.testing.assert_array_equal(ids[:t], traj.token_ids)
  assert np.all(ids[t:] == batching.PAD_ID)
  np.testing.assert_array_equal(batch['attention_mask'][0], np.arange(ids.size) < t)
  # Loss targets: exactly the emitted ids, in order, at the positions they were emitted, with their step.
  valid = batch['completion_mask'][0]
  emitted = np.concatenate([g.ids for g in engine.emitted])
  np.testing.assert_array_equal(batch['loss_targets'][0][valid], emitted)
  np.testing.assert_array_equal(ids[batch['loss_positions'][0][valid] + 1], emitted)
  np.testing.assert_array_equal(batch['loss_step'][0][valid],
                                np.concatenate([[k] * g.ids.size for k, g in enumerate(engine.emitted)]))
  # Images: the images each context carried are the update's images, in order, with the same pixel_values.
  offsets = np.cumsum([0] + [int(np.prod(im.grid_thw)) for im in traj.images])
  for context in contexts:
    for j, im in enumerate(context.images):
      np.testing.assert_array_equal(batch['pixel_values'][offsets[j]:offsets[j + 1]], im.pixel_values)
      np.testing.assert_array_equal(batch['image_grid_thw'][j], im.grid_thw)
  assert [len(c.images) for c in contexts] == [1, 2, 3, 4]
  assert batch['pixel_values'].shape == (offsets[-1], 1536)
  # ... and those are the pixels the tools really produced, computed here independently.
  img2, _ = image_ops.crop(photo, **{k: v for k, v in CROP_1.items() if k != 'image'})
  img3 = image_ops.sharpen(img2, amount=1.5, sigma=1.0)
  img4, _ = image_ops.crop(img3, **{k: v for k, v in CROP_3.items() if k != 'image'})
  for j, pixels in enumerate([photo, img2, img3, img4]):
    want = processor.process(pixels)
    np.testing.assert_array_equal(traj.images[j].pixels, pixels)
    np.testing.assert_array_equal(batch['pixel_values'][offsets[j]:offsets[j + 1]], want.pixel_values)
    np.testing.assert_array_equal(batch['image_grid_thw'][j], want.grid_thw)
  # Positions: the 3-D MRoPE positions of exactly these ids and grids, from the HF reference implementation
  # (transformers' Qwen3-VL `get_rope_index`, as osvl_jax/models/qwen3_vl/parity.py builds it), not from our own
  # `rope.get_rope_index` that collate calls.
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=import-outside-toplevel
  hf = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**Qwen3VLConfig.tiny().to_hf_dict()))
  ids_t = torch.tensor(traj.token_ids[None], dtype=torch.long)
  want_pos, _ = hf.model.get_rope_index(ids_t, (ids_t == tj.IMAGE_PAD_ID).int(),
                                        torch.tensor(traj.image_grid_thw, dtype=torch.long),
                                        attention_mask=torch.ones_like(ids_t))
  np.testing.assert_array_equal(batch['position_ids'][:, 0, :t], want_pos.numpy()[:, 0])
  assert np.all(batch['position_ids'][:, 0, t:] == 0)
  # Hand check: text positions before the first image are 0..k-1 on all three axes, and the first image's
  # pads (merged grid h x w) take h rows / w columns starting at the <|vision_start|> position + 1.
  vs = int(np.flatnonzero(traj.token_ids == tj.VISION_START_ID)[0])
  np.testing.assert_array_equal(batch['position_ids'][:, 0, :vs + 1], np.tile(np.arange(vs + 1), (3, 1)))
  _, gh, gw = (int(x) // m for x, m in zip(traj.image_grid_thw[0], (1, 2, 2)))
  pads = batch['position_ids'][:, 0, vs + 1:vs + 1 + gh * gw]
  np.testing.assert_array_equal(pads[0], np.full(gh * gw, vs + 1))
  np.testing.assert_array_equal(pads[1], vs + 1 + np.repeat(np.arange(gh), gw))
  np.testing.assert_array_equal(pads[2], vs + 1 + np.tile(np.arange(gw), gh))
  assert batch['position_ids'][0, 0, vs + 1 + gh * gw] == vs + 1 + max(gh, gw)  # <|vision_end|>


def test_stored_trajectory_collates_to_the_same_tensors(rollout, tmp_path):
  traj, _ = rollout
  tj.write_jsonl([traj], tmp_path / 'traj.jsonl')
  (back,) = list(tj.read_jsonl(tmp_path / 'traj.jsonl'))
  a = batching.collate([traj], length_multiple=64, loss_multiple=16)
  b = batching.collate([back], length_multiple=64, loss_multiple=16)
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  assert back.stop_reason == 'response'


def test_earlier_think_blocks_stay_in_the_context_exactly_as_generated(rollout, tokenizer):
  traj, engine = rollout
  last_context = engine.calls[-1][0].prompt_ids
  for k, gen in enumerate(engine.emitted[:-1]):
    ids = gen.ids.tolist()
    assert ids[0] == tj.THINK_ID and tj.THINK_END_ID in ids
    starts = [i for i in range(len(last_context) - len(ids) + 1) if last_context[i] == ids[0]
              and last_context[i:i + len(ids)].tolist() == ids]
    assert len(starts) == 1, f'turn {k} is not verbatim in the last context'
    think = SCRIPT[k][:SCRIPT[k].index('</think>') + len('</think>')]
    assert tokenizer.decode(ids[:ids.index(tj.THINK_END_ID) + 1]) == think
  after_prompt = last_context[len(engine.calls[0][0].prompt_ids):]
  assert int(np.sum(after_prompt == tj.THINK_ID)) == int(np.sum(after_prompt == tj.THINK_END_ID)) == 3
  assert 'The dome matters; zoom in on it.' in tokenizer.decode(after_prompt.tolist())
  assert traj.steps[0].action.think == 'The dome matters; zoom in on it.'

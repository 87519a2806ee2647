"""Shared fixtures for the trajectory tests: the real Qwen tokenizer and a small image processor."""

import numpy as np
import pytest

from tools.base import ToolResult

from osvl_jax import trajectory as tj

# Four compact schemas in the Hermes / OpenAI function format (same shape as tools.env.ToolEnv.schemas()).
_IMG = {'type': 'string', 'description': 'Image name, e.g. "img_1".'}
SCHEMAS = [
    {'type': 'function', 'function': {
        'name': 'text_search', 'description': 'Search Wikipedia; returns top articles as "[k] Title: snippet".',
        'parameters': {'type': 'object', 'properties': {'query': {'type': 'string'}, 'top_k': {'type': 'integer'}},
                       'required': ['query']}}},
    {'type': 'function', 'function': {
        'name': 'image_search', 'description': 'Reverse image search: names the landmark in an image.',
        'parameters': {'type': 'object', 'properties': {'image': _IMG}, 'required': ['image']}}},
    {'type': 'function', 'function': {
        'name': 'crop', 'description': 'Crop a pixel box of an image; returns a new image.',
        'parameters': {'type': 'object', 'properties': {
            'image': _IMG, 'x': {'type': 'integer'}, 'y': {'type': 'integer'}, 'width': {'type': 'integer'},
            'height': {'type': 'integer'}}, 'required': ['image', 'x', 'y', 'width', 'height']}}},
    {'type': 'function', 'function': {
        'name': 'sharpen', 'description': 'Sharpen a blurry image; returns a new image.',
        'parameters': {'type': 'object', 'properties': {'image': _IMG, 'amount': {'type': 'number'}},
                       'required': ['image']}}},
]


@pytest.fixture(scope='session')
def tokenizer():
  return tj.load_tokenizer()


@pytest.fixture(scope='session')
def small_processor():
  """32x32 minimum area so that small test images stay small (64x64 -> 4 image tokens)."""
  return tj.ImageProcessor(min_pixels=32 * 32, max_pixels=256 * 256)


@pytest.fixture
def rng():
  return np.random.default_rng(0)


CALL = tj.render_assistant_text('Which landmark is this?', tool_call={'name': 'image_search',
                                                                      'arguments': {'image': 'img_1'}})
ANSWER = tj.render_assistant_text('It is the Taj Mahal.', response='Agra')


def _two_step_impl(tokenizer, processor, rng, logprobs=True):
  """img_1 64x64 (4 pads), step 0 = image_search -> tool returns a 96x160 image (15 pads), step 1 = response."""
  b = tj.TrajectoryBuilder(tokenizer, processor, SCHEMAS)
  b.start('In which city is this building?', rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
  seqs = [b.prompt_ids()]
  ids0 = tokenizer.encode(CALL, add_special_tokens=False) + [tj.IM_END_ID]
  a0 = b.append_assistant(ids0, logprobs=[-0.5] * len(ids0) if logprobs else None, seconds=1.0)
  seqs.append(b.prompt_ids())
  names = b.append_observation(ToolResult(ok=True, text='Best match: Taj Mahal', seconds=0.25,
                                          images=[rng.integers(0, 256, (96, 160, 3), dtype=np.uint8)]))
  seqs.append(b.prompt_ids())
  ids1 = tokenizer.encode(ANSWER, add_special_tokens=False) + [tj.IM_END_ID]
  a1 = b.append_assistant(ids1, logprobs=[-0.25] * len(ids1) if logprobs else None)
  seqs.append(b.prompt_ids())
  traj = b.finish(prompt_id='q7', sample_index=3, answers=['Agra'], policy_version=2)
  return traj, seqs, (ids0, ids1), (a0, a1), names


@pytest.fixture
def two_step():
  return _two_step_impl


@pytest.fixture
def schemas():
  return SCHEMAS

"""Loaders for the official OpenSearch-VL formats (hand-written fixtures in tests/trajectory/fixtures/, images from
the shared data folder): ShareGPT SFT -> Trajectory with masks, RL {question, answer, images} -> prompts."""

import json
import pathlib

import numpy as np
import pytest
from PIL import Image

from osvl_jax.data import official
from osvl_jax import paths
from osvl_jax import trajectory as tj
from osvl_jax.train import batching

FIXTURES = pathlib.Path(__file__).parent / 'fixtures'


@pytest.fixture(scope='module')
def image_root():
  return paths.data_dir() / 'images'


@pytest.fixture(scope='module')
def processor():
  return tj.ImageProcessor(min_pixels=32 * 32, max_pixels=128 * 128)


@pytest.fixture(scope='module')
def sft(tokenizer, processor, image_root):
  return official.load_sft(FIXTURES / 'official_sft.jsonl', tokenizer, processor, image_root=image_root)


def _runs(mask):
  """[(start, stop)] of the True runs of a bool [T] mask."""
  edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
  return list(zip(edges[::2], edges[1::2]))


def test_sft_record_becomes_a_trajectory_with_gpt_turns_masked(sft, tokenizer, image_root):
  traj, text_only = sft
  record = json.loads((FIXTURES / 'official_sft.jsonl').read_text().splitlines()[0])
  gpt = [t['value'] for t in record['conversations'] if t['from'] == 'gpt']
  assert traj.prompt_id == 'sft-taj' and len(traj.steps) == 3 and traj.final_response == 'Agra'
  assert traj.stop_reason == 'response' and tj.check_trajectory(traj) == []
  # gen_mask is 1 exactly on each gpt turn's ids + its <|im_end|>, one run per turn, tagged with its step.
  runs = _runs(traj.gen_mask)
  assert [traj.token_ids[a:b].tolist() for a, b in runs] == [
      tokenizer.encode(v, add_special_tokens=False) + [tj.IM_END_ID] for v in gpt]
  assert [set(traj.step_of_token[a:b].tolist()) for a, b in runs] == [{0}, {1}, {2}]
  # System prompt and tools (official names, wrapped as Hermes functions) are in the prompt, not in the loss.
  text = traj.decode(tokenizer)
  assert text.startswith('<|im_start|>system\nYou are a multimodal deep-search agent.')
  assert '{"type": "function", "function": {"name": "web_search"' in text
  # The official tool names and arguments are read in the osvl namespace.
  assert (traj.steps[1].action.name, traj.steps[1].action.arguments) == (
      'text_search', {'query': 'white marble mausoleum Mughal'})
  assert traj.steps[0].result.text == 'Cropped img_1 to (60, 20, 200, 140).'
  assert traj.step_format_ok == [True, True, True]
  # Two images (<image> in the human turn and in the first observation), each span matching its grid.
  photo = np.asarray(Image.open(image_root / 'landmarks' / 'taj-mahal.jpg').convert('RGB'))
  assert len(traj.images) == 2 and all(np.array_equal(im.pixels, photo) for im in traj.images)
  assert int(np.sum(traj.token_ids == tj.IMAGE_PAD_ID)) == sum(im.num_tokens for im in traj.images)
  assert '<image>' not in text and text.count('<|vision_start|>') == 2
  batch = batching.collate([traj, text_only], length_multiple=64, loss_multiple=16)  # the trainer's entry
  for row, t in enumerate((traj, text_only)):
    n, emitted = t.num_tokens, np.flatnonzero(t.gen_mask)
    assert batch['input_ids'][row, :n].tolist() == t.token_ids.tolist() and not batch['attention_mask'][row, n:].any()
    k = len(emitted)
    assert batch['loss_positions'][row, :k].tolist() == (emitted - 1).tolist()
    assert batch['loss_targets'][row, :k].tolist() == t.token_ids[emitted].tolist()
    assert batch['completion_mask'][row].sum() == k and batch['loss_step'][row, :k].tolist() == (
        t.step_of_token[emitted].tolist())
  assert batch['image_grid_thw'].tolist() == traj.image_grid_thw.tolist()
  assert batch['pixel_values'].shape == (int(np.prod(traj.image_grid_thw, axis=1).sum()), 1536)


def test_sft_text_only_record_with_function_call_turn(sft, tokenizer):
  _, traj = sft
  assert traj.prompt_id == 'sft-text' and traj.images == [] and traj.final_response == 'Yamuna'
  assert traj.steps[0].action.kind == 'tool_call' and traj.steps[0].action.name == 'text_search'
  assert not traj.steps[0].format_ok  # a bare function_call has no think block: r_fmt^(0) = 0
  assert '<tool_call>\n{"name": "web_search"' in traj.decode(tokenizer)
  assert tj.check_trajectory(traj) == []


def test_sft_record_with_wrong_image_count_names_the_line(tokenizer, processor, image_root):
  with pytest.raises(ValueError, match=r'official_sft_broken.jsonl:1: 1 <image> placeholders but 0 images'):
    official.load_sft(FIXTURES / 'official_sft_broken.jsonl', tokenizer, processor, image_root=image_root)
  assert official.load_sft(FIXTURES / 'official_sft_broken.jsonl', tokenizer, processor,
                                image_root=image_root, skip_invalid=True) == []


def test_sft_record_over_the_token_budget_is_an_error_not_a_cut(tokenizer, processor, image_root):
  with pytest.raises(tj.PromptTooLongError, match='never cut'):
    official.load_sft(FIXTURES / 'official_sft.jsonl', tokenizer, processor, image_root=image_root,
                           max_tokens=100)


def test_rl_jsonl_becomes_prompts(image_root):
  prompts = official.load_rl_prompts(FIXTURES / 'official_rl.jsonl', image_root=image_root)
  assert [p['prompt_id'] for p in prompts] == ['official_rl-1', 'bigben', 'official_rl-3']
  assert [p['answers'] for p in prompts] == [['Agra'], ['Big Ben', 'the Great Bell'], ['Yamuna']]
  assert prompts[0]['question'] == 'In which city is this building?'
  assert prompts[1]['question'] == 'What is the name of the bell in this tower?'
  assert prompts[0]['image'].dtype == np.uint8 and prompts[0]['image'].shape == (264, 264, 3)
  assert prompts[2]['image'] is None


def test_rl_prompts_with_generated_images_and_errors(tmp_path):
  image = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
  Image.fromarray(image).save(tmp_path / 'x.png')
  official.write_jsonl([{'id': 7, 'question': 'Q?', 'answer': 3, 'images': ['x.png']}], tmp_path / 'rl.jsonl')
  (p,) = official.load_rl_prompts(tmp_path / 'rl.jsonl')  # paths relative to the file's folder
  assert p['prompt_id'] == '7' and p['answers'] == ['3'] and np.array_equal(p['image'], image)
  official.write_jsonl([{'question': 'Q?', 'answer': 'a', 'images': ['missing.png']}], tmp_path / 'bad.jsonl')
  with pytest.raises(ValueError, match=r"bad.jsonl:1: image 'missing.png' not found"):
    official.load_rl_prompts(tmp_path / 'bad.jsonl')


def test_rl_prompts_read_image_or_image_path_fields(tmp_path):
  Image.fromarray(np.full((8, 6, 3), 200, np.uint8)).save(tmp_path / 'a.png')
  (tmp_path / 'p.jsonl').write_text(
      json.dumps({'id': 'x', 'question': '<image>What?', 'answer': 'A', 'image_path': 'a.png'}) + '\n' +
      json.dumps({'id': 'y', 'question': 'Why?', 'answer': 'B', 'image': ['a.png', 'a.png']}) + '\n' +
      json.dumps({'id': 'z', 'question': 'No image?', 'answer': 'C'}) + '\n')
  got = official.load_rl_prompts(tmp_path / 'p.jsonl')
  assert got[0]['image'].shape == (8, 6, 3) and int(got[0]['image'][0, 0, 0]) == 200
  assert isinstance(got[1]['image'], list) and len(got[1]['image']) == 2
  assert got[2]['image'] is None
  (tmp_path / 'q.jsonl').write_text(json.dumps({'question': 'Q', 'answer': 'A', 'image_path': 'gone.png'}) + '\n')
  with pytest.raises(ValueError, match='q.jsonl:1'):
    official.load_rl_prompts(tmp_path / 'q.jsonl')

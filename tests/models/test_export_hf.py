"""`python -m osvl_jax.export_hf`: an orbax checkpoint of a workdir -> a complete HF folder that transformers loads
to the same logits: tokenizer with the builder's chat template, Qwen3-VL processor configs with the training pixel
budget, generation config; written atomically, from the checkpoint asked for."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from osvl_jax import checkpoints  # noqa: E402
from osvl_jax import export_hf  # noqa: E402
from osvl_jax import trajectory as tj  # noqa: E402
from osvl_jax.models.qwen3_vl import parity  # noqa: E402
from osvl_jax.models.qwen3_vl import rope  # noqa: E402
from osvl_jax.models.qwen3_vl import weights  # noqa: E402
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # noqa: E402
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel  # noqa: E402


PIXELS = {'image_processor': {'min_pixels': 32 * 32, 'max_pixels': 64 * 64}}  # what the trainers record


def test_export_latest_checkpoint_loads_in_transformers_with_same_logits(tmp_path):
  config = Qwen3VLConfig.tiny()
  sft, grpo = Qwen3VLModel(config, nnx.Rngs(1)), Qwen3VLModel(config, nnx.Rngs(2))
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 4, sft, None, {'stage': 'sft', **PIXELS})
  mngr = checkpoints.manager(tmp_path, 'grpo_ckpt')
  checkpoints.save(mngr, 1, sft, None, {'stage': 'grpo', **PIXELS})
  checkpoints.save(mngr, 2, grpo, None, {'stage': 'grpo', **PIXELS})
  out = tmp_path / 'hf'
  export_hf.export(tmp_path, out)
  assert (out / 'model.safetensors').exists() and (out / 'tokenizer.json').exists()
  hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
  hf.config._attn_implementation = 'eager'
  pv, grid = parity.load_images()[2]
  ids = np.array([[parity.IM_START, 872] + parity.image_tokens(grid[0]) + [30, 40, parity.IM_END]])
  ref = parity.hf_logits(hf, ids, None, pv, grid)
  got = parity.flax_logits(grpo, ids, None, pv, grid)          # the latest GRPO step, not SFT
  assert np.abs(got - ref).max() <= parity.TOL
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok('Hello world')['input_ids'] == [9707, 1879] and len(tok) == 151669


def test_export_without_checkpoint_raises(tmp_path):
  with pytest.raises(FileNotFoundError):
    checkpoints.latest(tmp_path)


def test_export_of_a_scan_layers_checkpoint_writes_the_per_layer_hf_tensors(tmp_path):
  """A non-default architecture (as the demo's) and the stacked layout, both read from the checkpoint's meta; the
  absl command line (one subprocess)."""
  base = Qwen3VLConfig.tiny()
  config = dataclasses.replace(base, text=dataclasses.replace(base.text, num_hidden_layers=3, intermediate_size=96,
                                                              rope_theta=10_000.0))
  scanned = Qwen3VLModel(config, nnx.Rngs(3), scan_layers=True)
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, scanned, None, {'stage': 'sft'})
  proc = subprocess.run([sys.executable, '-m', 'osvl_jax.export_hf', f'--workdir={tmp_path}',
                         f'--out={tmp_path / "hf"}', '--min_pixels=1024', '--max_pixels=8192'], capture_output=True, text=True, timeout=600,
                        cwd=pathlib.Path(__file__).parents[2], env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert proc.returncode == 0, proc.stderr[-2000:]
  info = json.loads(proc.stdout.strip().splitlines()[-1])
  assert info['checkpoint'] == 'sft_ckpt' and (info['min_pixels'], info['max_pixels']) == (1024, 8192)
  pre = json.loads((tmp_path / 'hf' / 'preprocessor_config.json').read_text())   # the flags override
  assert pre['size'] == {'shortest_edge': 1024, 'longest_edge': 8192}
  written = weights.read_safetensors(tmp_path / 'hf' / 'model.safetensors')
  expected = weights.to_hf_state_dict(Qwen3VLModel(config, nnx.Rngs(3)))      # same init, unrolled layout
  assert written.keys() == expected.keys()
  for name, value in expected.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)


def test_restoring_into_the_other_layout_names_scan_layers(tmp_path):
  config = Qwen3VLConfig.tiny()
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, Qwen3VLModel(config, nnx.Rngs(0)), None, {})
  with pytest.raises(ValueError, match='scan_layers=False but the model has scan_layers=True'):
    checkpoints.restore(checkpoints.manager(tmp_path, 'sft_ckpt'), Qwen3VLModel(config, nnx.Rngs(0), scan_layers=True))


# ---------------------------------------------------------------------------------------------------------------
# A complete folder: AutoProcessor (Qwen3-VL processor) + chat template reproduce the project's builder path.
# ---------------------------------------------------------------------------------------------------------------

class _NoVideoProcessor(dict):
  """Stands in for Qwen3-VL's video processor, which transformers builds only with torchvision (none on this CPU
  machine: its wheels need CUDA torch). Everything else AutoProcessor reads from the exported folder is real."""

  @classmethod
  def from_pretrained(cls, *args, **kwargs):
    return cls()


def _auto_processor(folder, monkeypatch):
  try:
    import torchvision  # noqa: F401, pylint: disable=unused-import
  except (ImportError, RuntimeError):
    from transformers import processing_utils
    names = dict(processing_utils._LazyAutoProcessorMapping._MAPPING_NAMES,
                 video_processor=(__name__, '_NoVideoProcessor'))
    monkeypatch.setattr(processing_utils._LazyAutoProcessorMapping, '_MAPPING_NAMES', names)
    check = processing_utils.ProcessorMixin.check_argument_for_proper_class
    monkeypatch.setattr(processing_utils.ProcessorMixin, 'check_argument_for_proper_class',
                        lambda self, name, arg: type(arg) if name == 'video_processor' else check(self, name, arg))
  return transformers.AutoProcessor.from_pretrained(folder)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """(HF folder, Flax model) of a tiny SFT checkpoint trained with a 32x32..64x64 pixel budget."""
  workdir = tmp_path_factory.mktemp('export')
  model = Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(5))
  checkpoints.save(checkpoints.manager(workdir, 'sft_ckpt'), 3, model, None, {'stage': 'sft', **PIXELS})
  info = export_hf.export(workdir, workdir / 'hf')
  assert (info['min_pixels'], info['max_pixels']) == (32 * 32, 64 * 64)
  return workdir / 'hf', model


CALL = {'name': 'crop', 'arguments': {'image': 'img_1', 'box': [0, 0, 40, 30]}}


def _conversation(question, tool_text, response=None, system=None):
  """The same episode twice: (TrajectoryBuilder, messages, images, tool schemas) — (optionally) a system prompt, a
  user turn with an image, an assistant tool call, an observation with an image, then (optionally) a final
  response."""
  from tools import base
  from tools import env as tools_env
  rng = np.random.default_rng(0)
  photo, crop = rng.integers(0, 256, (50, 70, 3), np.uint8), rng.integers(0, 256, (30, 40, 3), np.uint8)
  schemas = tools_env.ToolEnv({'enabled': ('text_search', 'crop')}).schemas()
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64),
                                 schemas, system_prompt=system)
  builder.start(question, photo)
  builder.append_assistant_text(tj.render_assistant_text('Look closer.', tool_call=CALL))
  builder.append_observation(base.ToolResult(ok=True, text=tool_text, images=[crop]))
  messages = [
      {'role': 'user', 'content': [{'type': 'image', 'image': photo}, {'type': 'text', 'text': question}]},
      {'role': 'assistant', 'content': '<think>\nLook closer.\n</think>\n',
       'tool_calls': [{'type': 'function', 'function': CALL}]},
      {'role': 'tool', 'content': [{'type': 'text', 'text': tool_text}, {'type': 'image', 'image': crop}]}]
  if response is not None:
    text = tj.render_assistant_text('It is Agra.', response=response)
    builder.append_assistant_text(text)
    messages.append({'role': 'assistant', 'content': text})
  if system is not None:
    messages.insert(0, {'role': 'system', 'content': system})
  return builder, messages, [photo, crop], schemas


def _processor_inputs(processor, messages, images, schemas, generation_prompt):
  text = processor.apply_chat_template(messages, tools=schemas, tokenize=False,
                                       add_generation_prompt=generation_prompt)
  out = processor(text=[text], images=images, return_tensors='np')
  return text, out['input_ids'], out['pixel_values'], out['image_grid_thw']


def test_exported_folder_is_complete_for_transformers_sglang_and_vllm(exported, monkeypatch):
  folder, _ = exported
  assert {'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja',
          'preprocessor_config.json', 'video_preprocessor_config.json', 'generation_config.json'} <= {
              p.name for p in folder.iterdir()}
  pre = json.loads((folder / 'preprocessor_config.json').read_text())
  assert pre['size'] == {'shortest_edge': 1024, 'longest_edge': 4096}
  assert (pre['min_pixels'], pre['max_pixels'], pre['patch_size'], pre['merge_size']) == (1024, 4096, 16, 2)
  generation = transformers.GenerationConfig.from_pretrained(folder)
  assert list(generation.eos_token_id) == [tj.IM_END_ID, tj.ENDOFTEXT_ID] and generation.pad_token_id == 151643
  processor = _auto_processor(folder, monkeypatch)
  assert type(processor).__name__ == 'Qwen3VLProcessor'
  assert (processor.image_processor.size.shortest_edge, processor.image_processor.size.longest_edge) == (1024, 4096)
  assert processor.chat_template and transformers.AutoTokenizer.from_pretrained(folder).chat_template
  assert not any(p.name.startswith('.') for p in folder.parent.iterdir())   # no temporary folder left


@pytest.mark.parametrize('finished', [False, True])
def test_autoprocessor_and_chat_template_give_the_builders_ids_pixels_and_logits(exported, monkeypatch, finished):
  """System text with tools, user turn with an image, a tool call, an observation with an image; then either the
  generation prompt (`prompt_ids`) or a final response (`finish().token_ids`). The texts end in punctuation, whose
  BPE merge with the template's '\n' ('?\n') the builder renders as a tokenizer reading the whole string does."""
  folder, model = exported
  processor = _auto_processor(folder, monkeypatch)
  builder, messages, images, schemas = _conversation('Which city is this landmark in?', '[1] Agra: a city.',
                                                     'Agra' if finished else None)
  _, ids, pixel_values, grid = _processor_inputs(processor, messages, images, schemas, not finished)
  want = builder.finish().token_ids if finished else builder.prompt_ids()
  np.testing.assert_array_equal(ids[0], want)
  refs = builder.images
  np.testing.assert_array_equal(grid, np.stack([r.grid_thw for r in refs]))
  want_pv = np.concatenate([r.pixel_values for r in refs])
  np.testing.assert_allclose(pixel_values, want_pv, atol=1e-5)
  if not finished:   # the next-token logits a server samples from: both images sit before these positions
    ours = _last_logits(model, want[None], want_pv, np.stack([r.grid_thw for r in refs]))
    theirs = _last_logits(model, ids, pixel_values.astype(np.float32), grid)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert np.isfinite(ours).all() and np.ptp(ours) > 0


def _last_logits(model, ids, pixel_values, grid, last=4):
  """float32 [1, last, V]: the Flax model's logits at the last positions (the full [T, V] is slow on CPU)."""
  ids = np.asarray(ids, np.int64)
  pos, _ = rope.get_rope_index(ids, grid, None)
  hidden, _ = model(ids, pos, None, pixel_values, grid)
  return np.asarray(model.logits(hidden[:, -last:]))


# Pieces of random text: punctuation, spaces and newlines at a piece boundary are where BPE merges ('?\n').
TEXT_PIECES = ('city', 'Agra', ' is', 'A', '7', '42', '?', '!', '.', ':', ',', '"', ' ', '  ', '\n', '\n\n',
               '\r\n', '\t', '🙂', '日本語', '。', '？', '-', "'s", '(', ')')


def _random_text(rng, max_pieces=8):
  """No '<': a text that spells no special token (there the builder differs inherently: `chat_template`)."""
  return ''.join(rng.choice(TEXT_PIECES) for _ in range(int(rng.integers(0, max_pieces + 1))))


def _assert_same_ids(processor, question, tool_text, response=None, system=None):
  builder, messages, images, schemas = _conversation(question, tool_text, response, system)
  finished = response is not None
  text, ids, _, _ = _processor_inputs(processor, messages, images, schemas, not finished)
  want = builder.finish().token_ids if finished else builder.prompt_ids()
  assert ids[0].tolist() == want.tolist(), (question, tool_text, response, system, text)
  return text, builder


@pytest.mark.parametrize('question, tool_text', [
    ('Which city is this?', '[1] Agra: a city.'), ('Wow!', 'Note:'), ('trailing  ', 'line\n'),
    ('year 1632', '12'), ('日本語。', 'smile 🙂'), ('', ''), ('\n', ' \n '), ('end.\r\n', '?\n\n')])
def test_chat_template_ids_are_the_builders_ids_for_texts_ending_in_anything(exported, monkeypatch, question,
                                                                             tool_text):
  """Texts ending in punctuation / spaces / newlines / digits: exactly the builder's ids (the '?' + '\n' merge
  included), with the generation prompt and with a final response."""
  folder, _ = exported
  processor = _auto_processor(folder, monkeypatch)
  text, builder = _assert_same_ids(processor, question, tool_text)
  decoded = processor.tokenizer.decode(builder.prompt_ids(), skip_special_tokens=False)
  for ref in builder.images:
    decoded = decoded.replace('<|image_pad|>' * ref.num_tokens, '<|image_pad|>', 1)
  assert text == decoded
  _assert_same_ids(processor, question, tool_text, response=tool_text, system=question or 'Be brief.')


def test_chat_template_ids_are_the_builders_ids_for_random_texts(exported, monkeypatch):
  """Property over random texts (punctuation, spaces, newlines, digits, emoji, CJK) in the system prompt, the
  question, the tool output and the response: the served template gives exactly the builder's ids."""
  folder, _ = exported
  processor = _auto_processor(folder, monkeypatch)
  rng = np.random.default_rng(7)
  for _ in range(40):
    _assert_same_ids(processor, _random_text(rng), _random_text(rng),
                     response=_random_text(rng) if rng.random() < 0.5 else None,
                     system=_random_text(rng) if rng.random() < 0.5 else None)
  system = {'role': 'system', 'content': 'Be brief.'}
  _, messages, _, _ = _conversation('Which city?', 'x')
  with_system = processor.apply_chat_template([system] + messages[:1], tokenize=False)
  assert with_system.startswith('<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhich city')


def _save_two_stages(workdir):
  sft, grpo = Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(1)), Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(2))
  for step in (2, 4):
    checkpoints.save(checkpoints.manager(workdir, 'sft_ckpt'), step, sft, None, {'stage': 'sft', **PIXELS})
  checkpoints.save(checkpoints.manager(workdir, 'grpo_ckpt'), 1, grpo, None, {'stage': 'grpo', **PIXELS})
  return sft, grpo


def test_checkpoint_choice_sft_grpo_path_and_step(tmp_path):
  _save_two_stages(tmp_path)
  resolve = checkpoints.resolve
  assert resolve(tmp_path) == (tmp_path / 'grpo_ckpt', 1)                     # latest: GRPO once it exists
  assert resolve(None, str(tmp_path)) == (tmp_path / 'grpo_ckpt', 1)          # a workdir path: its latest
  assert resolve(tmp_path, 'sft') == (tmp_path / 'sft_ckpt', 4)               # the SFT policy stays exportable
  assert resolve(tmp_path, 'sft', step=2) == (tmp_path / 'sft_ckpt', 2)
  assert resolve(None, str(tmp_path / 'sft_ckpt')) == (tmp_path / 'sft_ckpt', 4)
  assert resolve(None, str(tmp_path / 'sft_ckpt' / '2')) == (tmp_path / 'sft_ckpt', 2)
  with pytest.raises(FileNotFoundError, match='no step 3'):
    resolve(tmp_path, 'sft', step=3)
  with pytest.raises(FileNotFoundError, match='no checkpoint'):
    resolve(tmp_path / 'empty', 'grpo')
  with pytest.raises(ValueError, match='needs --workdir'):
    resolve(None, 'sft')
  info = export_hf.export(tmp_path, tmp_path / 'hf', checkpoint='sft', step=2)
  assert (info['checkpoint'], info['step']) == ('sft_ckpt', 2)


def test_a_failed_export_leaves_the_old_folder_and_no_temporary_one(tmp_path, monkeypatch):
  _save_two_stages(tmp_path)
  out = tmp_path / 'hf'
  export_hf.export(tmp_path, out, checkpoint='sft')          # the previous export
  previous = {p.name: p.read_bytes() for p in out.iterdir()}

  def half_written(model, folder, *args):
    (folder / 'config.json').write_text('{}')
    raise OSError('disk full')

  monkeypatch.setattr(export_hf, 'write_folder', half_written)
  with pytest.raises(OSError, match='disk full'):
    export_hf.export(tmp_path, out, overwrite=True)
  assert {p.name: p.read_bytes() for p in out.iterdir()} == previous
  assert sorted(p.name for p in tmp_path.iterdir()) == ['grpo_ckpt', 'hf', 'sft_ckpt']
  monkeypatch.undo()
  export_hf.export(tmp_path, out, overwrite=True)             # a complete export replaces the old folder
  assert json.loads((out / 'osvl_export.json').read_text())['checkpoint'].endswith('grpo_ckpt')
  assert (out / 'model.safetensors').read_bytes() != previous['model.safetensors']
  assert sorted(p.name for p in tmp_path.iterdir()) == ['grpo_ckpt', 'hf', 'sft_ckpt']


def test_a_checkpoint_without_the_pixel_budget_needs_the_flags(tmp_path):
  model = Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, model, None, {'stage': 'sft'})
  with pytest.raises(ValueError, match='--min_pixels and --max_pixels'):
    export_hf.export(tmp_path, tmp_path / 'hf')
  assert not (tmp_path / 'hf').exists()
  with pytest.raises(ValueError, match='min_pixels <= max_pixels'):
    export_hf.export(tmp_path, tmp_path / 'hf', min_pixels=4096, max_pixels=1024)
  info = export_hf.export(tmp_path, tmp_path / 'hf', min_pixels=1024, max_pixels=4096)
  assert (info['min_pixels'], info['max_pixels']) == (1024, 4096)


def test_help_is_quick_because_nothing_heavy_is_imported():
  code = 'import sys, osvl_jax.export_hf; print(sorted(m for m in ("jax", "flax", "torch", "transformers") if m in sys.modules))'
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60,
                        cwd=pathlib.Path(__file__).parents[2])
  assert proc.returncode == 0 and proc.stdout.strip() == '[]', proc.stderr[-2000:]
  proc = subprocess.run([sys.executable, '-m', 'osvl_jax.export_hf', '--help'], capture_output=True, text=True,
                        timeout=60, cwd=pathlib.Path(__file__).parents[2])
  assert '--checkpoint=latest|sft|grpo|PATH' in proc.stdout and '--min_pixels' in proc.stdout, proc.stderr[-2000:]

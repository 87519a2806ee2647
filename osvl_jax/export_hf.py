"""Exports a trained checkpoint as a complete Hugging Face Qwen3-VL folder (transformers, SGLang, vLLM load it).

Command (absl flags):
  python -m osvl_jax.export_hf --workdir=W --out=DIR [--checkpoint=latest|sft|grpo|PATH] [--step=N]
      [--hf_config=PATH] [--dtype=float32|bfloat16] [--min_pixels=N --max_pixels=N] [--overwrite]

Which checkpoint: `--checkpoint=latest` (default) is the latest step of `W/grpo_ckpt`, else of `W/sft_ckpt`;
`sft` / `grpo` pick that folder of the workdir (so the SFT policy stays exportable once GRPO ran); a PATH is a
checkpoint folder (`.../sft_ckpt`) or one step of it (`.../sft_ckpt/150`, `--workdir` not needed). `--step`
picks a step (default: the latest). The workdir / checkpoint may be a cloud URL (`--workdir=gs://bucket/run`):
it reaches orbax unchanged (`osvl_jax.checkpoints.storage`); `--out` is a local folder (what SGLang / vLLM load).

No `--config`: the architecture and parameter layout come from the checkpoint's meta (the trainers record
`model_config` and `scan_layers`; `--hf_config`, a config.json or an HF folder holding one, overrides; checkpoints
without it default to the built-in tiny config), and so does the image processor budget the policy was trained
with (`image_processor`: min_pixels, max_pixels; `--min_pixels` / `--max_pixels` override, and are required for
a checkpoint that does not record it).

DIR is a new or empty folder, or a previous export (its `osvl_export.json` marker lists the files it wrote) when
`--overwrite` is given; the export refuses, before any work and touching nothing, the workdir, a checkpoint
folder, any ancestor of them (symlinks resolved), a folder inside a checkpoint folder, and any other non-empty
folder (`osvl_jax.export_folder`: the error names the path and why; exit code 1). Everything is written into a
temporary sibling folder renamed onto DIR as the last step, so a failed export leaves DIR as it was; files get
the modes the umask gives ordinary files. Written into DIR:
  config.json, model.safetensors   `weights.save_hf_folder` (`Qwen3VLForConditionalGeneration.from_pretrained`)
  tokenizer.json, tokenizer_config.json   the Qwen3-VL tokenizer (`osvl_jax.trajectory.load_tokenizer`)
  chat_template.jinja              `chat_template()`: the trajectory builder's rendering as a Jinja template
  preprocessor_config.json         Qwen3-VL image processor with the training pixel budget (`size` and the
                                   `min_pixels` / `max_pixels` keys older readers use)
  video_preprocessor_config.json   Qwen3-VL's video defaults (`AutoProcessor` builds a video processor too)
  generation_config.json           eos [<|im_end|>, <|endoftext|>], pad <|endoftext|>, Qwen3-VL-Instruct sampling
  osvl_export.json                 the marker: tool, kind 'hf_export', format version, checkpoint, step, files

`transformers.AutoProcessor.from_pretrained(DIR)` gives a `Qwen3VLProcessor` whose image processor, tokenizer and
chat template reproduce the project's `ImageProcessor` / `TrajectoryBuilder` (see `chat_template` for the
inherent differences). `AutoProcessor` needs torchvision (torchvision==0.28.0 pairs with torch==2.13.0): in
transformers 5.24 Qwen3-VL's processor always builds its video processor, which has only a torchvision backend,
and no processor config avoids that; the tokenizer, chat template and image processor (`AutoTokenizer`,
`AutoImageProcessor`) load without it. Heavy modules are imported inside the functions, so `--help` is quick.
"""

from __future__ import annotations

import json
import pathlib
import sys

from absl import app, flags
from etils import epath

from osvl_jax import export_folder

# Qwen3-VL-Instruct generation_config.json (sampling defaults); the eos ids are Qwen's two end-of-sequence ids.
GENERATION_DEFAULTS = {'do_sample': True, 'temperature': 0.7, 'top_p': 0.8, 'top_k': 20, 'repetition_penalty': 1.0}
# Qwen3-VL video_preprocessor_config.json (pixels over all frames of a video; fps sampling).
VIDEO_DEFAULTS = {'size': {'shortest_edge': 4096, 'longest_edge': 25165824}, 'fps': 2, 'min_frames': 4,
                  'max_frames': 768}


def chat_template() -> str:
  """The Jinja chat template (transformers' `chat_template`) that renders what `TrajectoryBuilder` renders.

  Messages (OpenAI / transformers style):
    system: optional; its `content` replaces the builder's `DEFAULT_INSTRUCTIONS` (its `system_prompt`).
    user: `content` a string, or parts [{'type': 'text', 'text'}, {'type': 'image'}, ...]: all text parts, then
      each image on its own line as 'img_k: <|vision_start|><|image_pad|><|vision_end|>' (the processor expands
      the pad to the image's token count), k counting images over the whole conversation (img_1 = the user's).
    assistant: `content` as the policy emitted it ('<think>…</think>\\n<tool_call>…</tool_call>' or
      '…<response>…</response>'); optional `tool_calls` ([{'function': {'name', 'arguments'}}], arguments a dict
      or a JSON string) are appended as '<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>'
      (`render_assistant_text`'s form: content '<think>\\nX\\n</think>\\n' + one call gives its text).
    tool: one observation (`TrajectoryBuilder.append_observation`): a user turn
      '<tool_response>\\n{text}\\nimg_k: …\\n</tool_response>'; content as for user.
  `tools`: the schemas, rendered as the builder's system text (`render_system_text`: one JSON line each).
  Turns are joined by '\\n' (the last one ends with '<|im_end|>', as a finished trajectory does);
  `add_generation_prompt` appends '\\n<|im_start|>assistant\\n' (what `prompt_ids()` ends with).

  The ids are the builder's: it tokenizes each run of text between special tokens as one string, as the tokenizer
  does with the rendered string, so BPE merges across the template's pieces ('city?' + '\\n' -> '?\\n') agree
  (tests/models/test_export_hf.py checks exact ids over random texts). Inherent differences (the text is
  identical; only its tokenization can differ):
    - The builder tokenizes untrusted text (the question, tool output) without special tokens: a web page that
      says '<|im_end|>' or '</tool_response>' stays plain text there, but a tokenizer applied to the rendered
      string reads it as the special token.
    - The builder keeps the ids the policy sampled; a re-rendered assistant turn is the canonical tokenization
      of its decoded text, which a sampled (non-canonical) tokenization need not be. Likewise an assistant turn
      that does not start with a special token (`<think>`) is tokenized after the context's
      '<|im_start|>assistant\\n' in the builder (the served generation prompt ends there too), while a
      re-rendered one may merge with that '\\n'.
  """
  from osvl_jax.trajectory import builder
  lit = json.dumps   # a Jinja string literal (its escapes are Python's unicode-escape ones)
  image = ("{%- set ns.img = ns.img + 1 -%}"
           "{{- '\\nimg_' ~ ns.img ~ ': <|vision_start|><|image_pad|><|vision_end|>' -}}")
  content = ("{%- if m.content is string -%}{{- m.content -}}"
             "{%- elif m.content -%}"
             "{%- for p in m.content -%}{%- if p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}"
             "{%- for p in m.content -%}{%- if p.type in ('image', 'image_url') -%}" + image +
             "{%- endif -%}{%- endfor -%}"
             "{%- endif -%}")
  call = ("{%- set f = tc.function if tc.function is defined else tc -%}"
          "{{- '<tool_call>\\n{\"name\": ' ~ (f.name | tojson) ~ ', \"arguments\": ' -}}"
          "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
          "{{- '}\\n</tool_call>' -}}")
  return (
      "{%- set ns = namespace(img=0) -%}"
      "{%- if messages and messages[0].role == 'system' -%}"
      "{%- set system = messages[0].content -%}{%- set rest = messages[1:] -%}"
      "{%- else -%}"
      "{%- set system = " + lit(builder.DEFAULT_INSTRUCTIONS) + " -%}{%- set rest = messages -%}"
      "{%- endif -%}"
      "{{- '<|im_start|>system\\n' ~ system -}}"
      "{%- if tools -%}"
      "{{- " + lit(builder._TOOLS_HEADER) + " -}}"
      "{%- for t in tools -%}{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}{{- t | tojson -}}{%- endfor -%}"
      "{{- " + lit(builder._TOOLS_FOOTER) + " -}}"
      "{%- endif -%}"
      "{{- '<|im_end|>' -}}"
      "{%- for m in rest -%}"
      "{{- '\\n<|im_start|>' -}}"
      "{%- if m.role == 'assistant' -%}"
      "{{- 'assistant\\n' -}}" + content +
      "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}"
      + call + "{%- endfor -%}{%- endif -%}"
      "{%- elif m.role == 'tool' -%}"
      "{{- 'user\\n<tool_response>\\n' -}}" + content + "{{- '\\n</tool_response>' -}}"
      "{%- else -%}"
      "{{- m.role ~ '\\n' -}}" + content +
      "{%- endif -%}"
      "{{- '<|im_end|>' -}}"
      "{%- endfor -%}"
      "{%- if add_generation_prompt -%}{{- '\\n<|im_start|>assistant\\n' -}}{%- endif -%}")


def preprocessor_config(min_pixels: int, max_pixels: int, patch_size: int = 16, temporal_patch_size: int = 2,
                        merge_size: int = 2) -> dict:
  """Qwen3-VL preprocessor_config.json with the policy's pixel budget (as `trajectory.ImageProcessor` uses it)."""
  from osvl_jax.trajectory import images
  return {
      'size': {'shortest_edge': int(min_pixels), 'longest_edge': int(max_pixels)},
      'min_pixels': int(min_pixels), 'max_pixels': int(max_pixels),
      'patch_size': patch_size, 'temporal_patch_size': temporal_patch_size, 'merge_size': merge_size,
      'image_mean': list(images.QWEN3_VL_IMAGE_MEAN), 'image_std': list(images.QWEN3_VL_IMAGE_STD),
      'do_resize': True, 'resample': 3, 'do_rescale': True, 'rescale_factor': 1 / 255, 'do_normalize': True,
      'do_convert_rgb': True, 'image_processor_type': 'Qwen2VLImageProcessorFast',
      'processor_class': 'Qwen3VLProcessor',
  }


def _pixel_limits(meta: dict, min_pixels: int | None, max_pixels: int | None) -> tuple[int, int]:
  recorded = meta.get('image_processor') or {}
  lo = min_pixels if min_pixels is not None else recorded.get('min_pixels')
  hi = max_pixels if max_pixels is not None else recorded.get('max_pixels')
  if lo is None or hi is None:
    raise ValueError('the checkpoint does not record the image processor budget it was trained with; pass '
                     '--min_pixels and --max_pixels (config.image.min_pixels / max_pixels of the training run)')
  if not 1 <= int(lo) <= int(hi):
    raise ValueError(f'min_pixels={lo}, max_pixels={hi}: need 1 <= min_pixels <= max_pixels')
  return int(lo), int(hi)


def write_folder(model, out: pathlib.Path, dtype: str, min_pixels: int, max_pixels: int) -> None:
  """Writes every file of the HF folder into `out` (an existing empty or new folder)."""
  import ml_dtypes
  import numpy as np
  import transformers

  from osvl_jax import trajectory
  from osvl_jax.models.qwen3_vl import weights
  from osvl_jax.trajectory import images
  np_dtype = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}[dtype]
  weights.save_hf_folder(model, out, dtype=np_dtype)
  if dtype != 'float32':
    cfg = json.loads((out / 'config.json').read_text())
    cfg['dtype'] = dtype
    (out / 'config.json').write_text(json.dumps(cfg, indent=2))
  tok = trajectory.load_tokenizer()
  template = chat_template()
  saved_template = tok.chat_template
  try:  # the tokenizer is a per-process cached object: set the template only while saving
    tok.chat_template = template
    tok.save_pretrained(out)
  finally:
    tok.chat_template = saved_template
  (out / 'chat_template.jinja').write_text(template)
  vision = model.config.vision
  patch, temporal, merge = vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size
  (out / 'preprocessor_config.json').write_text(json.dumps(
      preprocessor_config(min_pixels, max_pixels, patch, temporal, merge), indent=2))
  (out / 'video_preprocessor_config.json').write_text(json.dumps({
      **VIDEO_DEFAULTS, 'patch_size': patch, 'temporal_patch_size': temporal, 'merge_size': merge,
      'image_mean': list(images.QWEN3_VL_IMAGE_MEAN), 'image_std': list(images.QWEN3_VL_IMAGE_STD),
      'video_processor_type': 'Qwen3VLVideoProcessor', 'processor_class': 'Qwen3VLProcessor'}, indent=2))
  eos = [trajectory.IM_END_ID, trajectory.ENDOFTEXT_ID]
  transformers.GenerationConfig(bos_token_id=trajectory.ENDOFTEXT_ID, pad_token_id=trajectory.ENDOFTEXT_ID,
                                eos_token_id=eos, **GENERATION_DEFAULTS).save_pretrained(out)


def _guard(workdir, folder: epath.Path) -> dict:
  """`export_folder.check_target`'s protect / checkpoint_dirs: the local workdir, its checkpoint folders and the
  one exported (cloud paths are skipped: `--out` is local)."""
  from osvl_jax import checkpoints
  from osvl_jax.checkpoints import storage
  local = lambda p: p is not None and not storage.is_remote(p)
  named = [storage.path(workdir) / name for name in checkpoints.CHECKPOINT_DIRS] if local(workdir) else []
  ckpts = [folder] + named
  ckpts = [pathlib.Path(str(c)) for c in ckpts if local(c)]
  return {'protect': ckpts + ([pathlib.Path(workdir)] if local(workdir) else []), 'checkpoint_dirs': ckpts}


def export(workdir: str | pathlib.Path | None, out: str | pathlib.Path, hf_config=None, dtype: str = 'float32',
           step: int | None = None, checkpoint: str = 'latest', min_pixels: int | None = None,
           max_pixels: int | None = None, overwrite: bool = False) -> dict:
  """Restores a checkpoint and writes the HF folder `out` atomically (`export_folder.write`).

  Args:
    workdir: the job folder (None when `checkpoint` is a path).
    out: the HF folder (local): new, empty, or a previous export (with `overwrite`), replaced only once the new
      one is complete.
    hf_config: architecture override (config.json or a folder holding one).
    dtype: 'float32' or 'bfloat16' weights.
    step: checkpoint step; None = the latest.
    checkpoint: 'latest' | 'sft' | 'grpo' | a checkpoint (step) folder (`checkpoints.resolve`).
    min_pixels, max_pixels: override the image processor budget the checkpoint records.
    overwrite: replace a previous export in `out`.
  Returns:
    {'checkpoint': folder name, 'path', 'step', 'out', 'params', 'min_pixels', 'max_pixels'}.
  Raises:
    FileNotFoundError: no such checkpoint (`checkpoints.resolve`).
    export_folder.UnsafeTarget: `out` is the workdir, a checkpoint folder, an ancestor of one, inside one, a
      non-empty folder that is not a previous export, or a previous export without `overwrite` (raised before the
      checkpoint is read; nothing is touched).
    ValueError: the checkpoint does not fit the architecture (pass --hf_config), no pixel budget is known, or it
      has a compact vocabulary (`weights.check_exportable`; nothing is written).
  """
  import jax
  import numpy as np
  from flax import nnx

  from osvl_jax import checkpoints
  from osvl_jax.models.qwen3_vl import weights

  if dtype not in ('float32', 'bfloat16'):
    raise ValueError(f"dtype={dtype!r}: expected 'float32' or 'bfloat16'")
  folder, step = checkpoints.resolve(workdir, checkpoint, step)
  guard = _guard(workdir, folder)
  export_folder.check_target(out, 'hf_export', overwrite, **guard)   # before the (slow) restore
  saved = checkpoints.read_meta(checkpoints.manager(folder.parent, folder.name), step)
  weights.check_exportable(checkpoints.read_config(hf_config, saved))   # a compact vocabulary: nothing written
  lo, hi = _pixel_limits(saved, min_pixels, max_pixels)
  model, meta = checkpoints.load_policy(str(folder), step=step, hf_config=hf_config)
  out = export_folder.write(out, lambda tmp: write_folder(model, tmp, dtype, lo, hi), 'hf_export', overwrite,
                            info={'checkpoint': str(folder), 'step': int(meta['step'])}, **guard)
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return {'checkpoint': folder.name, 'path': str(folder), 'step': meta['step'], 'out': str(out), 'params': n,
          'min_pixels': lo, 'max_pixels': hi}


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _CHECKPOINT.value in ('latest', 'sft', 'grpo') and not _WORKDIR.value:   # checkpoints.CHECKPOINT_CHOICES
    raise app.UsageError(f'--checkpoint={_CHECKPOINT.value} needs --workdir')
  try:
    info = export(_WORKDIR.value, _OUT.value, _HF_CONFIG.value, _DTYPE.value, _STEP.value, _CHECKPOINT.value,
                  _MIN_PIXELS.value, _MAX_PIXELS.value, _OVERWRITE.value)
  except export_folder.UnsafeTarget as e:
    sys.exit(f'export_hf: --out={e}')
  except ValueError as e:   # e.g. a compact vocabulary: refused before anything is written
    sys.exit(f'export_hf: {e}')
  print(json.dumps(info))


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the module imports into others (and tests) freely.
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder holding grpo_ckpt/ and/or sft_ckpt/.')
  _OUT = flags.DEFINE_string('out', None, 'HF folder to write: new, empty, or a previous export (--overwrite).',
                             required=True)
  _OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace a previous export in --out (never another folder).')
  _CHECKPOINT = flags.DEFINE_string(
      'checkpoint', 'latest', "'latest' (grpo_ckpt, else sft_ckpt), 'sft', 'grpo', or a checkpoint folder path "
      '(.../sft_ckpt or one step of it, .../sft_ckpt/150).')
  _STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')
  _HF_CONFIG = flags.DEFINE_string('hf_config', None,
                                   "config.json (or HF folder) of the architecture; default: the checkpoint's")
  _DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'dtype of the written weights.')
  _MIN_PIXELS = flags.DEFINE_integer('min_pixels', None,
                                     "Image processor min_pixels; default: the checkpoint's (config.image).")
  _MAX_PIXELS = flags.DEFINE_integer('max_pixels', None,
                                     "Image processor max_pixels; default: the checkpoint's (config.image).")
  app.run(main)

"""Loaders for the data formats of the official OpenSearch-VL release.

SFT (LLaMA-Factory ShareGPT, one JSON object per line, or a JSON list)::

  {"conversations": [
     {"from": "human", "value": "<image>\\nIn which city is this building?"},
     {"from": "gpt", "value": "<think>...</think>\\n<tool_call>\\n{\\"name\\": \\"crop\\", ...}\\n</tool_call>"},
     {"from": "observation", "value": "Cropped the image.\\n<image>"},
     {"from": "gpt", "value": "<think>...</think>\\n<response>Agra</response>"}],
   "images": ["photos/taj.jpg", "crops/taj_door.png"],      one per <image>, in order of appearance
   "system": "You are ...",                                 optional (default: trajectory.DEFAULT_INSTRUCTIONS)
   "tools": "[{\\"name\\": \\"crop\\", \\"description\\": ..., \\"parameters\\": {...}}]"}   JSON string or list

  -> `trajectory.Trajectory` built by `TrajectoryBuilder` (tokens of the Qwen3-VL chat format, DESIGN.md §4):
  the human turn is the prompt (step -1), each gpt turn an assistant step with gen_mask 1 on its ids + <|im_end|>
  (`from: function_call` is accepted as an assistant turn too, wrapped in <tool_call> if bare JSON), each
  observation the `ToolResult` of the step before it (text, images). `<image>` placeholders are removed from the
  text; their images are rendered where this chat format puts them (after the text, named img_1, img_2, ... in
  order), so the tokens are those our rollouts produce for the same content.

RL (one JSON object per line)::

  {"question": "<image>In which city is this building?", "answer": "Agra", "images": ["photos/taj.jpg"]}

  -> prompt dicts {prompt_id, question, image, answers} as `rollout.agent_loop.Item` / `data.pipeline` prompts
  (`answer` may be a string or a list; `answers` is accepted too; prompt_id from `id`/`prompt_id`/`uid`, else
  '<file stem>-<line>').

Writing (`write_sft`, `trajectory_to_sft_record`): our Trajectories as the same SFT records, images as PNG files
beside the .jsonl; the data pipeline's `sft` stage exports `<dataset>/sft_sharegpt.jsonl` with it.

Image paths are relative to `image_root` (default: the data file's folder); an entry may also be an absolute
path, an HF-datasets `{"bytes": ..., "path": ...}` dict, or a uint8 [H, W, 3] array.
"""

import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from osvl_jax import trajectory as traj_lib
from osvl_jax.data import records as records_lib
from osvl_jax.data.records import read_records
from tools import image_io
from tools.base import ToolResult

IMAGE_PLACEHOLDER = '<image>'
HUMAN_ROLES = ('human', 'user')
ASSISTANT_ROLES = ('gpt', 'assistant', 'function_call')
OBSERVATION_ROLES = ('observation', 'tool')


def load_image(entry: Any, image_root: str | os.PathLike | None) -> np.ndarray:
  """uint8 [H, W, 3] RGB of one `images` entry (path relative to `image_root`, dict with bytes/path, or array)."""
  if isinstance(entry, np.ndarray):
    return np.ascontiguousarray(entry.astype(np.uint8) if entry.dtype != np.uint8 else entry)
  if isinstance(entry, dict):
    if entry.get('bytes'):
      return image_io.load_image(entry['bytes'])
    entry = entry.get('path')
  if not isinstance(entry, str) or not entry:
    raise ValueError(f'image entry {entry!r} is neither a path, a {{"bytes"|"path"}} dict nor an array')
  path = pathlib.Path(entry)
  if not path.is_absolute() and image_root is not None:
    path = pathlib.Path(image_root) / path
  if not path.is_file():
    raise ValueError(f'image {entry!r} not found (looked at {path})')
  return image_io.load_image(path)


def tool_schemas(tools: Any) -> list[dict]:
  """The `tools` field (JSON string or list of function dicts) as Hermes schemas {"type": "function", ...}."""
  if tools is None or tools == '':
    return []
  if isinstance(tools, str):
    tools = json.loads(tools)
  if isinstance(tools, dict):
    tools = [tools]
  out = []
  for t in tools:
    if not isinstance(t, dict):
      raise ValueError(f'tool schema {t!r} is not an object')
    out.append(t if 'function' in t else {'type': 'function', 'function': t})
  return out


def _strip_placeholders(text: str) -> tuple[str, int]:
  n = text.count(IMAGE_PLACEHOLDER)
  return text.replace(IMAGE_PLACEHOLDER, '').strip(), n


def _observation_text(value: str) -> tuple[str, int]:
  text = value.strip()
  if text.startswith('<tool_response>') and text.endswith('</tool_response>'):
    text = text[len('<tool_response>'):-len('</tool_response>')]
  return _strip_placeholders(text)


def _assistant_text(role: str, value: str) -> str:
  if role == 'function_call' and '<tool_call>' not in value:
    return f'<tool_call>\n{value.strip()}\n</tool_call>'
  return value


def sft_record_to_trajectory(record: dict, tokenizer, image_processor: traj_lib.ImageProcessor,
                             image_root: str | os.PathLike | None = None, profile: str = 'official',
                             prompt_id: str = '', max_tokens: int | None = None) -> traj_lib.Trajectory:
  """One ShareGPT SFT record -> a Trajectory (gen_mask 1 on the gpt turns' ids and their <|im_end|>).

  Args:
    record: {"conversations": [{"from", "value"}], "images": [...], "system"?: str, "tools"?: str | list}.
    tokenizer: `trajectory.load_tokenizer()`.
    image_processor: how images become pixel_values / pads (e.g. max_pixels=262144 as the official SFT).
    image_root: folder the image paths are relative to.
    profile: parser profile ('official': web_search -> text_search, ...; module `trajectory`).
    prompt_id: stored in the Trajectory (default: record's `id`, else '').
    max_tokens: budget for the whole sequence; a longer record raises (never cut).
  Returns:
    A Trajectory that passes `validate_trajectory`; stop_reason 'response' when the last turn is a response.
  Raises:
    ValueError: naming what is wrong: no conversations, first turn not human, two human turns, two gpt turns in
      a row, an observation not after a tool call, <image> count != len(images), a missing image file;
      `trajectory.PromptTooLongError` / `TrajectoryError` for a record over `max_tokens`.
  """
  turns = record.get('conversations') or record.get('messages')
  if not turns:
    raise ValueError('record has no "conversations"')
  turns = [(t.get('from', t.get('role')), t.get('value', t.get('content')) or '') for t in turns]
  images = list(record.get('images') or [])
  wanted = sum(v.count(IMAGE_PLACEHOLDER) for _, v in turns)
  if wanted != len(images):
    raise ValueError(f'{wanted} {IMAGE_PLACEHOLDER} placeholders but {len(images)} images')
  pixels = [load_image(im, image_root) for im in images]
  if turns[0][0] == 'system':  # system given as a first turn instead of the "system" field
    system, turns = turns[0][1], turns[1:]
  else:
    system = record.get('system') or None
  if not turns or turns[0][0] not in HUMAN_ROLES:
    raise ValueError(f'first turn is {turns[0][0] if turns else None!r}; expected one of {HUMAN_ROLES}')
  builder = traj_lib.TrajectoryBuilder(tokenizer, image_processor, tool_schemas(record.get('tools')),
                                       system_prompt=system, profile=profile)
  question, n = _strip_placeholders(turns[0][1])
  builder.start(question, pixels[:n] or None, max_tokens=max_tokens)
  used = n
  for k, (role, value) in enumerate(turns[1:], 1):
    if role in ASSISTANT_ROLES:
      if builder.awaiting_observation:
        raise ValueError(f'turn {k}: {role!r} after a tool call that has no observation')
      if builder.done:
        raise ValueError(f'turn {k}: {role!r} after the final response')
      builder.append_assistant_text(_assistant_text(role, value))
    elif role in OBSERVATION_ROLES:
      if not builder.awaiting_observation:
        raise ValueError(f'turn {k}: observation not preceded by a tool-call turn')
      text, n = _observation_text(value)
      builder.append_observation(ToolResult(ok=True, text=text, images=pixels[used:used + n]))
      used += n
    elif role in HUMAN_ROLES:
      raise ValueError(f'turn {k}: a second human turn (multi-question conversations are not supported)')
    else:
      raise ValueError(f'turn {k}: unknown role {role!r}')
  traj = builder.finish(prompt_id=prompt_id or str(record.get('id', '')),
                        stop_reason='response' if builder.done else None)
  if max_tokens is not None and traj.num_tokens > max_tokens:
    raise traj_lib.TrajectoryError(f'{traj.num_tokens} tokens, over max_tokens={max_tokens} (never cut)')
  return traj_lib.validate_trajectory(traj)


def load_sft(path: str | os.PathLike, tokenizer, image_processor: traj_lib.ImageProcessor,
             image_root: str | os.PathLike | None = None, profile: str = 'official', max_tokens: int | None = None,
             skip_invalid: bool = False) -> list[traj_lib.Trajectory]:
  """All records of a ShareGPT SFT file (.jsonl or .json list) as Trajectories (`sft_record_to_trajectory`).

  Args:
    path: the file.
    image_root: default: the file's folder.
    skip_invalid: drop records that raise instead of raising (the count is not reported: use for data you
      have already checked).
  Raises:
    ValueError: '<path>:<line>: <what is wrong>' for the first invalid record (unless skip_invalid).
  """
  path = pathlib.Path(path)
  root = path.parent if image_root is None else image_root
  out = []
  for where, record in read_records(path):
    try:
      out.append(sft_record_to_trajectory(record, tokenizer, image_processor, root, profile,
                                          prompt_id=str(record.get('id', f'{path.stem}-{where}')),
                                          max_tokens=max_tokens))
    except ValueError as e:
      if not skip_invalid:
        raise type(e)(f'{path}:{where}: {e}') from e
  return out


def load_rl_prompts(path: str | os.PathLike, image_root: str | os.PathLike | None = None) -> list[dict]:
  """RL prompts of a {question, answer, images} JSON-lines file (the image field may also be `image` or
  `image_path`: one path / base64 string or a list of them).

  Returns:
    [{'prompt_id': str, 'question': str (<image> placeholders removed), 'image': uint8 [H, W, 3] | None (a
    list of arrays when the record has several images), 'answers': list[str]}], in file order.
  Raises:
    ValueError: '<path>:<line>: ...' for a record without a question or answer, or a missing image.
  """
  path = pathlib.Path(path)
  root = path.parent if image_root is None else image_root
  prompts, seen = [], set()
  for where, record in read_records(path):
    try:
      question = record.get('question', record.get('problem'))
      if not isinstance(question, str) or not question.strip():
        raise ValueError('no "question"')
      answers = record.get('answers', record.get('answer'))
      if answers is None or answers == '' or answers == []:
        raise ValueError('no "answer"')
      answers = [str(a) for a in answers] if isinstance(answers, (list, tuple)) else [str(answers)]
      images = [load_image(im, root) for im in records_lib.image_entries(records_lib.first_field(
          record, ('images', 'image', 'image_path')))]
      pid = str(next((record[k] for k in ('id', 'prompt_id', 'uid') if record.get(k) is not None),
                     f'{path.stem}-{where}'))
      if pid in seen:
        raise ValueError(f'duplicate prompt_id {pid!r}')
    except ValueError as e:
      raise ValueError(f'{path}:{where}: {e}') from e
    seen.add(pid)
    text, _ = _strip_placeholders(question)
    prompts.append({'prompt_id': pid, 'question': text, 'answers': answers,
                    'image': images[0] if len(images) == 1 else (images or None)})
  return prompts


def trajectory_to_sft_record(traj: traj_lib.Trajectory, tool_schemas: Sequence[dict], image_paths: Sequence[str],
                             system: str | None = None) -> dict:
  """One Trajectory -> a ShareGPT SFT record, the inverse of `sft_record_to_trajectory`.

  The human turn is '<image>\\n' per prompt image + the question; each step a gpt turn (its text), then, when
  it has a result, an observation: the text the builder rendered (`result.text`, or 'Error: <kind>' for a failed
  call without text) + '\\n<image>' per returned image. `sft_record_to_trajectory(record, ..., profile=<the
  trajectory's profile>)` gives back the same token_ids / gen_mask when every assistant turn's ids are the
  tokenization of its text + <|im_end|> (`TextEngine`s: the oracle expert); a sampled turn whose ids tokenize
  differently comes back as the same text.

  Args:
    traj: the trajectory (prompt images first in `traj.images`, then each step's result images).
    tool_schemas: the schemas its system turn was rendered with (`ToolEnv.schemas()`), written as the record's
      `tools` (function dicts; `tool_schemas` re-wraps them).
    image_paths: one `images` entry per image of `traj.images`, in order (paths relative to the file's folder).
    system: the instructions its system turn was rendered with (None: the default, the field is left out).
  Returns:
    {'id': prompt_id, 'conversations': [...], 'images': list(image_paths), 'tools': JSON text[, 'system']}.
  Raises:
    ValueError: image_paths not one per image, or a question / tool text with leading or trailing whitespace
      (ShareGPT readers strip it, so the record could not give back the same tokens), naming the step.
  """
  if len(image_paths) != len(traj.images):
    raise ValueError(f'{len(image_paths)} image paths for the {len(traj.images)} images of {traj.prompt_id!r}')
  n_tool_images = sum(len(s.result.images) for s in traj.steps if s.result is not None)
  turns = [{'from': 'human', 'value': f'{IMAGE_PLACEHOLDER}\n' * (len(traj.images) - n_tool_images) + traj.question}]
  if traj.question != traj.question.strip():
    raise ValueError(f'{traj.prompt_id!r}: the question has leading/trailing whitespace')
  for step in traj.steps:
    turns.append({'from': 'gpt', 'value': step.text})
    if step.result is not None:
      r = step.result
      text = r.text if (r.text or r.error_kind is None) else f'Error: {r.error_kind}'
      if text != text.strip():
        raise ValueError(f'{traj.prompt_id!r} step {step.index}: tool text has leading/trailing whitespace')
      turns.append({'from': 'observation', 'value': text + f'\n{IMAGE_PLACEHOLDER}' * len(r.images)})
  tools = [t['function'] if set(t) == {'type', 'function'} and t['type'] == 'function' else t for t in tool_schemas]
  record = {'id': traj.prompt_id, 'conversations': turns, 'images': list(image_paths),
            'tools': json.dumps(tools, ensure_ascii=False)}
  if system is not None:
    record['system'] = system
  return record


def write_sft(trajectories: Sequence[traj_lib.Trajectory], path: str | os.PathLike, tool_schemas: Sequence[dict],
              system: str | None = None) -> dict:
  """Writes trajectories as a ShareGPT SFT .jsonl (`trajectory_to_sft_record`), their images as PNG files.

  The images go to `<path stem>_images/<prompt_id>-<sample_index>-<k>.png` (k = 1 for img_1), named in the
  records relative to the file's folder, so `load_sft(path, ...)` reads it back. The file is written to a
  temporary name and renamed into place.

  Returns:
    counts {'written', 'skipped' (records `trajectory_to_sft_record` refused), 'images'}.
  """
  path = pathlib.Path(path)
  image_dir = path.with_name(path.stem + '_images')
  image_dir.mkdir(parents=True, exist_ok=True)
  records, skipped, images = [], 0, 0
  for traj in trajectories:
    stem = f'{traj.prompt_id}-{traj.sample_index}'.replace('/', '_')
    names = [f'{image_dir.name}/{stem}-{k}.png' for k in range(1, len(traj.images) + 1)]
    try:
      record = trajectory_to_sft_record(traj, tool_schemas, names, system)
    except ValueError:
      skipped += 1
      continue
    for name, image in zip(names, traj.images):
      (path.parent / name).write_bytes(image.to_png())
    images += len(names)
    records.append(record)
  tmp = path.with_name(path.name + '.tmp')
  write_jsonl(records, tmp)
  os.replace(tmp, path)
  return {'written': len(records), 'skipped': skipped, 'images': images}


def write_jsonl(records: Sequence[dict], path: str | os.PathLike) -> None:
  """Writes records as JSON lines (for building fixtures and exporting)."""
  with open(path, 'w', encoding='utf-8') as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + '\n')

"""The CLIP branch of stage `ground` (DESIGN.md §7.5; paper Sec. 3: "Image chosen by CLIP similarity >= 0.28 to a
short description of v0").

When `clip_path` names a folder holding a transformers CLIP checkpoint (`CLIPModel` + `CLIPProcessor`, e.g. a
`save_pretrained` of openai/clip-vit-base-patch32), each accepted record's anchor image is the candidate
(`image_candidates`, else `image_path`) whose CLIP cosine similarity to the description of the anchor node (v0;
vh with `data.anchor='answer'`) is highest, if it is >= `threshold` (0.28); otherwise, or without a CLIP model
(`clip_path = ''`, the offline default), the record keeps its infobox image `image_path`, counted with the
reason. Similarities are the cosines of CLIP's projected, L2-normalised image and text embeddings
(`CLIPModel.forward`'s `image_embeds @ text_embeds.T`, i.e. `logits_per_image / logit_scale.exp()`), in [-1, 1].
"""

import dataclasses
import os
import pathlib

import ml_collections
import numpy as np

from data_pipeline import entities


def default_config() -> ml_collections.ConfigDict:
  """`data.clip_ground`:

    clip_path: folder of a transformers CLIP checkpoint; '' = no CLIP model (the infobox image is kept).
    threshold: least cosine similarity of the chosen image to the anchor text (paper: 0.28).
    text_template: the anchor text when a record has no `anchor_description`; `{title}` = the anchor node's
      display title (v0's, or vh's with `data.anchor='answer'`).
  """
  c = ml_collections.ConfigDict()
  c.clip_path = ''
  c.threshold = 0.28
  c.text_template = 'a photo of {title}'
  return c


def check_config(config: ml_collections.ConfigDict, prefix: str = 'data.clip_ground') -> None:
  """Raises ValueError naming the field: clip_path not a str, threshold not a number in [-1, 1], text_template
  without `{title}`; FileNotFoundError: a clip_path that is not a folder."""
  if not isinstance(config.clip_path, str):
    raise ValueError(f'{prefix}.clip_path={config.clip_path!r}: expected a folder path or ""')
  if config.clip_path and not pathlib.Path(config.clip_path).is_dir():
    raise FileNotFoundError(f'{prefix}.clip_path={config.clip_path!r}: no such CLIP checkpoint folder')
  t = config.threshold
  if isinstance(t, bool) or not isinstance(t, (int, float)) or not -1.0 <= t <= 1.0:
    raise ValueError(f'{prefix}.threshold={t!r}: expected a cosine similarity in [-1, 1]')
  if '{title}' not in config.text_template:
    raise ValueError(f'{prefix}.text_template={config.text_template!r}: expected a {{title}} field')


@dataclasses.dataclass(frozen=True)
class Clip:
  """A loaded CLIP checkpoint: `model` (transformers `CLIPModel`, eval mode, float32), `processor`
  (`CLIPProcessor`), `path` (the folder it came from)."""
  model: object
  processor: object
  path: str


def load_clip(path: str | os.PathLike) -> Clip:
  """Loads `CLIPModel.from_pretrained(path)` and `CLIPProcessor.from_pretrained(path)`.

  Raises:
    FileNotFoundError: `path` is not a folder (naming it).
    ValueError: the folder holds no loadable CLIP model or processor (naming it and the cause).
  """
  import transformers  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(path)
  if not folder.is_dir():
    raise FileNotFoundError(f'CLIP checkpoint folder {folder} does not exist')
  try:
    model = transformers.CLIPModel.from_pretrained(folder).eval()
    processor = transformers.CLIPProcessor.from_pretrained(folder)
  except Exception as e:  # pylint: disable=broad-except  # OSError, JSON / safetensors errors, a config mismatch
    raise ValueError(f'could not load a CLIP checkpoint (CLIPModel + CLIPProcessor) from {folder}: '
                     f'{type(e).__name__}: {e}') from e
  return Clip(model=model, processor=processor, path=str(folder))


def score(clip: Clip, images: list[np.ndarray], texts: list[str]) -> np.ndarray:
  """CLIP cosine similarities of every image to every text.

  Args:
    clip: from `load_clip`.
    images: uint8 [H, W, 3] RGB arrays (any sizes; the processor resizes and crops).
    texts: strings (cut to the text model's position limit).
  Returns:
    float32 [I, T], entries in [-1, 1].
  Raises:
    ValueError: no images or no texts.
  """
  import torch  # pylint: disable=import-outside-toplevel
  if not len(images) or not len(texts):
    raise ValueError(f'score needs at least one image and one text (got {len(images)} images, {len(texts)} texts)')
  inputs = clip.processor(text=list(texts), images=[np.asarray(im, np.uint8) for im in images], return_tensors='pt',
                          padding=True, truncation=True,
                          max_length=clip.model.config.text_config.max_position_embeddings)
  with torch.no_grad():
    out = clip.model(**inputs)
  return (out.image_embeds @ out.text_embeds.T).float().numpy().astype(np.float32)


def choose_anchor(clip: Clip, candidates: list[str | os.PathLike], text: str,
                  threshold: float = 0.28) -> tuple[str | None, float | None, str]:
  """The candidate image most similar to `text`, if its similarity reaches `threshold`.

  Args:
    clip: from `load_clip`.
    candidates: image file paths; unreadable ones are left out (named in the reason).
    text: the anchor description, e.g. 'a photo of Taj Mahal'.
    threshold: least cosine similarity.
  Returns:
    (the chosen path as given, or None; the best similarity, None when no image was read; the reason:
    'clip <s> >= <threshold>', 'best clip similarity <s> < <threshold>', 'no candidate images', or 'no readable
    candidate image (...)'; unreadable ones appended as '; unreadable: <path>').
  """
  from tools import image_io  # pylint: disable=import-outside-toplevel
  if not candidates:
    return None, None, 'no candidate images'
  images, readable, unreadable = [], [], []
  for c in candidates:
    try:
      images.append(image_io.load_image(c))
      readable.append(c)
    except image_io.ImageDecodeError:
      unreadable.append(str(c))
  note = f'; unreadable: {", ".join(unreadable)}' if unreadable else ''
  if not images:
    return None, None, f'no readable candidate image ({len(unreadable)} unreadable){note}'
  sims = score(clip, images, [text])[:, 0]
  best = int(np.argmax(sims))
  s = float(sims[best])
  if s >= threshold:
    return str(readable[best]), s, f'clip {s:.3f} >= {threshold}{note}'
  return None, s, f'best clip similarity {s:.3f} < {threshold}{note}'


def anchor_text(rec: dict, text_template: str) -> str:
  """The text the anchor image is scored against: the record's `anchor_description`, else `text_template` with
  the anchor node's display title (`anchor_title` from `ground.ground`: v0, or vh with `data.anchor='answer'`;
  `path[0]` when the record has none)."""
  title = rec.get('anchor_title') or rec['path'][0]
  return rec.get('anchor_description') or text_template.format(title=entities.display(title))


def ground_by_clip(records: list[dict], config: ml_collections.ConfigDict, data_dir: str | os.PathLike,
                   clip: Clip | None = None) -> tuple[list[dict], dict]:
  """Picks each accepted record's anchor image by CLIP (see the module docstring).

  Args:
    records: dicts with path [titles], image_path (relative to `data_dir`, the infobox image), rejected;
      optional image_candidates (paths relative to `data_dir`), anchor_title and anchor_description
      (`ground.ground` sets the first two).
    config: `default_config()` fields.
    data_dir: the shared data folder.
    clip: a loaded model (None: `load_clip(config.clip_path)` when clip_path is set).
  Returns:
    (records with `image_path` (the chosen one), `anchor_source` ('clip', 'infobox: <why>', '' when rejected)
    and `anchor_clip_score` (float, None when not scored), counts {'in', 'accepted_in', 'skipped_rejected',
    'clip_path', 'skipped' ({'no clip model': n} offline), 'clip_chosen', 'changed_image' (chosen != infobox
    image), 'infobox_kept' ('below threshold' / 'no readable candidate image' -> n)}).
  Raises:
    ValueError: an accepted record without `path` or `image_path` (naming it); from `load_clip`.
  """
  out = [dict(r, anchor_source='', anchor_clip_score=None) for r in records]
  todo = [i for i, r in enumerate(out) if not r.get('rejected')]
  for i in todo:
    if not out[i].get('path') or not out[i].get('image_path'):
      raise ValueError(f'ground_by_clip: record {out[i].get("prompt_id", "?")!r} needs `path` and `image_path`')
  counts = {'in': len(out), 'accepted_in': len(todo), 'skipped_rejected': len(out) - len(todo),
            'clip_path': config.clip_path if clip is None else clip.path, 'skipped': {}, 'clip_chosen': 0,
            'changed_image': 0, 'infobox_kept': {}}
  if clip is None and not config.clip_path:
    counts['skipped'] = {'no clip model': len(todo)}
    for i in todo:
      out[i]['anchor_source'] = 'infobox: no clip model'
    return out, counts
  clip = clip if clip is not None else load_clip(config.clip_path)
  root = pathlib.Path(data_dir)
  for i in todo:
    rec = out[i]
    rel = list(rec.get('image_candidates') or [rec['image_path']])
    chosen, s, why = choose_anchor(clip, [root / r for r in rel], anchor_text(rec, config.text_template),
                                   float(config.threshold))
    rec['anchor_clip_score'] = s
    if chosen is None:
      rec['anchor_source'] = f'infobox: {why}'
      kind = 'below threshold' if s is not None else 'no readable candidate image'
      counts['infobox_kept'][kind] = counts['infobox_kept'].get(kind, 0) + 1
      continue
    new = rel[[str(root / r) for r in rel].index(chosen)]
    counts['clip_chosen'] += 1
    counts['changed_image'] += int(new != rec['image_path'])
    rec.update(image_path=new, anchor_source='clip')
  return out, counts

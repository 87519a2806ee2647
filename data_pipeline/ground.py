"""Stage `ground`: source-anchor grounding (DESIGN.md §7.5).

The image is the seed article's image (v0, the start of the path, never the answer entity), so one reverse image
search identifies v0 and nothing more. Offline there is no CLIP model, so the anchor is the image the walk was
seeded from (the "infobox image otherwise" branch of §7.5): a landmark photo (Wikispeedia) or the infobox image
file looked up under `data.image_dir` (XML); its path, relative to the data folder or absolute, is in
`image_path`, and an item whose file is missing is rejected ('ground: image file missing'). The mention of v0 is
replaced by a referring expression chosen by v0's domain (`DOMAIN_REFERRING`: 'the person in the image', 'the
building in the image', ...; the landmark photos keep their own, `REFERRING_EXPRESSIONS`), and the non-leakage
check runs again over every path node, v0 included. Each grounded record names its anchor node (`anchor_title`)
and, when that article has more than one image file under `data.image_dir`, the candidates the CLIP branch
(`clip_ground.py`) chooses among (`image_candidates`, the infobox image first).

`data.anchor='answer'` (the Table 3a "answer-anchored image" ablation): the image is vh's, v0 stays named in the
question (the leak check then skips v0); an answer node without an image is rejected ('ground: answer node has no
image'). With `data.rewrite=False` the canonical question names v1..vh by design, so only v0 and the answer are
checked.
"""

import pathlib

from data_pipeline import entities
from data_pipeline import rewrite as rewrite_lib

ANCHORS = ('source', 'answer')
DEFAULT_REFERRING = 'the subject of the image'
# Domain of v0 (`wiki.DOMAINS`) -> referring expression.
DOMAIN_REFERRING: dict[str, str] = {
    'Person': 'the person in the image',
    'Building-Place': 'the building in the image',
    'Location': 'the place in the image',
    'Organism': 'the organism in the image',
    'Artifact': 'the object in the image',
}

# Photo file stem -> referring expression for its article (the article may cover more than the photo shows).
REFERRING_EXPRESSIONS: dict[str, str] = {
    'big-ben': 'the building whose clock tower is shown in the image',
    'great-sphinx': 'the ancient site where the monument in the image stands',
    'moai-statues': 'the island where the statues in the image stand',
    'toronto-skyline': 'the city whose skyline is shown in the image',
    'grand-canyon': 'the natural landmark in the image',
    'niagara-falls': 'the waterfalls in the image',
    'stonehenge': 'the prehistoric monument in the image',
    'machu-picchu': 'the ruins in the image',
    'great-wall': 'the structure in the image',
    'great-pyramid-of-khufu': 'the monument in the image',
    'leaning-tower-of-pisa': 'the tower in the image',
    'taj-mahal': 'the mausoleum in the image',
}


def referring_expression(stem: str, domain: str = '') -> str:
  """How the question refers to v0: the photo's own expression (`REFERRING_EXPRESSIONS[stem]`), else by v0's
  domain (`DOMAIN_REFERRING`), else `DEFAULT_REFERRING`."""
  return REFERRING_EXPRESSIONS.get(stem) or DOMAIN_REFERRING.get(domain, DEFAULT_REFERRING)


def image_candidates(image_path: str, images: list[str], data_dir, image_dir: str) -> list[str]:
  """The anchor images `clip_ground.ground_by_clip` chooses among: `image_path` (the infobox / seed image) first,
  then each of the anchor article's image files (`WikiGraph.images`) that exists under `image_dir`, as
  `{image_dir}/{file}` (relative to `data_dir` unless `image_dir` is absolute); [] when that leaves fewer than two
  (nothing to choose).

  Args:
    image_path: the record's anchor image, e.g. 'imgs/Tower.jpg'.
    images: the anchor article's image file names, infobox image first, e.g. ['Tower.jpg', 'Tower night.jpg'].
    data_dir: the shared data folder; image_dir: the article images' folder (relative to data_dir, or absolute).
  """
  out = [image_path]
  for f in images:
    rel = f'{image_dir.rstrip("/")}/{f}'
    if rel not in out and (pathlib.Path(data_dir) / rel).is_file():
      out.append(rel)
  return out if len(out) > 1 else []


def _image_size(path: pathlib.Path) -> tuple[int, int]:
  """(width, height) in pixels from the file's header (`image_io.read_size`); (0, 0) when it is not an image."""
  from tools import image_io  # pylint: disable=g-import-not-at-top
  try:
    return image_io.read_size(path.read_bytes(), str(path))
  except image_io.ImageDecodeError:
    return 0, 0


def ground(records: list[dict], graph, data_dir, image_dir: str, anchor: str = 'source',
           rewritten: bool = True, min_image_side: int = 0) -> tuple[list[dict], dict]:
  """Sets the anchor image and the final question; re-checks leakage over the whole path.

  Args:
    records: output of `rewrite.rewrite`.
    graph: the `wiki_graph.WikiGraph`.
    data_dir: the shared data folder (relative image paths are under it).
    image_dir: folder of the article images (relative to `data_dir`, or absolute), for `anchor='answer'`.
    anchor: 'source' (v0's image) | 'answer' (vh's image, the ablation).
    rewritten: whether the `rewrite` stage rewrote (False: canonical questions, v1..vh named by design).
    min_image_side: the smallest width and height (pixels) of an anchor image (`data.min_image_side`, Appendix
      D.1: 512); a smaller one is rejected ('ground: anchor image below NxN (WxH)').
  Returns:
    (records with the final `question`, `anchor_expression`, `image_path`, `anchor_title` (the anchor node:
    v0, or vh for 'answer'; '' when rejected), `image_candidates` (`image_candidates`; [] when rejected); counts
    {'in', 'grounded',
    'rejected' (reason -> n), 'skipped', 'anchor'}).
  Raises:
    ValueError: `anchor` not in `ANCHORS`.
  """
  if anchor not in ANCHORS:
    raise ValueError(f'data.anchor={anchor!r}: expected one of {ANCHORS}')
  out, counts = [], {'in': len(records), 'grounded': 0, 'rejected': {}, 'skipped': 0, 'anchor': anchor}

  def reject(rec, reason):
    rec['rejected'] = 'ground: ' + reason
    key = reason.split(' (')[0].split(':')[0]
    counts['rejected'][key] = counts['rejected'].get(key, 0) + 1

  for rec in records:
    rec = dict(rec)
    if rec.get('rejected'):
      counts['skipped'] += 1
      rec.update(anchor_expression='', anchor_title='', image_candidates=[])
      out.append(rec)
      continue
    path = rec['path']
    if anchor == 'source':
      expr = referring_expression(rec['landmark'], rec.get('domain') or graph.domain(path[0]))
      skip = ()
    else:
      images = graph.images(path[-1])
      if not images:
        reject(rec, 'answer node has no image')
        rec.update(anchor_expression='', anchor_title='', image_candidates=[])
        out.append(rec)
        continue
      rec.update(image_path=f'{image_dir.rstrip("/")}/{images[0]}', landmark=images[0].rsplit('.', 1)[0])
      expr, skip = entities.display(path[0]), (path[0],)
    anchor_title = path[0] if anchor == 'source' else path[-1]
    rec.update(anchor_title=anchor_title,
               image_candidates=image_candidates(rec['image_path'], graph.images(anchor_title), data_dir, image_dir))
    question = rec['question_template'].replace('{E0}', expr)
    rec.update(question=question, anchor_expression=expr if anchor == 'source' else '',
               rewrite_trace=list(rec['rewrite_trace']) + [question])
    checked = [t for t in path if t not in skip] if rewritten else [t for t in path[:1] if t not in skip]
    leaks = rewrite_lib.find_leaks(question, checked, graph, rec['answers'])
    if leaks:
      reject(rec, 'leak: ' + '; '.join(leaks))
    elif not (pathlib.Path(data_dir) / rec['image_path']).is_file():
      reject(rec, f"image file missing ({rec['image_path']})")
    elif min_image_side and min(size := _image_size(pathlib.Path(data_dir) / rec['image_path'])) < min_image_side:
      reject(rec, f"anchor image below {min_image_side}x{min_image_side} ({size[0]}x{size[1]}: {rec['image_path']})")
    else:
      counts['grounded'] += 1
    out.append(rec)
  return out, counts

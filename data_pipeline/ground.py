"""Stage `ground`: source-anchor grounding (DESIGN.md §7.5).

The image is the landmark photo of v0 (the start of the path, never the answer entity), so one reverse image
search identifies v0 and nothing more. Offline there is no CLIP model, so the anchor is the photo the walk was
rooted at (the "infobox image otherwise" branch of §7.5); its path, relative to the data folder, is in
`image_path`. The mention of v0 is replaced by a referring expression (`REFERRING_EXPRESSIONS`, per photo,
default "the landmark in the image"), and the non-leakage check runs again over every path node, v0 included.
"""

from data_pipeline import rewrite as rewrite_lib

DEFAULT_REFERRING = 'the landmark in the image'

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


def referring_expression(stem: str) -> str:
  """How the question refers to v0 for the photo `stem`."""
  return REFERRING_EXPRESSIONS.get(stem, DEFAULT_REFERRING)


def ground(records: list[dict], all_titles: tuple[str, ...]) -> tuple[list[dict], dict]:
  """Replaces v0 by its referring expression and re-checks leakage over the whole path.

  Args:
    records: output of `rewrite.rewrite`.
    all_titles: corpus titles.
  Returns:
    (records with the final `question`, `anchor_expression`; counts {'in', 'grounded', 'rejected_leak',
    'skipped'}).
  """
  out, counts = [], {'in': len(records), 'grounded': 0, 'rejected_leak': 0, 'skipped': 0}
  for rec in records:
    rec = dict(rec)
    if rec.get('rejected'):
      counts['skipped'] += 1
      rec['anchor_expression'] = ''
      out.append(rec)
      continue
    expr = referring_expression(rec['landmark'])
    question = rec['question_template'].replace('{E0}', expr)
    rec.update(question=question, anchor_expression=expr,
               rewrite_trace=list(rec['rewrite_trace']) + [question])
    leaks = rewrite_lib.find_leaks(question, rec['path'], all_titles, rec['answers'])
    if leaks:
      rec['rejected'] = 'ground: leak: ' + '; '.join(leaks)
      counts['rejected_leak'] += 1
    else:
      counts['grounded'] += 1
    out.append(rec)
  return out, counts

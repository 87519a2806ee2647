"""Reviews a built dataset as a person would: N random accepted items with every hop's evidence beside it.

  python -m data_pipeline.review W --sample 20 --seed 0

W is a build's workdir (the dataset is `W/data`) or the dataset folder itself. For each sampled accepted item
it prints (and writes as `<dataset>/review.html`, the anchor image shown) the path, each hop's descriptor and
relation, every mention of the descriptor's class the previous article's text names (`reader.read`, the way a
reader counts them: surname-only and title forms, entities without an article classed from their context; the
link sentence for a read relation), each with its count, how it was classed and its sentence, the mentions it
could not class (every one, most named first), the descriptor's evidence (the node's defining sentence,
`classes.definition`), the answer with its aliases and infobox line, the image, and its own verdicts (not the
build's: an item built by another check is judged the same way):

  referent   per hop: 'unique' (the only one of its class named), 'most often' (the relation says so and
             `wiki_graph.dominates` holds), else 'AMBIGUOUS'; SERIOUS (the item is then SERIOUS) when the hop's
             entity is not named, when a hop that says it is the one ('mentioned in', 'named in', a relation)
             has another mention of its class beside it (Froggo beside Superman, Puebla beside Mexico), or when
             a 'most often' hop has another named as often or more (Taft x34 beside McKinley x16);
  descriptor per hop: 'fits' when it is one of the node's evidence-backed descriptors (`WikiGraph.descriptors`)
             or an LLM's more specific phrase ending with one (`llm_descriptors.class_of`: its class is then
             the one the competitors are counted in), else 'NO EVIDENCE';
  reading    `rewrite.reading_error` (garden path, two relative clauses in a hop, 'X or Y');
  leak       `rewrite.find_leaks` over the whole path and the answer;
  answer     `paths.historical` (a value of the past) on the answer's infobox line, and
             `qa.answer_type_error` (a value not of its type, a year not stated exactly: 'Spring 1480'; SERIOUS);
  chain      how many accepted items share the item's answer chain (`paths.answer_chain`, at most 2).
The summary line (stderr) counts the items reviewed, flagged and serious.
"""

import collections
import html
import json
import os
import pathlib
import sys

import numpy as np
from absl import app, flags

from data_pipeline import classes, llm_descriptors, paths, qa, reader, reader_lexicon, relations, rewrite, wiki_graph
from osvl_jax import paths as osvl_paths
from osvl_jax.data import pipeline as pipeline_data

REVIEW_FILE = 'review.html'
MAX_SENTENCE = 300  # characters of a mention's sentence shown


def dataset_folder(path: str | os.PathLike) -> pathlib.Path:
  """The dataset folder of a workdir (`W/data`) or the folder itself when it holds the `items` split.

  Raises:
    FileNotFoundError: neither holds a finished `items` split.
  """
  path = pathlib.Path(path)
  for folder in (path / 'data', path):
    if pipeline_data.has_split(folder / 'items'):
      return folder
  raise FileNotFoundError(f'{path}: no items split in {path / "data"} or {path} (build it with '
                          '`python -m data_pipeline.build --config=... --workdir=W`)')


def hop_review(g, src: str, dst: str, descriptor: str, rel: str) -> dict:
  """One hop's evidence and verdict, read from the text as a reader counts it (`WikiGraph.competitor_mentions`,
  `reader.read`), whatever check built the item.

  Returns:
    {'competitors': [mention dicts of the descriptor's class besides src, dst among them when named: key, name,
    article (bool), count, evidence, sentence], 'unclassified': [mention dicts the reader could not class that
    may be of the class: people for a person class, other names for the rest; every one, most named first],
    'referent': 'unique' | 'most often' | 'AMBIGUOUS', 'serious': dst not named, or another mention of the class
    beside it (a 'most often' hop: one named as often as dst or more), 'class': the class counted}.
  """
  cls = llm_descriptors.class_of(descriptor, g.descriptors(dst)) or descriptor
  text = g.competitor_text(src, dst)
  found = g.competitor_mentions(src, dst, cls)
  counts = [(m.key, m.count) for m in found]
  mine = next((m.count for m in found if m.key == dst), 0)
  others = [m for m in found if m.key != dst]
  if mine and not others:
    referent = 'unique'
  elif rel == relations.MOST_OFTEN and wiki_graph.dominates(dst, counts):
    referent = 'most often'
  else:   # another of the class named ("the X named in ..." then has two referents), or not far less often
    referent = 'AMBIGUOUS'
  person = cls in reader_lexicon.PERSON_PHRASES
  reading = g.reading(text, src)
  unclassed = [m for m in reader.unclassified(reading, person if person else None)
               if m.key != src and (person or not m.person)]
  as_dict = lambda m: {'key': m.key, 'name': m.name, 'article': m.title is not None, 'count': m.count,
                       'evidence': list(m.evidence), 'sentence': m.sentence[:MAX_SENTENCE]}
  return {'class': cls, 'competitors': [as_dict(m) for m in found], 'unclassified': [as_dict(m) for m in unclassed],
          'referent': referent, 'serious': not mine or any(
              rel != relations.MOST_OFTEN or m.count >= mine for m in others)}


def answer_error(item: dict) -> str | None:
  """Why the item's answer is no well-formed value of its attribute (`qa.answer_type_error` on the infobox value of
  `answer_evidence`: 'Born Spring 1480' is no exact year), or None."""
  if not item['answers']:
    return 'no answer'
  line = item['answer_evidence'].split(': ', 1)[-1].split(' / ')[-1]
  why = qa.answer_type_error(item['answer_attribute'], item['answers'][0],
                             qa.raw_value(item['answer_attribute'], line))
  return f'answer type: {why}' if why else None


def review_item(g, item: dict, chain_counts: dict) -> dict:
  """The review of one accepted item (module docstring): hops with competitors and verdicts, answer, checks.

  Args:
    g: the dataset's `wiki_graph.WikiGraph`; item: a row of the `items` split;
    chain_counts: `paths.answer_chain` -> distinct paths of the accepted items with it.
  Returns:
    {'prompt_id', 'question', 'path', 'image_path', 'hops': [{'src', 'dst', 'descriptor', 'relation', 'class',
    'competitors', 'unclassified', 'referent', 'serious' (`hop_review`), 'descriptor_check', 'definition'}],
    'answers', 'evidence', 'checks': {'reading', 'leak', 'answer', 'chain'}, 'serious': a hop is, 'ok': all
    verdicts good}.
  """
  path, descs, rels = item['path'], item['descriptors'], item['relations']
  hops = []
  for src, dst, d, rel in zip(path, path[1:], descs, rels):
    hop = hop_review(g, src, dst, d, rel)
    hops.append({'src': src, 'dst': dst, 'descriptor': d, 'relation': rel, **hop,
                 'descriptor_check': 'fits' if hop['class'] in g.descriptors(dst) and ' or ' not in d
                 else 'NO EVIDENCE',
                 'definition': classes.definition(g.text(dst), g.aliases(dst))[0][:240]})
  persons = [g.domain(t) == 'Person' for t in path[1:]]
  leaks = rewrite.find_leaks(item['question'], path, g, item['answers'])
  line = item['answer_evidence'].split(': ', 1)[-1]
  answer = answer_error(item)
  checks = {'reading': rewrite.reading_error(descs, rels, persons) or 'ok',
            'leak': '; '.join(leaks) or 'ok',
            'answer': answer or paths.historical(g, path[-1], item['answer_attribute'], line) or 'ok',
            'chain': f"{chain_counts[paths.answer_chain(path)]} path(s) end with {' -> '.join(path[-2:])}"}
  ok = (all(h['referent'] != 'AMBIGUOUS' and h['descriptor_check'] == 'fits' for h in hops)
        and all(checks[k] == 'ok' for k in ('reading', 'leak', 'answer'))
        and chain_counts[paths.answer_chain(path)] <= paths.MAX_PER_CHAIN)
  return {'prompt_id': item['prompt_id'], 'question': item['question'], 'path': path,
          'image_path': item['image_path'], 'hops': hops, 'answers': item['answers'],
          'evidence': item['answer_evidence'], 'checks': checks,
          'serious': any(h['serious'] for h in hops) or bool(answer),
          'ok': ok}


def review(dataset: str | os.PathLike, sample: int, seed: int, data_dir: str | os.PathLike | None = None
           ) -> list[dict]:
  """Reviews `sample` accepted items drawn with `seed` (without replacement, in dataset order).

  Args:
    dataset: the dataset folder (`dataset_folder`); sample: items (all when fewer are accepted); seed: the draw's.
    data_dir: the shared data folder the image paths are relative to (default `osvl_paths.data_dir()`).
  Returns:
    `review_item` dicts, each with 'image_file' (absolute path of the anchor image).
  Raises:
    FileNotFoundError: from `dataset_folder` / `WikiGraph.open`.
  """
  dataset = pathlib.Path(dataset)
  items, _ = pipeline_data.read_split(dataset / 'items')
  ok = [r for r in items if not r['rejected']]
  # Distinct paths per chain (the items asking other attributes of one walk count once).
  chain_counts = collections.Counter(paths.answer_chain(list(p)) for p in {tuple(r['path']) for r in ok})
  picked = sorted(np.random.default_rng(seed).choice(len(ok), min(sample, len(ok)), replace=False).tolist())
  g = wiki_graph.WikiGraph.open(dataset / 'wiki')
  root = pathlib.Path(data_dir) if data_dir else osvl_paths.data_dir()
  out = []
  for i in picked:
    rec = review_item(g, ok[i], chain_counts)
    rec['image_file'] = str(root / rec['image_path'])
    out.append(rec)
  return out


def _verdict(rec: dict) -> str:
  return 'SERIOUS' if rec['serious'] else 'OK' if rec['ok'] else 'FLAGGED'


def _mention_line(m: dict) -> str:
  kind = 'article' if m['article'] else 'no article'
  why = '; '.join(m['evidence']) or 'no evidence'
  return f"{m['name']} x{m['count']} ({kind}; {why}): \"{m['sentence']}\""


def as_text(rec: dict) -> str:
  """One reviewed item as plain text lines: per hop every competing mention with its sentence, the verdict,
  the mentions it could not class."""
  lines = [f"== {rec['prompt_id']}  {_verdict(rec)}", f"Q: {rec['question']}",
           f"path: {' -> '.join(rec['path'])}", f"image: {rec['image_path']}"]
  for k, h in enumerate(rec['hops'], 1):
    lines.append(f"  hop {k}: {h['src']} -> {h['dst']}: the {h['descriptor']} [{h['relation']}]  referent: "
                 f"{h['referent']}{' SERIOUS' if h['serious'] else ''}; descriptor: {h['descriptor_check']}")
    comp = ', '.join(f"{m['key']} x{m['count']}" for m in h['competitors']) or '(none)'
    lines.append(f"         class '{h['class']}' named in the text: {comp}")
    lines += [f'           - {_mention_line(m)}' for m in h['competitors']]
    if h['unclassified']:
      lines.append('         could not classify: ' + ', '.join(f"{m['name']} x{m['count']}" for m in h['unclassified']))
    lines.append(f"         definition: {h['definition'] or '(none found)'}")
  lines.append(f"A: {rec['answers'][0] if rec['answers'] else ''}  aliases: {rec['answers'][1:]}  "
               f"({rec['evidence']})")
  lines.append('checks: ' + '; '.join(f'{k}: {v}' for k, v in rec['checks'].items()))
  return '\n'.join(lines)


def as_html(recs: list[dict], dataset: pathlib.Path) -> str:
  """The reviewed items as one HTML page (images linked relative to `dataset`, where the page is written)."""
  esc = html.escape
  parts = ['<!doctype html><meta charset="utf-8"><title>review</title><style>body{font-family:sans-serif;'
           'max-width:70em}.bad{color:#b00}table{border-collapse:collapse}td,th{border:1px solid #ccc;'
           'padding:2px 6px;vertical-align:top}img{max-width:256px;float:right}</style>']
  for rec in recs:
    image = os.path.relpath(rec['image_file'], dataset)
    parts.append(f"<h3 class=\"{'' if rec['ok'] else 'bad'}\">{esc(rec['prompt_id'])} "
                 f"{_verdict(rec)}</h3><img src=\"{esc(image)}\" alt=\"{esc(image)}\">"
                 f"<p><b>Q:</b> {esc(rec['question'])}<br><b>path:</b> {esc(' → '.join(rec['path']))}</p>"
                 '<table><tr><th>hop</th><th>descriptor [relation]</th><th>class named in the text (count)</th>'
                 '<th>referent</th><th>descriptor</th><th>definition</th></tr>')
    for h in rec['hops']:
      comp = ''.join(f"<li>{esc(_mention_line(m))}</li>" for m in h['competitors']) or '(none)'
      unc = ', '.join(f"{m['name']} ×{m['count']}" for m in h['unclassified'])
      parts.append(f"<tr><td>{esc(h['src'])} → {esc(h['dst'])}</td><td>{esc(h['descriptor'])} "
                   f"[{esc(h['relation'])}]</td><td><ul>{comp}</ul>"
                   f"{'<small>could not classify: ' + esc(unc) + '</small>' if unc else ''}</td>"
                   f"<td class=\"{'bad' if h['referent'] == 'AMBIGUOUS' else ''}\">{esc(h['referent'])}"
                   f"{' <b>SERIOUS</b>' if h['serious'] else ''}</td>"
                   f"<td>{esc(h['descriptor_check'])}</td><td>{esc(h['definition'])}</td></tr>")
    parts.append(f"</table><p><b>A:</b> {esc(', '.join(rec['answers']))} <small>({esc(rec['evidence'])})</small>"
                 f"<br><b>checks:</b> {esc('; '.join(f'{k}: {v}' for k, v in rec['checks'].items()))}</p>"
                 '<hr style="clear:both">')
  return '\n'.join(parts)


def main(argv) -> None:
  if len(argv) != 2:
    raise app.UsageError('usage: python -m data_pipeline.review W --sample N --seed S (W: a workdir or dataset)')
  dataset = dataset_folder(argv[1])
  recs = review(dataset, _SAMPLE.value, _SEED.value)
  for rec in recs:
    print(as_text(rec) + '\n')
  (dataset / REVIEW_FILE).write_text(as_html(recs, dataset))
  print(json.dumps({'reviewed': len(recs), 'flagged': sum(not r['ok'] for r in recs),
                    'serious': sum(r['serious'] for r in recs), 'html': str(dataset / REVIEW_FILE)}), file=sys.stderr)


if __name__ == '__main__':
  _SAMPLE = flags.DEFINE_integer('sample', 20, 'accepted items to review')
  _SEED = flags.DEFINE_integer('seed', 0, 'seed of the draw')
  app.run(main)

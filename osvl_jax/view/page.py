"""The static trajectory page of `python -m osvl_jax.view`: `<out>/index.html` + `<out>/images/<sha1>.png`.

No server and no network: the page is opened from disk (file://); its images are files beside it, written once per
distinct PNG. Per trajectory: the question, the prompt images, then per step the reasoning (the think block), the
tool call (name and arguments) or the response, the tool result (ok / error kind, text, images) and the step's
format reward r_fmt^(l); the emitted tokens of the step and how many of them the loss keeps (Eq. 10's M under the
entry's fatal_mode), the fatal step and the masked steps marked; the final answer, the judge's verdict, the reward
parts. Filters (source, benchmark, mode, verdict) hide cards in the page's own script; the address fragment
presets them (`index.html#verdict=wrong&benchmark=fvqa`). What could not be read (`found['unreadable']`, a card that
fails to render) is listed under the heading; all text is escaped, a lone surrogate shown as U+FFFD.
"""

import hashlib
import html
import json
import pathlib
import re

from PIL import Image

from osvl_jax.view import sources

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 1em; color: #222; }
header { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #ccc; }
article.traj { border: 1px solid #bbb; border-radius: 6px; margin: 1em 0; padding: .6em 1em; }
article.traj[hidden] { display: none; }
.meta { color: #444; } .meta b { color: #000; }
ol.steps { padding-left: 1.2em; }
li.step { border-left: 4px solid #5a5; margin: .6em 0; padding: .3em .7em; background: #f7fbf7; }
li.step.bad-format { border-left-color: #c90; background: #fffaf0; }
li.step.masked { border-left-color: #999; background: repeating-linear-gradient(45deg, #eee, #eee 6px, #f6f6f6 6px,
  #f6f6f6 12px); }
li.step.fatal { border-left-color: #c22; }
.badge { display: inline-block; border-radius: 3px; padding: 0 .4em; margin-right: .3em; font-size: 12px;
  background: #ddd; }
.badge.fatal { background: #c22; color: #fff; } .badge.masked { background: #777; color: #fff; }
.badge.ok { background: #5a5; color: #fff; } .badge.bad { background: #c90; color: #fff; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2em 0; background: #fff; padding: .3em;
  border: 1px solid #e3e3e3; }
.result.error pre { border-color: #c22; }
figure { display: inline-block; margin: .3em .6em .3em 0; } figure img { max-width: 320px; max-height: 320px;
  border: 1px solid #ccc; } figcaption { font-size: 12px; color: #555; }
.verdict-correct { color: #181; font-weight: bold; } .verdict-wrong { color: #b11; font-weight: bold; }
.verdict-judge_error { color: #b70; font-weight: bold; }
"""

_SCRIPT = """
const cards = Array.from(document.querySelectorAll('article.traj'));
const selects = Array.from(document.querySelectorAll('select[data-filter]'));
function applyFilters() {
  let shown = 0;
  for (const card of cards) {
    const keep = selects.every(s => s.value === '' || card.dataset[s.dataset.filter] === s.value);
    card.hidden = !keep;
    shown += keep ? 1 : 0;
  }
  document.getElementById('count').textContent = `showing ${shown} of ${cards.length} trajectories`;
}
selects.forEach(s => s.addEventListener('change', applyFilters));
// `index.html#verdict=wrong&benchmark=fvqa` opens the page filtered (links from a report)
for (const [key, value] of new URLSearchParams(location.hash.slice(1))) {
  const select = selects.find(s => s.dataset.filter === key);
  if (select && Array.from(select.options).some(o => o.value === value)) select.value = value;
}
applyFilters();
"""

_FILTERS = ('source', 'benchmark', 'mode', 'verdict')
_SURROGATE = re.compile('[\ud800-\udfff]')  # a lone surrogate: no UTF-8 for it (a str only holds lone ones)


class _Images:
  """Writes each distinct image once under `<out>/images/` and returns its relative path."""

  def __init__(self, out: pathlib.Path):
    self.folder = out / 'images'
    self.folder.mkdir(parents=True, exist_ok=True)
    self.written = 0

  def path(self, pixels) -> str:
    image = Image.fromarray(pixels)
    name = hashlib.sha1(image.tobytes() + repr(image.size).encode()).hexdigest()[:16] + '.png'
    target = self.folder / name
    if not target.exists():
      image.save(target)
      self.written += 1
    return f'images/{name}'


def _figure(images: _Images, pixels, caption: str) -> str:
  h, w = pixels.shape[:2]
  return (f'<figure><img src="{images.path(pixels)}" alt="{html.escape(caption)}" width="{w}" height="{h}">'
          f'<figcaption>{html.escape(caption)} ({w}×{h})</figcaption></figure>')


def _pre(text) -> str:
  return f'<pre>{html.escape(str(text))}</pre>'


def _step(entry: sources.Entry, step, counts: tuple[int, int], image_no: int, images: _Images) -> tuple[str, int]:
  traj, action = entry.traj, step.action
  emitted, kept = counts
  fatal = traj.fatal_step is not None and step.index == traj.fatal_step
  masked = kept is not None and emitted > 0 and kept == 0
  classes = ['step'] + (['fatal'] if fatal else []) + (['masked'] if masked else []) + (
      [] if step.format_ok else ['bad-format'])
  badges = [f'<span class="badge">step {step.index}</span>',
            f'<span class="badge {"ok" if step.format_ok else "bad"}">r_fmt {int(step.format_ok)}</span>',
            f'<span class="badge">{emitted} tokens emitted' + (f', {kept} in the loss' if kept is not None else '')
            + '</span>']
  if fatal:
    badges.append('<span class="badge fatal">fatal step</span>')
  if masked:
    badges.append(f'<span class="badge masked">masked from the loss ({html.escape(entry.fatal_mode)})</span>')
  parts = [f'<li class="{" ".join(classes)}" data-step="{step.index}">', '<div>' + ''.join(badges) + '</div>']
  if action.think is not None:
    parts.append('<div class="think"><b>reasoning</b>' + _pre(action.think) + '</div>')
  if action.kind == 'tool_call':
    parts.append(f'<div class="call"><b>tool call</b> <code>{html.escape(str(action.name))}</code>'
                 + _pre(json.dumps(action.arguments, ensure_ascii=False, indent=1)) + '</div>')
  elif action.kind == 'response':
    parts.append('<div class="response"><b>response</b>' + _pre(action.response) + '</div>')
  else:
    parts.append(f'<div class="malformed"><b>{html.escape(action.kind)}</b> {html.escape(action.error or "")}'
                 + _pre(step.text) + '</div>')
  if step.result is not None:
    r = step.result
    status = 'ok' if r.ok else f'error: {r.error_kind}'
    if r.ok and r.error_kind:
      status = f'ok ({r.error_kind})'
    parts.append(f'<div class="result {"ok" if r.ok else "error"}"><b>tool result</b> {html.escape(status)}, '
                 f'{r.seconds:.2f} s' + _pre(r.text))
    for pixels in r.images:
      image_no += 1
      parts.append(_figure(images, pixels, f'img_{image_no}'))
    parts.append('</div>')
  return ''.join(parts) + '</li>', image_no


def _card(i: int, entry: sources.Entry, images: _Images) -> str:
  traj = entry.traj
  data = ' '.join(f'data-{k}="{html.escape(getattr(entry, k))}"' for k in _FILTERS)
  meta = [('source', entry.where), ('prompt_id', f'{traj.prompt_id} · sample {traj.sample_index}'),
          ('stop', traj.stop_reason or '—'),
          ('fatal step', '—' if traj.fatal_step is None else str(traj.fatal_step)),
          ('answers', ' | '.join(traj.answers) or '—')]
  if entry.benchmark:
    meta.insert(1, ('benchmark / mode', f'{entry.benchmark} / {entry.mode}'))
  if traj.error:
    meta.append(('error', traj.error))
  parts = [f'<article class="traj" id="t{i}" {data}>',
           f'<h2>{html.escape(traj.question or traj.prompt_id)}</h2>',
           '<div class="meta">' + ' · '.join(f'<b>{html.escape(k)}</b> {html.escape(v)}' for k, v in meta) + '</div>']
  n_prompt = sources.prompt_image_count(traj)
  parts += ['<div class="prompt-images">'] + [_figure(images, traj.images[k].pixels, f'img_{k + 1}')
                                               for k in range(n_prompt)] + ['</div>', '<ol class="steps" start="0">']
  image_no = n_prompt
  for step, counts in zip(traj.steps, sources.step_token_counts(entry)):
    text, image_no = _step(entry, step, counts, image_no, images)
    parts.append(text)
  parts.append('</ol>')
  final = [f'<b>final answer</b> {html.escape(traj.final_response) if traj.final_response is not None else "none"}']
  if entry.verdict:
    final.append(f'<b>verdict</b> <span class="verdict-{entry.verdict}">{entry.verdict}</span>')
  if entry.judge_error:
    final.append(f'<b>judge error</b> {html.escape(entry.judge_error)}')
  if entry.scores:
    final.append(' · '.join(f'<b>{html.escape(k)}</b> {v:.3f}' for k, v in entry.scores.items()))
  parts.append('<div class="final">' + ' · '.join(final) + '</div></article>')
  return '\n'.join(parts)


def _filters(entries: list[sources.Entry]) -> str:
  out = []
  for key in _FILTERS:
    values = sorted({getattr(e, key) for e in entries} - {''})
    if values:
      options = ''.join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
      out.append(f'<label>{key} <select data-filter="{key}"><option value="">all</option>{options}</select></label>')
  return ' '.join(out)


def write(entries: list[sources.Entry], out: str | pathlib.Path, title: str, found: dict | None = None
          ) -> pathlib.Path:
  """Writes `<out>/index.html` (and its images) for `entries`; returns the page's path.

  Args:
    entries: what `sources.load` returned.
    out: the output folder (created; an existing page and its images are replaced).
    title: the page heading (e.g. the path viewed).
    found: `sources.load`'s counts, shown under the heading, and what it could not read ('unreadable'), listed there
      with the entries that fail to render.
  """
  out = pathlib.Path(out)
  images = _Images(out)
  found = dict(found or {})
  unreadable = list(found.pop('unreadable', []))
  cards, shown = [], []
  for e in entries:
    try:
      cards.append(_card(len(cards), e, images))
      shown.append(e)
    except (ValueError, KeyError, TypeError, IndexError, OSError) as err:   # one bad trajectory, not the page
      unreadable.append(f'{e.where}: {type(err).__name__}: {err}'[:300])
  counts = ', '.join([f'{k}: {v}' for k, v in found.items()] + [f'unreadable: {len(unreadable)}'] * bool(unreadable))
  problems = ('<section class="unreadable"><b>not shown (unreadable)</b><ul>'
              + ''.join(f'<li>{html.escape(u)}</li>' for u in unreadable) + '</ul></section>') if unreadable else ''
  page = ['<!doctype html>', '<html lang="en"><head><meta charset="utf-8">',
          f'<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>',
          f'<header><h1>Trajectories: {html.escape(title)}</h1><div>{html.escape(counts)}</div>{problems}',
          f'<div>{_filters(shown)} <span id="count"></span></div></header>', *cards,
          f'<script>{_SCRIPT}</script></body></html>']
  path = out / 'index.html'
  tmp = path.with_suffix('.html.tmp')
  tmp.write_text(_SURROGATE.sub('\ufffd', '\n'.join(page)), encoding='utf-8')
  tmp.replace(path)
  return path

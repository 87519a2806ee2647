"""The evaluation report: Pass@1 per benchmark and its average, then the costs the paper leaves out.

Input: the judged records of `results.jsonl` (one per run x item; fields in `runner.make_record`). Per run (a mode,
or a budget of the sweep) and per benchmark:

  items               records (every item attempted)
  engine_errors       records whose engine failed (`engine_error`: refused / dropped connection, 5xx, 429,
                      timeout, malformed reply, prompt mismatch): the item did not run; it is rolled out again on
                      the next resume
  engine_error_rate   engine_errors / items
  ran                 items - engine_errors: the items the policy answered (or failed to, on its own)
  judged              ran records with a verdict (a judge error has none; no response is wrong without a judge call)
  judge_errors        records whose judge gave no verdict after its retries (retried on the next resume)
  pass_at_1           correct / ran: Pass@1 over the items that ran (an engine error is neither right nor wrong:
                      counted in `engine_error_rate` beside it); a judge error counts as not correct (DESIGN §9),
                      its count beside; None (n/a) when nothing ran or not a single record was judged
  judge_error_rate    judge_errors / ran
  no_answer_rate      ran records without a final <response> (stop reason in `stop_reasons`)
  abstention_rate     responses that abstain ("cannot determine", "unable to tell", "I don't know", ...) / ran
  fatal_rate          ran records that ended in a fatal tool-error cascade (K consecutive execution errors)
  error_rate          ran records whose rollout failed outside the engine (`error`: a prompt over the token budget,
                      an image the processor refuses, a turn that cannot be appended)
  tool_error_rate     tool calls that were execution errors / tool calls
  image_problem_rate  records whose image(s) could not be used (missing file, remote URL, unreadable) / items
  turns, tool_calls, gen_tokens, seconds: {mean, median, p90} per item that ran
  tool_usage          {tool name: calls}, and `tool_share` {tool name: fraction of all calls}
  stop_reasons        {reason: ran records}
  engine_error_examples  up to 3 '<id>: <engine_error>'

`meta.sampling` states how the policy sampled (`sampling`: greedy, or its temperature and top-p), the first thing
to check before comparing a Pass@1 with another's.
`average_pass_at_1` is the unweighted mean of the benchmarks' Pass@1 (the paper's "Avg."), over the benchmarks
with a Pass@1 (`average_covers` names them; `average_excludes` says why each other one is left out); None when
none has one. `rejected` (report.json top level, from the runner) counts per benchmark the file entries that were
not items, by kind (`data.eval_items`: bad_json, not_an_object, no_question, no_answer, duplicate_id, ...).
`seconds` is the item's own time: the wall time of each batched generate call it took
part in, plus its own tool time. `meta.engine_usage` is the policy engine's `Engine.usage()` in this invocation
(an API model's billed prompt / completion tokens; a served model's requests, retries and errors).
"""

import collections
import json
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np

COST_FIELDS = ('turns', 'tool_calls', 'gen_tokens', 'seconds')


def _dist(values: Sequence[float]) -> dict[str, float]:
  if not values:
    return {'mean': 0.0, 'median': 0.0, 'p90': 0.0}
  a = np.asarray(values, np.float64)
  return {'mean': float(a.mean()), 'median': float(np.median(a)), 'p90': float(np.percentile(a, 90))}


def _rate(n: int, d: int) -> float:
  return float(n) / d if d else 0.0


def sampling(rollout: dict) -> str:
  """How the policy sampled, from the run's rollout settings (`temperature`, `top_p`): 'greedy (temperature 0)'
  or 'temperature 0.7, top-p 0.95'."""
  temperature, top_p = float(rollout.get('temperature') or 0.0), float(rollout.get('top_p') or 1.0)
  return 'greedy (temperature 0)' if temperature == 0 else f'temperature {temperature:g}, top-p {top_p:g}'


def summarize_records(records: Sequence[dict]) -> dict:
  """The statistics of one group of records (module docstring)."""
  n = len(records)
  ran = [r for r in records if not r.get('engine_error')]
  m = len(ran)
  judged = [r for r in ran if r.get('correct') is not None]
  correct = sum(bool(r['correct']) for r in judged)
  judge_errors = sum(r.get('judge_error') is not None for r in ran)
  tool_calls = sum(int(r.get('tool_calls', 0)) for r in ran)
  usage = collections.Counter()
  for r in ran:
    usage.update(r.get('tools') or {})
  out = {
      'items': n, 'engine_errors': n - m, 'engine_error_rate': _rate(n - m, n), 'ran': m,
      'judged': len(judged), 'correct': correct, 'judge_errors': judge_errors,
      'pass_at_1': _rate(correct, m) if judged else None, 'judge_error_rate': _rate(judge_errors, m),
      'no_answer_rate': _rate(sum(r.get('response') is None for r in ran), m),
      'abstention_rate': _rate(sum(bool(r.get('abstained')) for r in ran), m),
      'fatal_rate': _rate(sum(bool(r.get('fatal')) for r in ran), m),
      'error_rate': _rate(sum(r.get('error') is not None for r in ran), m),
      'tool_error_rate': _rate(sum(int(r.get('tool_errors', 0)) for r in ran), tool_calls),
      'image_problem_rate': _rate(sum(bool(r.get('problems')) for r in records), n),
  }
  for field in COST_FIELDS:
    out[field] = _dist([float(r.get(field, 0.0)) for r in ran])
  out['tool_usage'] = dict(sorted(usage.items()))
  out['tool_share'] = {k: _rate(v, tool_calls) for k, v in sorted(usage.items())}
  out['stop_reasons'] = dict(sorted(collections.Counter(str(r.get('stop_reason')) for r in ran).items()))
  out['engine_error_examples'] = [f"{r.get('id')}: {str(r['engine_error'])[:300]}"
                                  for r in records if r.get('engine_error')][:3]
  return out


def _excluded(s: dict) -> str:
  """Why a benchmark's stats have no Pass@1."""
  if not s['ran']:
    return f"nothing ran ({s['engine_errors']} engine errors of {s['items']} items)"
  return f"no judgement ({s['judge_errors']} judge errors of {s['ran']} items that ran)"


def summarize(records: Iterable[dict], run_order: Sequence[str] = ()) -> dict:
  """{run key: {'benchmarks': {name: stats}, 'average_pass_at_1', 'all': stats, 'mode', 'max_tool_calls'}}."""
  by_run: dict[str, list[dict]] = collections.defaultdict(list)
  for r in records:
    by_run[r['run']].append(r)
  order = [k for k in run_order if k in by_run] + sorted(k for k in by_run if k not in run_order)
  out = {}
  for key in order:
    rows = by_run[key]
    by_bench: dict[str, list[dict]] = collections.defaultdict(list)
    for r in rows:
      by_bench[r['benchmark']].append(r)
    benches = {b: summarize_records(v) for b, v in sorted(by_bench.items())}
    covers = [b for b, s in benches.items() if s['pass_at_1'] is not None]
    out[key] = {'mode': rows[0].get('mode'), 'max_tool_calls': rows[0].get('max_tool_calls'),
                'benchmarks': benches,
                'average_pass_at_1': float(np.mean([benches[b]['pass_at_1'] for b in covers])) if covers else None,
                'average_covers': covers,
                'average_excludes': {b: _excluded(s) for b, s in benches.items() if s['pass_at_1'] is None},
                'all': summarize_records(rows)}
  return out


def _pct(x: float | None) -> str:
  return 'n/a' if x is None else f'{100.0 * x:.1f}'


def to_markdown(report: dict) -> str:
  """report.md: per run, a Pass@1 table (benchmarks + Avg.), a cost table, tool usage, problems."""
  lines = ['# Evaluation report', '']
  meta = report.get('meta', {})
  for k in ('policy', 'sampling', 'judge', 'judge_prompt', 'system_prompt', 'results', 'view'):
    if k in meta:
      lines.append(f'- {k}: `{meta[k]}`')
  if meta.get('judge_usage'):  # this invocation's judge calls (items judged by an earlier, resumed one not counted)
    u = meta['judge_usage']
    lines.append(f"- judge cost (this invocation): {u['requests']} requests, {u['prompt_tokens']} prompt + "
                 f"{u['completion_tokens']} completion tokens")
  u = meta.get('engine_usage') or {}
  if 'prompt_tokens' in u:  # an API model's billed tokens (this invocation)
    lines.append(f"- policy engine cost (this invocation): {u['requests']} requests, {u['prompt_tokens']} prompt + "
                 f"{u['completion_tokens']} completion tokens")
  lines += ['', 'Pass@1 = correct / items that ran. An item whose engine failed (connection, 5xx, 429, timeout, '
            'malformed reply) did not run: it is counted under engine errors, left out of Pass@1, and rolled out '
            'again on resume. A judge error counts as not correct.', '']
  for key, run in report['runs'].items():
    lines += [f"## Run `{key}` (mode {run['mode']}, max tool calls {run['max_tool_calls']})", '',
              '| benchmark | items | engine errors | ran | judged | Pass@1 (%) | judge errors | no answer | abstain | '
              'fatal | image problems |', '|---|---|---|---|---|---|---|---|---|---|---|']
    for name, s in run['benchmarks'].items():
      lines.append(f"| {name} | {s['items']} | {s['engine_errors']} ({_pct(s['engine_error_rate'])}%) | {s['ran']} | "
                   f"{s['judged']} | {_pct(s['pass_at_1'])} | {s['judge_errors']} ({_pct(s['judge_error_rate'])}%) | "
                   f"{_pct(s['no_answer_rate'])} | {_pct(s['abstention_rate'])} | {_pct(s['fatal_rate'])} | "
                   f"{_pct(s['image_problem_rate'])} |")
    covers = ', '.join(run['average_covers']) or 'none'
    lines += [f"| **Avg.** (over {covers}) | | | | | **{_pct(run['average_pass_at_1'])}** | | | | | |", '']
    lines += [f'Left out of the average: {name}: {why}.' for name, why in run['average_excludes'].items()]
    lines += ['', '| cost per item | mean | median | p90 |', '|---|---|---|---|']
    for field in COST_FIELDS:
      d = run['all'][field]
      lines.append(f"| {field} | {d['mean']:.2f} | {d['median']:.2f} | {d['p90']:.2f} |")
    a = run['all']
    lines += ['', f"Engine error rate {_pct(a['engine_error_rate'])}% ({a['engine_errors']} of {a['items']} items), "
              f"tool error rate {_pct(a['tool_error_rate'])}%, error rate {_pct(a['error_rate'])}%, "
              f"stop reasons {a['stop_reasons']}.", '']
    lines += [f'Engine error: {e}' for e in a['engine_error_examples']] + [''] * bool(a['engine_error_examples'])
    if a['tool_usage']:
      lines += ['| tool | calls | share (%) |', '|---|---|---|']
      lines += [f"| {t} | {c} | {_pct(a['tool_share'][t])} |" for t, c in a['tool_usage'].items()]
      lines.append('')
  if report.get('budget_sweep'):
    lines += ['## Tool-call budget sweep', '', '| budget | mean tool calls | Pass@1 (%) |', '|---|---|---|']
    lines += [f"| {p['budget']} | {p['mean_tool_calls']:.2f} | {_pct(p['pass_at_1'])} |"
              for p in report['budget_sweep']]
    if report.get('budget_plot'):
      lines += ['', f"![budget sweep]({pathlib.Path(report['budget_plot']).name})"]
    lines.append('')
  if report.get('benchmarks_not_run'):
    lines += ['## Benchmarks not run', '']
    lines += [f'- {name}: {why}' for name, why in report['benchmarks_not_run'].items()]
    lines.append('')
  if report.get('rejected'):
    lines += ['## File entries that are not items (not run)', '']
    for name, r in report['rejected'].items():
      lines.append(f"- {name}: {r['entries']} entr(y/ies), by kind {r['by_kind']}, e.g. {r['examples'][0]}")
    lines.append('')
  if report.get('problems'):
    lines += ['## Items with unusable images', '']
    for name, p in report['problems'].items():
      lines.append(f"- {name}: {p['items']} item(s), e.g. {p['examples'][0]}")
    lines.append('')
  return '\n'.join(lines)


def write(report: dict, workdir: str | pathlib.Path) -> pathlib.Path:
  """Writes `<workdir>/report.json` and `<workdir>/report.md`; returns the JSON path."""
  workdir = pathlib.Path(workdir)
  path = workdir / 'report.json'
  path.write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str))
  (workdir / 'report.md').write_text(to_markdown(report))
  return path

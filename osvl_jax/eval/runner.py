"""The evaluation runner (DESIGN.md §9): benchmarks -> the one agent loop -> judged records -> report.

Runs (`plan_runs`): one per mode in `config.modes`, plus `budget_<b>` per tool-call budget in `config.budgets`:
  agentic   `rollout.agent_loop.run_episodes` with the tools, max_turns = max_tool_calls + 1
  degrade   as agentic, on a degraded copy of each image (`eval.degrade`, kind by a hash of the item id)
  direct    no tools offered (one turn; a tool call anyway gets `unknown_tool`), prompt `agent_direct_v1`
  rag       `text_search` results for the question appended to the user turn, then one turn, `agent_rag_v1`

Resumable per item (`eval.results`): every judged item is appended at once to `<workdir>/results.jsonl` under the
key (run, benchmark, item content hash), with the fingerprint of the settings that produced it
(`<workdir>/eval_settings.json`; a rerun with other settings is refused, naming them). A rerun skips the items
stored, so a killed run resumes without judging an item twice (a torn last line is ignored and its item redone);
an item whose judge failed is judged again (its stored response, no new rollout); an item whose engine failed
(`engine_failure`: refused connection, 5xx, 429, timeout, malformed reply, prompt mismatch) is rolled out again.
Items are rolled out `batch_size` at a time. The config's names are checked (`eval.runs.check_config`) before anything is built.

A benchmark whose file is missing is listed under `benchmarks_not_run`; a file entry that is not an item (bad
line, not an object, no question, no gold answer, repeated id or content) is counted under `rejected`; an item
whose image cannot be used is run without it and its `problems` are recorded (and counted), never dropped.
"""

import collections
import json
import pathlib
import re
import time
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np
import tqdm
from absl import logging

from osvl_jax import trajectory as traj_lib
from osvl_jax import view as view_lib
from osvl_jax.data import benchmarks as bench_lib
from osvl_jax.eval import degrade as degrade_lib
from osvl_jax.eval import plots, policy as policy_lib, report as report_lib, results as results_lib
from osvl_jax.eval import runs as runs_lib
from osvl_jax.judges import base as judges_base
from osvl_jax.judges import registry as judges_registry
from osvl_jax.rollout import agent_loop, factory
from osvl_jax.rollout.remote import sglang_protocol
from tools import base as tools_base

_ABSTAIN_RE = re.compile(
    r"\b(can ?not|can't|unable to|could not|couldn't|impossible to)\s+(be\s+)?"
    r"(determine|determined|tell|answer|identify|identified|say|know)\b|\bi\s+(do not|don't)\s+know\b"
    r'|\bnot enough (information|evidence)\b|\binsufficient (information|evidence)\b', re.IGNORECASE)


def _tool_label(step) -> str:
  """The tool-usage key of a call step: its tool name, or `unknown_tool` for a name no tool has (the policy's own
  text, which may hold anything, stays out of the report's tables)."""
  if step.result is not None and step.result.error_kind == 'unknown_tool':
    return 'unknown_tool'
  return str(step.action.name)


def engine_failure(traj) -> str | None:
  """Why the engine failed an item's rollout, or None: the error string of a rollout that raised, or the
  `Trajectory.error` of one the agent loop ended on an engine failure (its documented 'engine <class> failed at
  step <l>: ...': a refused / dropped connection, 5xx, 429, timeout, malformed reply, prompt mismatch)."""
  if isinstance(traj, str):
    return traj
  if traj.stop_reason == 'error' and (traj.error or '').startswith('engine '):
    return traj.error
  return None


def is_abstention(response: str | None) -> bool:
  """True for a final answer that declines to answer ('cannot determine', 'unable to tell', "I don't know")."""
  return bool(response) and _ABSTAIN_RE.search(response) is not None


def _server_pixels(engine, image: dict) -> dict:
  """The pixel budget the SGLang-API servers report (`/server_info` `image_processor`, as `osvl_jax.serve` does),
  else `image` (the config's: a server that does not report it, e.g. SGLang). The client must size each image as
  the server does, or the server's prompt differs from ours and every turn with an image fails (prompt_mismatch)."""
  try:
    reported = engine.server_info().get('image_processor') or {}
  except sglang_protocol.EngineError as e:
    logging.warning('eval: %s does not report its pixel budget (%s); using config.image %s', engine.urls[0], e, image)
    return image
  if not {'min_pixels', 'max_pixels'} <= set(reported):
    return image
  served = {k: int(reported[k]) for k in ('min_pixels', 'max_pixels')}
  if served != image:
    logging.warning('eval: the servers size images with %s, not config.image %s: using theirs', served, image)
  return served


class _NoTools:
  """The environment of the no-tool modes: any call is an `unknown_tool` error (no tools were offered)."""

  def call(self, name, arguments, images=()):
    del arguments, images
    return tools_base.error('unknown_tool', f'No tools are available in this mode (called {name!r}). '
                            'Answer with <response>...</response>.')


# ----------------------------------------------------------------------------------------------------------------
# The evaluator
# ----------------------------------------------------------------------------------------------------------------

class Evaluator:
  """Runs the planned runs over the benchmarks, appending judged records; `evaluate()` returns the report.

  Args:
    config: the eval config (`configs/eval.py`).
    workdir: output folder (results.jsonl, report.json, report.md, budget_sweep.*).
    engine: the policy engine; None = `rollout.factory.make_engine(config.rollout)`: the embedded `JaxSampler` on
      `eval.policy.build(config)` (on the rollout mesh of `rollout.mesh`, the weights read into its layout), or the
      served model of `rollout.engine` 'sglang' / 'openai'.
    judge: accuracy judge; None = `judges.registry.get_judge(config.judge)`.
    env: tool environment; None = `tools.env.ToolEnv(config.tools)`.
    tokenizer: None = `trajectory.load_tokenizer()`.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | pathlib.Path, engine=None,
               judge: judges_base.Judge | None = None, env=None, tokenizer=None):
    self.config = config
    self.runs, self.benchmarks = runs_lib.check_config(config, check_judge=judge is None)  # before anything is built
    self.workdir = pathlib.Path(workdir)
    self.judge = judge or judges_registry.get_judge(config.get('judge'))
    self.tokenizer = tokenizer or traj_lib.load_tokenizer()
    self.image = {'min_pixels': int(config.image.min_pixels), 'max_pixels': int(config.image.max_pixels)}
    served = factory.engine_name(config.rollout) != 'embedded'
    if engine is None and not served:
      policy = policy_lib.policy_identity(config)
      engine_id = {'class': 'osvl_jax.rollout.embedded.jax_sampler.JaxSampler'}
    elif engine is None:   # the policy is whatever the endpoint serves: named by where it is and what it reports
      engine = factory.make_engine(config.rollout, self.tokenizer, seed=config.seed)
      policy = {'served': factory.engine_name(config.rollout),
                **{k: config.rollout.get(k) for k in ('urls', 'base_url', 'model') if config.rollout.get(k)},
                'reports': engine.served_model()}
      engine_id = {'class': policy['served']}
      if policy['served'] == 'sglang':
        self.image = _server_pixels(engine, self.image)
    else:
      policy, engine_id = {'given_engine': True}, results_lib.engine_identity(engine)
    self.system_prompt, self.system_text = policy_lib.system_prompt(config)   # (name, text)
    # {field: (name, text)}: the texts fingerprinted are the texts rolled out.
    self.prompts = {'system_prompt': (self.system_prompt, self.system_text),
                    **{k: (config[k], traj_lib.system_prompt_text(config[k])) for k in ('direct_prompt', 'rag_prompt')}}
    self.settings = results_lib.run_settings(config, policy, engine_id, self.judge.describe(), self.prompts,
                                             self.image)
    self.fingerprint = results_lib.check_resume(self.workdir, self.settings)  # refuses other settings
    self.store = results_lib.ResultStore(self.workdir / results_lib.RESULTS_FILE, self.fingerprint)
    self.processor = traj_lib.ImageProcessor(**self.image)
    if env is None:
      from tools import env as tools_env  # pylint: disable=g-import-not-at-top
      env = tools_env.ToolEnv(config.get('tools'))
    self.env = env
    self.policy_name = 'given engine'
    if served and 'reports' in policy:
      self.policy_name = ', '.join(f'{k}={v}' for k, v in policy.items() if k != 'reports')
    elif engine is None:   # the fingerprinted step, read into the rollout layout (`rollout.mesh`) when there is one
      mesh = factory.rollout_mesh(config.rollout, policy_lib.shape(config, step=policy.get('step')))
      model, self.policy_name = policy_lib.build(config, step=policy.get('step'), mesh=mesh)
      engine = factory.make_engine(config.rollout, self.tokenizer, model=model, processor=self.processor,
                                   seed=config.seed, mesh=mesh)
    self.engine = engine
    self.rejected: dict[str, list[bench_lib.Rejected]] = {}
    self.rejudged = 0

  # -- items -----------------------------------------------------------------------------------------------------
  def load_items(self) -> tuple[dict[str, list[bench_lib.EvalItem]], dict[str, str]]:
    """({benchmark: items}, {benchmark: why it is not run})."""
    loaded, not_run = {}, {}
    files = dict(self.config.get('benchmark_files') or {})
    roots = dict(self.config.get('image_roots') or {})
    settings = policy_lib.train_settings(self.config.get('train_data') or '')
    limit = int(self.config.max_items_per_benchmark or 0)
    self.trained_on, self.rejected = {}, {}
    for name in self.benchmarks:
      rejected: list[bench_lib.Rejected] = []
      try:
        items = bench_lib.load_benchmark(name, files=files.get(name), image_root=roots.get(name) or None,
                                         data_dir=self.config.get('data_dir') or None, rejected=rejected)
      except (FileNotFoundError, ValueError) as e:  # a missing file; one that is not UTF-8
        not_run[name] = f'{type(e).__name__}: {e}'
        continue
      if rejected:
        self.rejected[name] = rejected
      items, left_out = bench_lib.held_out_items(name, items, settings)
      if left_out:
        self.trained_on[name] = left_out
      items = items[:limit] if limit > 0 else items
      if items:
        loaded[name] = items
      else:
        not_run[name] = 'no items'
    return loaded, not_run

  def _prepare(self, run: runs_lib.Run, item: bench_lib.EvalItem) -> tuple[dict, dict]:
    """(agent_loop item mapping, info: problems, degrade kind, rag status) of one item in one run."""
    images, problems = bench_lib.load_images(item)
    problems = list(item.problems) + problems
    info: dict[str, Any] = {'problems': problems, 'images_used': len(images)}
    question = item.question
    if run.mode == 'degrade' and images:
      kind = degrade_lib.kind_for(item.id, tuple(self.config.degrade_kinds))
      images = [degrade_lib.degrade(im, kind) for im in images]
      info['degrade'] = kind
    if run.mode == 'rag':
      result = self.env.call('text_search', {'query': item.question, 'top_k': int(self.config.rag_top_k)}, [])
      info['rag_status'] = 'ok' if result.ok and not result.error_kind else str(result.error_kind)
      info['rag_seconds'] = float(result.seconds)
      question = f'{item.question}\n\nSearch results for the question:\n{result.text}'
    image = None if not images else images[0] if len(images) == 1 else images
    return {'prompt_id': f'{item.benchmark}/{item.id}', 'question': question, 'image': image,
            'answers': list(item.answers)}, info

  # -- rollouts ----------------------------------------------------------------------------------------------------
  def _rollout(self, run: runs_lib.Run, prepared: Sequence[dict]) -> list:
    r = self.config.rollout
    tools = run.mode in ('agentic', 'degrade')
    system = self.prompts['system_prompt' if tools else 'direct_prompt' if run.mode == 'direct' else 'rag_prompt'][1]
    make_builder = factory.make_builder(self.tokenizer, self.processor, self.env if tools else None, system)
    limits = agent_loop.Limits.from_config(r, max_turns=run.max_tool_calls + 1 if tools else 1)
    return agent_loop.run_episodes(self.engine, self.env if tools else _NoTools(), make_builder, prepared,
                                   num_generations=1, limits=limits)

  def _rollout_each(self, run: runs_lib.Run, prepared: Sequence[dict]) -> list:
    """Trajectories (or the error string of an item whose rollout failed), batched, one by one on failure."""
    try:
      return list(self._rollout(run, prepared))
    except Exception:  # pylint: disable=broad-except  (retried item by item, so one bad item fails alone)
      if len(prepared) == 1:
        raise
    out = []
    for p in prepared:
      try:
        out.append(self._rollout(run, [p])[0])
      except Exception as e:  # pylint: disable=broad-except
        out.append(f'{type(e).__name__}: {str(e)[:300]}')
    return out

  # -- judging -----------------------------------------------------------------------------------------------------
  def _judge(self, item: bench_lib.EvalItem, response: str | None) -> tuple[bool | None, str | None, float]:
    """(correct or None on a judge error, judge error, the judge's score) of one response."""
    if response is None or not response.strip():
      return False, None, 0.0  # no answer: wrong by construction, no judge call (DESIGN §6)
    verdict = self.judge.accuracy(item.question, response, item.answers, hints=item.metadata)
    if verdict.error is not None:
      return None, verdict.error, float(verdict.score)
    return bool(verdict.score >= 0.5), None, float(verdict.score)

  def make_record(self, run: runs_lib.Run, item: bench_lib.EvalItem, info: dict, traj) -> dict:
    """The judged record of one item (fields listed in `eval.report`).

    An engine failure (`engine_failure`) is its own outcome: `engine_error` says why, `correct` is None, nothing
    is judged, and the item is rolled out again on resume. Another rollout error (a prompt that cannot be
    rendered, a turn that cannot be appended) is the policy's item that ran: `error` says why, judged as it ended.
    """
    record = {'run': run.key, 'mode': run.mode, 'max_tool_calls': run.max_tool_calls,
              'benchmark': item.benchmark, 'id': str(item.id), 'item_key': bench_lib.item_key(item),
              'fingerprint': self.fingerprint, 'answers': list(item.answers)[:10], **info, 'error': None,
              'engine_error': engine_failure(traj)}
    if isinstance(traj, str):  # the rollout itself raised
      record.update(response=None, correct=None, judge_error=None, judge_score=0.0, abstained=False, turns=0,
                    tool_calls=0, tools={}, tool_errors=0, gen_tokens=0, seconds=0.0, fatal=False,
                    stop_reason='error')
      return record
    calls = [s for s in traj.steps if s.action.kind == 'tool_call']
    response = traj.final_response
    if record['engine_error']:
      correct, judge_error, score = None, None, 0.0
    else:
      correct, judge_error, score = self._judge(item, response)
      record['error'] = traj.error if traj.stop_reason == 'error' else None
    record.update(
        response=response, correct=correct, judge_error=judge_error,
        judge_score=score, abstained=is_abstention(response), turns=len(traj.steps), tool_calls=len(calls),
        tools=dict(collections.Counter(_tool_label(s) for s in calls)),
        tool_errors=sum(s.is_execution_error for s in calls),
        malformed_steps=sum(s.action.kind not in ('tool_call', 'response') for s in traj.steps),
        gen_tokens=int(np.asarray(traj.gen_mask).sum()),
        seconds=float(sum(s.seconds + (s.result.seconds if s.result is not None else 0.0) for s in traj.steps)
                      + info.get('rag_seconds', 0.0)),
        fatal=traj.fatal_step is not None, stop_reason=traj.stop_reason)
    return record

  def rejudge(self, record: dict, item: bench_lib.EvalItem) -> dict:
    """`record` (a judge error) judged again on its stored response; the rollout fields are kept."""
    correct, judge_error, score = self._judge(item, record.get('response'))
    return {**record, 'correct': correct, 'judge_error': judge_error, 'judge_score': score}

  # -- the whole evaluation ------------------------------------------------------------------------------------------
  def evaluate(self) -> dict:
    """Runs every planned run over every loaded benchmark (skipping stored items, judging again the items whose
    judge failed); writes and returns the report."""
    loaded, not_run = self.load_items()
    keyed = [(name, bench_lib.item_key(item), item) for name, items in loaded.items() for item in items]
    self.rejudged = 0
    for run in self.runs:
      for name, key, item in keyed:
        stored = self.store.get(run.key, name, key)
        if stored is not None and stored.get('judge_error') is not None:
          self.store.append(self.rejudge(stored, item))
          self.rejudged += 1
    todo = [(run, name, item) for run in self.runs for name, key, item in keyed  # new, or its engine failed
            if (self.store.get(run.key, name, key) or {'engine_error': True}).get('engine_error')]
    bar = tqdm.tqdm(total=len(todo), desc='eval', unit='item', disable=not self.config.get('progress', True))
    batch = max(1, int(self.config.batch_size))
    for run in self.runs:
      for name in loaded:
        pending = [it for r, n, it in todo if r == run and n == name]
        for start in range(0, len(pending), batch):
          chunk = pending[start:start + batch]
          prepared = [self._prepare(run, it) for it in chunk]
          trajs = self._rollout_each(run, [p for p, _ in prepared])
          for item, (_, info), traj in zip(chunk, prepared, trajs):
            record = self.make_record(run, item, info, traj)
            self.store.append(record)
            if not isinstance(traj, str):
              results_lib.append_trajectory(self.workdir, self.store.key(record), traj)
            bar.update(1)
    bar.close()
    return self.write_report(self.runs, loaded, not_run)

  def _rejected_summary(self) -> dict:
    """{benchmark: {'entries', 'by_kind': {kind: n}, 'examples': ['<where> (<kind>): <detail>', ...]}}."""
    out = {}
    for name, entries in self.rejected.items():
      out[name] = {'entries': len(entries), 'by_kind': dict(collections.Counter(e.kind for e in entries)),
                   'examples': [f'{e.where} ({e.kind}): {e.detail}' for e in entries[:3]]}
    return out

  def write_report(self, runs: Sequence[runs_lib.Run], loaded: dict, not_run: dict) -> dict:
    """Summarises the stored records of `runs` x the `loaded` items; writes report.json / .md (+ the sweep)."""
    keys = {run.key for run in runs}
    wanted = {(n, bench_lib.item_key(it)) for n, items in loaded.items() for it in items}
    records = [r for r in self.store.records if r['run'] in keys and (r['benchmark'], r['item_key']) in wanted]
    problems: dict[str, dict] = {}  # per benchmark: items whose image(s) could not be used (adapter or decode)
    seen = set()
    for r in records:
      if r.get('problems') and (r['benchmark'], r['item_key']) not in seen:
        seen.add((r['benchmark'], r['item_key']))
        p = problems.setdefault(r['benchmark'], {'items': 0, 'examples': []})
        p['items'] += 1
        if len(p['examples']) < 3:
          p['examples'].append(f"{r['id']}: {r['problems'][0]}")
    rep = {
        'meta': {'policy': self.policy_name, 'sampling': report_lib.sampling(self.settings['rollout']),
                 'judge': self.judge.name, 'engine_usage': self.engine.usage(),
                 'judge_prompt': self.settings['judge']['prompt_names'].get('accuracy',
                                                                            f'{self.judge.name} (no prompt)'),
                 'judge_identity': self.settings['judge'],
                 'system_prompt': self.system_prompt, 'results': str(self.store.path),
                 'fingerprint': self.fingerprint, 'settings': str(self.workdir / results_lib.SETTINGS_FILE),
                 'torn_result_lines': self.store.torn_lines, 'judge_errors_rejudged': self.rejudged,
                 'judge_usage': self.judge.usage(),
                 'time': time.strftime('%Y-%m-%d %H:%M:%S')},
        'runs': report_lib.summarize(records, [run.key for run in runs]),
        'benchmarks_not_run': not_run, 'rejected': self._rejected_summary(), 'problems': problems,
        'left_out_as_trained_on': dict(getattr(self, 'trained_on', {})),
        'benchmarks': sorted(loaded), 'items': len(wanted)}
    sweep = [{'budget': run.max_tool_calls, 'mean_tool_calls': rep['runs'][run.key]['all']['tool_calls']['mean'],
              'pass_at_1': rep['runs'][run.key]['average_pass_at_1']}
             for run in runs if run.key.startswith('budget_') and run.key in rep['runs']]
    if sweep:
      rep['budget_sweep'] = sweep
      (self.workdir / 'budget_sweep.json').write_text(json.dumps(sweep, indent=1))
      plotted = [pt for pt in sweep if pt['pass_at_1'] is not None]  # a budget without a judgement: n/a
      if plotted:
        rep['budget_plot'] = str(plots.plot_budget_sweep(plotted, self.workdir / 'budget_sweep.png'))
    if self.config.get('view', True):  # the trajectories of this workdir as a static page (osvl_jax.view)
      rep['meta']['view'] = str(view_lib.view(self.workdir, self.workdir / 'view')[0])
    rep['report'] = str(report_lib.write(rep, self.workdir))
    return rep


def evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, **kwargs) -> dict:
  """`Evaluator(config, workdir, **kwargs).evaluate()`: the report dict (also in <workdir>/report.json)."""
  return Evaluator(config, workdir, **kwargs).evaluate()

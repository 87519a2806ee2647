"""The results store of an eval workdir, and the settings (fingerprint) its results were produced with.

`<workdir>/eval_settings.json` records what decides a result (`run_settings`): the policy (`eval.policy`
identity: checkpoint path, step, metadata hash, modification time; a served model: its URL and what the endpoint
reports of its model, `served_model()`, so another model behind the same URL is another policy), the engine, the
seed, the sampling and rollout settings (not the request timeout, retries and concurrency), the agent prompts
(name and text hash), the judge (its `describe()`: name, model, endpoint, prompts), the tools and tool budgets,
the image sizes. A rerun in the same workdir with other settings is refused, naming each differing field, as a
pipeline build is (`data_pipeline/build.py`, build_config.json): one workdir holds one evaluation, and a result
is never reported for settings that did not produce it. Settings that only choose *which* results are wanted
(modes, budgets, benchmarks, item limit, batch size) are not recorded: adding a mode or a benchmark to a workdir
extends it.

`<workdir>/results.jsonl`: one judged record per line, keyed by (run, benchmark, item_key) where `item_key` is the
item's content hash (`data.eval_items.item_key`), never its line number; every record carries the settings'
`fingerprint`. Append-only, flushed and fsynced per record; a torn last line is ignored (its item is redone). A
record whose judge failed (`judge_error`) is not final: the next run judges it again and appends the new record,
which replaces it (the later line wins); nor is one whose engine failed (`engine_error`): the next run rolls it
out again.

`<workdir>/trajectories.jsonl`: the trajectory of each new record, one line `{"run", "benchmark", "item_key",
"trajectory": Trajectory.to_json}` (`append_trajectory`), for `python -m osvl_jax.view`; never read to resume.
The file names, the record key and the readers live in `osvl_jax.data.eval_results` (the viewer reads them there).
"""

import hashlib
import json
import os
import pathlib
from typing import Any

import ml_collections

from osvl_jax.data.eval_results import (  # noqa: F401  (read_trajectories: re-exported)
    RESULTS_FILE, TRAJECTORIES_FILE, read_trajectories, record_key)

SETTINGS_FILE = 'eval_settings.json'

class SettingsMismatch(ValueError):
  """A workdir holds results produced with other settings (or with unknown ones)."""


def _qualname(obj: Any) -> str:
  return f'{type(obj).__module__}.{type(obj).__qualname__}'


def engine_identity(engine: Any) -> dict:
  """{'class', and the engine's `base_url` / `model` / `urls` when it has them as plain values}."""
  out = {'class': _qualname(engine)}
  for attr in ('base_url', 'model', 'urls'):
    value = getattr(engine, attr, None)
    if isinstance(value, (str, list, tuple)):
      out[attr] = list(value) if isinstance(value, tuple) else value
  return out


# Rollout fields that decide how long a request may take and how often it is tried, not what a result is.
OPERATIONAL_ROLLOUT_FIELDS = ('timeout_s', 'retries', 'max_concurrency')


def run_settings(config: ml_collections.ConfigDict, policy: dict, engine: dict, judge: dict,
                 prompts: dict[str, tuple[str, str]], image: dict | None = None) -> dict:
  """The settings that decide an eval result, as JSON values (module docstring); the rollout section without
  `OPERATIONAL_ROLLOUT_FIELDS`.

  Args:
    config: the eval config.
    policy: `eval.policy.policy_identity(config)` (or what describes a given engine's policy).
    engine: `engine_identity(engine)`.
    judge: the judge's `describe()` (`judges.base.Judge.describe`: name, class, prompts, verdict settings).
    prompts: {config field: (prompt name, prompt text)} of the agent prompts (system_prompt as resolved:
      'checkpoint:<name>' for a checkpoint's own, direct_prompt, rag_prompt).
    image: the pixel budget images are sized with ({'min_pixels', 'max_pixels'}; None: `config.image`).
  """
  settings = {
      'policy': policy, 'engine': engine, 'judge': judge, 'seed': int(config.seed),
      'rollout': {k: v for k, v in config.rollout.to_dict().items() if k not in OPERATIONAL_ROLLOUT_FIELDS},
      'image': config.image.to_dict() if image is None else dict(image),
      'tools': config.get('tools').to_dict() if config.get('tools') is not None else {},
      'max_tool_calls': int(config.max_tool_calls), 'rag_top_k': int(config.rag_top_k),
      'degrade_kinds': list(config.degrade_kinds),
      'prompts': {k: {'name': name, 'sha256': hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}
                  for k, (name, text) in sorted(prompts.items())},
  }
  return json.loads(json.dumps(settings, sort_keys=True, default=str))


def fingerprint(settings: dict) -> str:
  """sha256 (hex, 16 chars) of the settings' canonical JSON."""
  return hashlib.sha256(json.dumps(settings, sort_keys=True).encode('utf-8')).hexdigest()[:16]


def _flat(d: Any, prefix: str = '') -> dict[str, Any]:
  if not isinstance(d, dict):
    return {prefix: d}
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f'{prefix}.{k}' if prefix else str(k)))
  return out


def check_resume(workdir: str | pathlib.Path, settings: dict) -> str:
  """Records `settings` in a new workdir, or checks that the workdir's recorded ones are the same.

  Returns:
    The fingerprint of `settings`.
  Raises:
    SettingsMismatch: the workdir's eval_settings.json differs (naming each field: recorded vs asked), or the
      workdir holds results.jsonl but no eval_settings.json (results whose settings are unknown).
  """
  workdir = pathlib.Path(workdir)
  path = workdir / SETTINGS_FILE
  if path.is_file():
    recorded, asked = _flat(json.loads(path.read_text())), _flat(settings)
    diff = [k for k in sorted(set(recorded) | set(asked)) if recorded.get(k) != asked.get(k)]
    if diff:
      named = '; '.join(f'{k}: recorded {recorded.get(k)!r}, asked {asked.get(k)!r}' for k in diff[:12])
      more = f' (and {len(diff) - 12} more)' if len(diff) > 12 else ''
      raise SettingsMismatch(f'{workdir} holds eval results produced with other settings ({named}{more}); use '
                             'another --workdir, or delete this one to start again')
    return fingerprint(settings)
  if (workdir / RESULTS_FILE).is_file() and (workdir / RESULTS_FILE).stat().st_size > 0:
    raise SettingsMismatch(f'{workdir} holds {RESULTS_FILE} without {SETTINGS_FILE} (results whose settings '
                           'are unknown); use another --workdir, or delete this one to start again')
  workdir.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(settings, indent=1, sort_keys=True))
  return fingerprint(settings)


class ResultStore:
  """Append-only judged records, keyed by (run, benchmark, item_key), of one fingerprint.

  Args:
    path: the results.jsonl file (created on the first append).
    fingerprint: the settings' fingerprint every record must carry.
  Attributes:
    torn_lines: lines that were not JSON records (a write cut by a kill); ignored, their items are redone.
  Raises:
    SettingsMismatch: a record of another fingerprint (a file from another evaluation), naming its line.
  """

  def __init__(self, path: str | pathlib.Path, fingerprint: str):  # pylint: disable=redefined-outer-name
    self.path = pathlib.Path(path)
    self.fingerprint = fingerprint
    self.torn_lines = 0
    self._records: dict[tuple[str, str, str], dict] = {}
    if not self.path.is_file():
      return
    for line_no, line in enumerate(self.path.read_text(encoding='utf-8').splitlines(), 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        key = self.key(record)
      except (json.JSONDecodeError, KeyError, TypeError):
        self.torn_lines += 1
        continue
      if record.get('fingerprint') != fingerprint:
        raise SettingsMismatch(f'{self.path}:{line_no}: a record of settings {record.get("fingerprint")!r}, '
                               f'not {fingerprint!r} (results of another evaluation)')
      self._records[key] = record  # a later line (a re-judged record) replaces an earlier one

  key = staticmethod(record_key)

  @property
  def records(self) -> list[dict]:
    """The current record of every key, in order of first appearance."""
    return list(self._records.values())

  def get(self, run: str, benchmark: str, item_key: str) -> dict | None:
    """The stored record of an item in a run, or None."""
    return self._records.get((run, benchmark, item_key))

  def done(self, run: str, benchmark: str, item_key: str) -> bool:
    """True when the item has a final record in the run (stored, neither a judge error nor an engine error)."""
    record = self.get(run, benchmark, item_key)
    return record is not None and record.get('judge_error') is None and not record.get('engine_error')

  def append(self, record: dict) -> None:
    """Appends one record (one line), flushed and fsynced before returning; it replaces a judge-error or
    engine-error record.

    Raises:
      ValueError: the key already has a final record (an item is never judged twice), or the record carries
        another fingerprint.
    """
    key = self.key(record)
    if self.done(*key):
      raise ValueError(f'result {key} is already in {self.path}')
    if record.get('fingerprint') != self.fingerprint:
      raise ValueError(f'record fingerprint {record.get("fingerprint")!r} is not the store\'s {self.fingerprint!r}')
    self.path.parent.mkdir(parents=True, exist_ok=True)
    needs_newline = self.path.is_file() and self.path.stat().st_size > 0 and not self._ends_with_newline()
    with self.path.open('a', encoding='utf-8') as f:
      f.write(('\n' if needs_newline else '') + json.dumps(record, ensure_ascii=False, default=str) + '\n')
      f.flush()
      os.fsync(f.fileno())
    self._records[key] = record

  def _ends_with_newline(self) -> bool:
    with self.path.open('rb') as f:
      f.seek(-1, os.SEEK_END)
      return f.read(1) == b'\n'


def append_trajectory(workdir: str | pathlib.Path, key: tuple[str, str, str], traj) -> None:
  """Appends `traj` (a `Trajectory`) under its record's key (run, benchmark, item_key) to
  `<workdir>/trajectories.jsonl`, flushed; a torn last line is skipped by `read_trajectories`."""
  path = pathlib.Path(workdir) / TRAJECTORIES_FILE
  head = json.dumps({'run': key[0], 'benchmark': key[1], 'item_key': key[2]}, ensure_ascii=False)[:-1]
  torn = path.is_file() and path.stat().st_size > 0 and not _ends_with_newline(path)  # a killed run's last line
  with path.open('a', encoding='utf-8') as f:
    f.write(('\n' if torn else '') + f'{head}, "trajectory": {traj.to_json()}}}\n')
    f.flush()


def _ends_with_newline(path: pathlib.Path) -> bool:
  with path.open('rb') as f:
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b'\n'

"""The runs of an eval config, checked before anything is built (no model, no engine, no judge object).

`config.modes`, `config.benchmarks` and `config.budgets` each accept a tuple or a comma-separated string, and
any mix (`--config.modes=agentic,direct` arrives as the 1-tuple `('agentic,direct',)`, `--config.budgets=2,4` as
`(2, 4)`, `--config.modes="('agentic','direct')"` as a tuple): `as_list` reads them all the same way.
"""

import dataclasses
from typing import Any

import ml_collections

from osvl_jax.data import benchmarks as bench_lib
from osvl_jax.judges import registry as judges_registry
from osvl_jax.rollout import factory

MODES = ('agentic', 'direct', 'rag', 'degrade')


@dataclasses.dataclass(frozen=True)
class Run:
  """One evaluation run: a mode at a tool-call budget; `key` names it in results.jsonl and the report."""
  key: str
  mode: str
  max_tool_calls: int


def as_list(value: Any, field: str) -> list[str]:
  """The entries of a list-valued config field, as strings, in order.

  Args:
    value: None, a string ('a', 'a,b', "('a', 'b')"), a number, or a tuple / list of those.
    field: the field's name, for the error.
  Returns:
    The entries, each stripped of spaces, brackets and quotes; empty ones dropped.
  Raises:
    ValueError: an entry listed twice (naming `field`).
  """
  if value is None:
    return []
  parts = [value] if isinstance(value, (str, int, float)) else list(value)
  out = []
  for part in parts:
    for entry in str(part).split(','):
      entry = entry.strip().strip('()[]').strip().strip('\'"').strip()
      if not entry:
        continue
      if entry in out:
        raise ValueError(f'config.{field}: {entry!r} is listed twice in {value!r}')
      out.append(entry)
  return out


def benchmark_names(config: ml_collections.ConfigDict) -> list[str]:
  """`config.benchmarks` as a list of known benchmark names.

  Raises:
    ValueError: no benchmark, or a name that is not a `benchmarks.BENCHMARKS` key (the message lists the known
      names).
  """
  names = as_list(config.get('benchmarks'), 'benchmarks')
  if not names:
    raise ValueError(f'config.benchmarks is empty: name some of {sorted(bench_lib.BENCHMARKS)}')
  unknown = [n for n in names if n not in bench_lib.BENCHMARKS]
  if unknown:
    raise ValueError(f'config.benchmarks: unknown benchmark(s) {unknown}; known: {sorted(bench_lib.BENCHMARKS)}')
  return names


def plan_runs(config: ml_collections.ConfigDict) -> list[Run]:
  """The runs of a config: one per `modes` entry, then `budget_<b>` (agentic) per `budgets` entry.

  Raises:
    ValueError: an unknown mode (listing the known ones), a budget that is not an integer >= 1, or no run.
  """
  runs = []
  for mode in as_list(config.get('modes'), 'modes'):
    if mode not in MODES:
      raise ValueError(f'config.modes: eval mode {mode!r} is not one of {MODES}')
    calls = int(config.max_tool_calls) if mode in ('agentic', 'degrade') else 0
    runs.append(Run(mode, mode, calls))
  for b in as_list(config.get('budgets'), 'budgets'):
    try:
      budget = int(b)
    except ValueError:
      raise ValueError(f'config.budgets: tool-call budget {b!r} is not an integer') from None
    if budget < 1:
      raise ValueError(f'config.budgets: tool-call budget {budget} must be >= 1')
    runs.append(Run(f'budget_{budget}', 'agentic', budget))
  if not runs:
    raise ValueError(f'nothing to run: config.modes and config.budgets are both empty (modes: {MODES})')
  return runs


def check_config(config: ml_collections.ConfigDict, check_judge: bool = True) -> tuple[list[Run], list[str]]:
  """(runs, benchmark names) of an eval config; call it before building anything.

  Args:
    config: the eval config.
    check_judge: also check `config.judge` (`judges.registry.check_config`; False when the caller brings its own
      judge object).
  Raises:
    ValueError: from `plan_runs`, `benchmark_names` or the judge check (an llm judge without judge.base_url /
      judge.model, naming them); a bad engine field (`rollout.factory.check_engine_config`: an unknown engine,
      'sglang' without urls, 'openai' without base_url / model, prefix_cache_slots not an int >= 0, ...).
  """
  planned, names = plan_runs(config), benchmark_names(config)
  factory.check_engine_config(config.rollout)
  if check_judge:
    judges_registry.check_config(config.get('judge'), 'judge')
  return planned, names

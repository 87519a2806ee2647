"""`lookup{key, day}`: the learning testbed's table tool (DESIGN.md §6b, "Learning testbed"; not one of the paper's
seven tools, enabled only by the lookup world's config, `configs/lookup.py`).

The table is a seeded hash of (key, day) -> value, every one a digit 0-9 (a single Qwen token, the same id in the
tool's text, the question and the model's call), so a tiny model learns to copy it. Its text:
`The value of key <k> on day <d> is <v>.` Keys and days outside 0-9 are `bad_arguments` (the `Param` bounds).
"""

import hashlib

import ml_collections

from tools import base
from tools import schema

DIGITS = 10  # keys, days and values are digits 0..9


def table_value(seed: int, key: int, day: int) -> int:
  """The table's value (a digit) of (key, day) in the world of `seed`: sha256 of 'seed/key/day', mod 10."""
  return hashlib.sha256(f'{int(seed)}/{int(key)}/{int(day)}'.encode()).digest()[0] % DIGITS


def result_text(key: int, day: int, value: int) -> str:
  return f'The value of key {key} on day {day} is {value}.'


def _make(cfg: ml_collections.ConfigDict):
  seed = int(cfg.lookup.seed)

  def body(key: int, day: int) -> base.ToolResult:
    return base.ToolResult(ok=True, text=result_text(key, day, table_value(seed, key, day)))
  return body


PARAMS = (
    schema.Param('key', 'integer', 'The key, a digit.', minimum=0, maximum=DIGITS - 1),
    schema.Param('day', 'integer', 'The day, a digit.', minimum=0, maximum=DIGITS - 1),
)
SPEC = schema.register(schema.ToolSpec(
    name='lookup', description='Look up the value a key holds on a day in the table.', params=PARAMS, make=_make))

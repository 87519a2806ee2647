"""Field checks shared by every stage's `check_config` (data, sft, grpo, the demo's eval).

Each stage checks its whole config before it writes anything, so a bad value fails in seconds with the
field's dotted path (`sft.batch_size=0: ...`) instead of deep inside a library after earlier stages ran.
Light on purpose (no jax): `data_pipeline.build` and the trainers both import it.
"""

import numbers

import ml_collections


def get(config: ml_collections.ConfigDict, path: str, default=None):
  """The value at dotted `path` ('grpo.lr') of `config`, or `default` when a section or field is missing."""
  node = config
  for key in path.split('.'):
    if node is None or not hasattr(node, 'get'):
      return default
    node = node.get(key, None)
    if node is None:
      return default
  return node


def number(config: ml_collections.ConfigDict, path: str, *, integer: bool = False, low: float | None = None,
           low_open: bool = False, high: float | None = None, high_open: bool = False,
           optional: bool = False):
  """Checks the number at `path` and returns it.

  Args:
    config: the job config (root).
    path: dotted field path, e.g. 'sft.batch_size'.
    integer: an int is required (bool is not one).
    low, high: bounds; `low_open` / `high_open` make them strict (> / <).
    optional: a missing or None field passes (returns None).
  Returns:
    The value (or None for a missing optional field).
  Raises:
    ValueError: naming `path` and the value, when the field is missing, not a (finite) number / int, or out of
      bounds.
  """
  value = get(config, path)
  if value is None:
    if optional:
      return None
    raise ValueError(f'{path} is missing; expected {"an int" if integer else "a number"}')
  kind = numbers.Integral if integer else numbers.Real
  if isinstance(value, bool) or not isinstance(value, kind) or value != value or value in (float('inf'),
                                                                                             float('-inf')):
    raise ValueError(f'{path}={value!r}: expected a finite {"int" if integer else "number"}')
  if low is not None and (value <= low if low_open else value < low):
    raise ValueError(f'{path}={value!r}: must be {">" if low_open else ">="} {low}')
  if high is not None and (value >= high if high_open else value > high):
    raise ValueError(f'{path}={value!r}: must be {"<" if high_open else "<="} {high}')
  return value


def positive_int(config: ml_collections.ConfigDict, path: str) -> int:
  """An int >= 1 at `path` (step counts, batch sizes, intervals). Raises ValueError naming `path`."""
  return number(config, path, integer=True, low=1)


def length_buckets(config: ml_collections.ConfigDict, path: str, *, empty_ok: bool, meaning: str) -> tuple[int, ...]:
  """The strictly increasing ints >= 1 at `path` (tokens per row of each compiled shape: `sft.length_buckets`,
  `grpo.length_buckets`); a missing or empty value is () when `empty_ok`. Raises ValueError naming `path`, what
  the buckets are, and (`meaning`) what an empty value would mean."""
  value = get(config, path) or ()
  if (not isinstance(value, (tuple, list)) or (not value and not empty_ok)
      or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in value)
      or list(value) != sorted(set(value))):
    raise ValueError(f'{path}={get(config, path)!r} must be increasing ints >= 1 (tokens per row; one compiled '
                     f'program per bucket){meaning}')
  return tuple(value)


def choice(config: ml_collections.ConfigDict, path: str, choices) -> object:
  """The value at `path`, which must be one of `choices`. Raises ValueError naming `path` and the choices."""
  value = get(config, path)
  if value not in tuple(choices):
    raise ValueError(f'{path}={value!r}: expected one of {tuple(choices)}')
  return value


def pixel_limits(config: ml_collections.ConfigDict, prefix: str) -> tuple[int, int]:
  """(min_pixels, max_pixels) at `<prefix>.min_pixels` / `.max_pixels`: ints >= 1, min <= max.

  Raises:
    ValueError: naming the field.
  """
  lo = positive_int(config, f'{prefix}.min_pixels')
  hi = positive_int(config, f'{prefix}.max_pixels')
  if lo > hi:
    raise ValueError(f'{prefix}.min_pixels={lo} > {prefix}.max_pixels={hi}')
  return lo, hi


def warmup_steps(config: ml_collections.ConfigDict, prefix: str) -> int:
  """`<prefix>.warmup_steps` (optional, default 0): an int in [0, `<prefix>.steps`) and returned.

  The cosine decay after the warmup needs at least one step. An explicit warmup is never shortened silently
  (it is a hyperparameter); the configs derive theirs from `steps` (a fraction, as MaxText's
  `warmup_steps_fraction`), so overriding only the steps keeps them consistent.

  Raises:
    ValueError: naming the field to change and the largest value that fits.
  """
  steps = positive_int(config, f'{prefix}.steps')
  warmup = number(config, f'{prefix}.warmup_steps', integer=True, low=0, optional=True) or 0
  if warmup >= steps:
    raise ValueError(f'{prefix}.warmup_steps={warmup} must be < {prefix}.steps={steps} (the cosine decay after the '
                     f'warmup needs >= 1 step): set --config.{prefix}.warmup_steps to at most {steps - 1} '
                     f'(e.g. 0), or raise --config.{prefix}.steps above {warmup}')
  return warmup

"""ToolResult: the only channel by which tools report (DESIGN.md §5)."""

import dataclasses

import numpy as np

# Error kinds, DESIGN.md §5. `no_result` (a search that found nothing) is NOT a tool-execution error.
ERROR_KINDS = ('malformed_call', 'unknown_tool', 'bad_arguments', 'timeout', 'http_error',
               'backend_error', 'no_result')
EXECUTION_ERROR_KINDS = frozenset(ERROR_KINDS) - {'no_result'}
# Whose fault an execution error is (config `rollout.env_errors`, `osvl_jax/rollout/limits.py`): the policy's (a call
# it wrote wrong) or the environment's (a backend that timed out, answered an HTTP error or failed), which the policy
# could not have avoided. The two partition EXECUTION_ERROR_KINDS.
POLICY_ERROR_KINDS = ('malformed_call', 'unknown_tool', 'bad_arguments')
ENVIRONMENT_ERROR_KINDS = ('timeout', 'http_error', 'backend_error')
# The search tools among the seven (DESIGN.md §5 names; the official release's `web_search` is read as text_search):
# the calls the query-quality judge rates (r_query, PAPER.md "judge and agent protocols").
SEARCH_TOOLS = ('text_search', 'image_search')


@dataclasses.dataclass
class ToolResult:
  """What one tool call returned.

  `ok` and `error_kind` always agree (checked at construction and on every later assignment of either):
  ok=True goes with error_kind None or `no_result` (a search that found nothing); ok=False goes with one of
  `EXECUTION_ERROR_KINDS`. To change both, build a new one (`dataclasses.replace(result, ok=..., error_kind=...)`).

  Attributes:
    ok: False when the call failed (any `error_kind` but `no_result`, which keeps ok=True); a bool.
    error_kind: None, or one of `ERROR_KINDS`.
    text: text shown to the model inside <tool_response>.
    images: new images the tool produced, each `uint8 [H, W, 3]` RGB; the rollout names them img_k.
    seconds: wall time of the call, seconds.

  Raises (constructor, or assigning `ok` / `error_kind`):
    ValueError: `ok` not a bool; `error_kind` not None and not in `ERROR_KINDS`; ok=False without an execution
      error kind (None or `no_result`); ok=True with an execution error kind.
  """
  ok: bool
  error_kind: str | None = None
  text: str = ''
  images: list[np.ndarray] = dataclasses.field(default_factory=list)
  seconds: float = 0.0

  def __post_init__(self):
    _check_ok_and_kind(self.ok, self.error_kind)

  def __setattr__(self, name, value):
    if name in ('ok', 'error_kind') and 'ok' in self.__dict__ and 'error_kind' in self.__dict__:
      _check_ok_and_kind(value if name == 'ok' else self.ok, value if name == 'error_kind' else self.error_kind)
    super().__setattr__(name, value)

  @property
  def is_execution_error(self) -> bool:
    """True for the errors that count towards fatal cascades and r_fmt (every kind but no_result)."""
    return self.error_kind in EXECUTION_ERROR_KINDS

  @property
  def is_environment_error(self) -> bool:
    """True for an execution error of the environment (`ENVIRONMENT_ERROR_KINDS`: timeout, http_error,
    backend_error), not of the policy's call."""
    return self.error_kind in ENVIRONMENT_ERROR_KINDS


def _check_ok_and_kind(ok, error_kind) -> None:
  """Raises ValueError unless (ok, error_kind) is one of the pairs the contract allows (see `ToolResult`)."""
  if not isinstance(ok, (bool, np.bool_)):
    raise ValueError(f'ToolResult.ok must be a bool, got {type(ok).__name__} {ok!r}')
  if error_kind is not None and error_kind not in ERROR_KINDS:
    raise ValueError(f'ToolResult.error_kind={error_kind!r} is not one of {ERROR_KINDS}')
  if not ok and error_kind not in EXECUTION_ERROR_KINDS:
    raise ValueError(f'ToolResult(ok=False) needs error_kind in {sorted(EXECUTION_ERROR_KINDS)}, got '
                     f'error_kind={error_kind!r}')
  if ok and error_kind in EXECUTION_ERROR_KINDS:
    raise ValueError(f'ToolResult(ok=True) allows error_kind None or \'no_result\' only, got '
                     f'error_kind={error_kind!r} (an execution error must have ok=False)')


def error(kind: str, text: str, seconds: float = 0.0) -> ToolResult:
  """A failed ToolResult of `kind` (ok=False except for `no_result`)."""
  return ToolResult(ok=(kind == 'no_result'), error_kind=kind, text=text, seconds=seconds)


class ToolError(Exception):
  """Raised inside a tool body for a failure of a given kind (e.g. a remote `timeout`); `ToolEnv.call` turns it
  into `error(kind, message)`. `kind` must be one of `ERROR_KINDS`."""

  def __init__(self, kind: str, message: str):
    if kind not in ERROR_KINDS:
      raise ValueError(f'ToolError kind {kind!r} is not one of {ERROR_KINDS}')
    super().__init__(message)
    self.kind = kind

"""ToolResult: the only channel by which tools report (DESIGN.md §5)."""

import dataclasses

import numpy as np

# Error kinds, DESIGN.md §5. `no_result` (a search that found nothing) is NOT a tool-execution error.
ERROR_KINDS = ('malformed_call', 'unknown_tool', 'bad_arguments', 'timeout', 'http_error',
               'backend_error', 'no_result')
EXECUTION_ERROR_KINDS = frozenset(ERROR_KINDS) - {'no_result'}


@dataclasses.dataclass
class ToolResult:
  """What one tool call returned.

  Attributes:
    ok: False when the call failed (any `error_kind` but `no_result`, which keeps ok=True).
    error_kind: None, or one of `ERROR_KINDS`.
    text: text shown to the model inside <tool_response>.
    images: new images the tool produced, each `uint8 [H, W, 3]` RGB; the rollout names them img_k.
    seconds: wall time of the call, seconds.
  """
  ok: bool
  error_kind: str | None = None
  text: str = ''
  images: list[np.ndarray] = dataclasses.field(default_factory=list)
  seconds: float = 0.0

  def __post_init__(self):
    if self.error_kind is not None and self.error_kind not in ERROR_KINDS:
      raise ValueError(f'ToolResult.error_kind={self.error_kind!r} is not one of {ERROR_KINDS}')

  @property
  def is_execution_error(self) -> bool:
    """True for the errors that count towards fatal cascades and r_fmt (every kind but no_result)."""
    return self.error_kind in EXECUTION_ERROR_KINDS


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

"""ToolResult refuses an `ok` / `error_kind` pair the contract does not allow (DESIGN.md §5): ok=False always
comes with an execution error kind, ok=True only with None or `no_result`; at construction and on assignment."""

import dataclasses

import numpy as np
import pytest

from tools import base


def test_failure_without_error_kind_is_refused_naming_the_field():
  with pytest.raises(ValueError, match='error_kind'):
    base.ToolResult(ok=False, error_kind=None)
  with pytest.raises(ValueError, match='error_kind'):
    base.ToolResult(ok=False)


def test_failure_with_no_result_is_refused():
  with pytest.raises(ValueError, match="error_kind='no_result'"):
    base.ToolResult(ok=False, error_kind='no_result')


@pytest.mark.parametrize('kind', ['Timeout', 'fatal', '', 'ok'])
def test_unknown_error_kind_is_refused(kind):
  for ok in (True, False):
    with pytest.raises(ValueError, match='error_kind'):
      base.ToolResult(ok=ok, error_kind=kind)


@pytest.mark.parametrize('kind', sorted(base.EXECUTION_ERROR_KINDS))
def test_success_with_an_execution_error_kind_is_refused(kind):
  with pytest.raises(ValueError, match=f'error_kind={kind!r}'):
    base.ToolResult(ok=True, error_kind=kind)


def test_ok_must_be_a_bool():
  for ok in (None, 0, 'False'):
    with pytest.raises(ValueError, match='ok must be a bool'):
      base.ToolResult(ok=ok, error_kind='timeout')
  assert base.ToolResult(ok=np.bool_(True)).ok


@pytest.mark.parametrize('kind', sorted(base.EXECUTION_ERROR_KINDS))
def test_allowed_pairs_and_execution_error_flag(kind):
  assert base.ToolResult(ok=False, error_kind=kind).is_execution_error
  assert base.error(kind, 'x') == base.ToolResult(ok=False, error_kind=kind, text='x')
  assert not base.ToolResult(ok=True).is_execution_error
  r = base.error('no_result', 'nothing found')
  assert (r.ok, r.error_kind, r.is_execution_error) == (True, 'no_result', False)


def test_assignment_cannot_make_the_pair_inconsistent():
  r = base.ToolResult(ok=True, text='hit')
  with pytest.raises(ValueError, match='error_kind'):
    r.ok = False
  with pytest.raises(ValueError, match='error_kind'):
    r.error_kind = 'timeout'
  with pytest.raises(ValueError, match='error_kind'):
    r.error_kind = 'nonsense'
  assert (r.ok, r.error_kind) == (True, None)  # Unchanged by the refused assignments.
  r.error_kind = 'no_result'  # Allowed with ok=True.
  r.text, r.seconds = 'changed', 1.5  # Other fields stay mutable (ToolEnv sets seconds, appends notes).
  failed = dataclasses.replace(r, ok=False, error_kind='backend_error')
  assert failed.is_execution_error and failed.text == 'changed'
  with pytest.raises(ValueError, match='error_kind'):
    dataclasses.replace(r, ok=False)

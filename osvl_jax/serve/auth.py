"""Access control of `python -m osvl_jax.serve`: the API key and the folders weights may be loaded from.

API key (`--api_key`, as SGLang's `--api-key`): every request must carry `Authorization: Bearer <key>`, else
401 `{"error": "Unauthorized"}`; as SGLang (`add_api_key_middleware`), OPTIONS requests and paths starting with
`/health` stay open (load balancers and the router probe them). Keys are compared in constant time and never
logged; an empty `--api_key` is refused at startup (leave the flag out to serve without a key); its default is
`osvl_jax.rollout.api_key.api_key_from_env` (`$OSVL_API_KEY`, else `$SGLANG_API_KEY`), the key the clients send
too: `sglang_client.SGLangEngine(api_key=...)`, the `sglang-router`'s `--api-key` (the key it sends to its
workers).

Weights roots (`--weights_root`, one or more): `/update_weights_from_disk` loads only folders inside them.
A local `model_path` is resolved (symlinks, `..`) and must lie inside a resolved root, and so must every file
under it (a symlinked shard pointing outside is refused too, symlinked folders followed at any depth); a URL
(`gs://bucket/...`, any `scheme://`) must lie under a root URL of the same scheme and bucket, after normalising
`..`, and is never contacted otherwise. Missing and forbidden paths get the same message (`REFUSED`), so the
answer does not reveal what exists. No root given: any path (SGLang's behaviour).
"""

from __future__ import annotations

import hmac
import os
import posixpath
import re
from typing import Sequence

OPEN_PREFIX = '/health'                            # SGLang leaves /health, /health_generate open
_URL = re.compile(r'^([a-zA-Z][a-zA-Z0-9+.-]*)://([^/]*)(/.*)?$')


def authorized(method: str, path: str, authorization: str | None, api_key: str | None) -> bool:
  """Whether a request may pass: no key configured, an open path (OPTIONS, `/health*`), or
  `Authorization: Bearer <api_key>` (constant-time comparison)."""
  if not api_key or method == 'OPTIONS' or path.startswith(OPEN_PREFIX):
    return True
  return hmac.compare_digest((authorization or '').encode(), f'Bearer {api_key}'.encode())


def add_api_key_middleware(app, api_key: str | None) -> None:
  """Makes the FastAPI `app` answer 401 `{"error": "Unauthorized"}` to requests `authorized` refuses (None: no key).

  Raises:
    ValueError: an empty or blank `api_key` (it would silently serve without a key).
  """
  if api_key is None:
    return
  if not api_key.strip():
    raise ValueError('--api_key is empty: give a key, or leave the flag out to serve without one')
  from fastapi.responses import JSONResponse  # pylint: disable=g-import-not-at-top

  @app.middleware('http')
  async def authentication(request, call_next):
    if not authorized(request.method, request.url.path, request.headers.get('Authorization'), api_key):
      return JSONResponse(status_code=401, content={'error': 'Unauthorized'})
    return await call_next(request)


class WeightsPathRefused(ValueError):
  """A `model_path` outside the allowed roots, or one that does not exist (the same message for both)."""


def _split_url(path: str):
  """(scheme, bucket, normalised absolute path) of a URL, or None for a local path."""
  m = _URL.match(path)
  if m is None:
    return None
  return m.group(1).lower(), m.group(2), posixpath.normpath('/' + (m.group(3) or '').lstrip('/'))


def _inside(path: str, root: str) -> bool:
  return path == root or path.startswith(root.rstrip('/') + '/')


class WeightsRoots:
  """The folders `/update_weights_from_disk` may load from (module docstring).

  Args:
    roots: local folders and / or URLs (`gs://bucket/prefix`); empty: every path is allowed.
  Raises:
    ValueError: a root that is empty, or a local root that is not an existing folder (named).
  """

  def __init__(self, roots: Sequence[str] = ()):
    self.local, self.urls = [], []
    for root in roots:
      root = str(root).strip()
      if not root:
        raise ValueError('--weights_root: an empty root')
      url = _split_url(root)
      if url is not None:
        self.urls.append(url)
      elif not os.path.isdir(root):
        raise ValueError(f'--weights_root={root!r} is not an existing folder')
      else:
        self.local.append(os.path.realpath(root))

  @property
  def restricted(self) -> bool:
    return bool(self.local or self.urls)

  @staticmethod
  def refused(path: str) -> WeightsPathRefused:
    """The one error of a missing or forbidden `path` (it does not say which)."""
    return WeightsPathRefused(f'model_path {path!r} is not a weights folder under the allowed --weights_root')

  def resolve(self, path: str) -> str:
    """The path to load for a requested `model_path`: the resolved local path, or the normalised URL.

    Without roots `path` is returned as given. Never reads a URL; stats local files only inside the roots.

    Raises:
      WeightsPathRefused: outside every root, missing, or a local folder holding a file that resolves outside.
    """
    if not self.restricted:
      return path
    url = _split_url(path)
    if url is not None:
      scheme, bucket, rest = url
      if any(scheme == s and bucket == b and _inside(rest, r) for s, b, r in self.urls):
        return f'{scheme}://{bucket}{rest}'
      raise self.refused(path)
    real = os.path.realpath(path)
    if not any(_inside(real, root) for root in self.local) or not os.path.exists(real):
      raise self.refused(path)
    for file in [real] + linked_tree(real):   # a shard or sub-folder symlinked (at any depth) to outside the roots
      if not self.inside_local(file):
        raise self.refused(path)
    return real

  def inside_local(self, path: str) -> bool:
    """Whether the resolved `path` lies inside a local root."""
    return any(_inside(os.path.realpath(path), root) for root in self.local)


def linked_tree(folder: str) -> list[str]:
  """Every entry under `folder`, symlinked folders followed (each real folder once, so link cycles end): the paths
  a loader reading `folder` can reach."""
  out, seen, todo = [], {os.path.realpath(folder)}, [folder]
  while todo:
    for entry in os.scandir(todo.pop()):
      out.append(entry.path)
      real = os.path.realpath(entry.path)
      if entry.is_dir() and real not in seen:   # is_dir follows links
        seen.add(real)
        todo.append(entry.path)
  return out

"""The API key a client of `python -m osvl_jax.serve` (or SGLang, or a router with `--api-key`) sends.

`sglang_client.SGLangEngine` and `openai_engine.OpenAIEngine` send `Authorization: Bearer <key>` with the key they
are given, by default `api_key_from_env()`; the server takes the same default for its `--api_key`
(`osvl_jax.serve.auth` checks it), and the trainer's preflight names the variable it came from. Keys are never logged.
"""

from __future__ import annotations

import os

API_KEY_ENV = ('OSVL_API_KEY', 'SGLANG_API_KEY')   # read in this order by `api_key_from_env`


def api_key_from_env() -> str | None:
  """The API key in `$OSVL_API_KEY`, else `$SGLANG_API_KEY`, else None (an empty value counts as unset)."""
  for name in API_KEY_ENV:
    if os.environ.get(name):
      return os.environ[name]
  return None

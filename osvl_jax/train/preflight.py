"""GRPO's checks of what lies outside the config, run before anything is written (`grpo.train`, after
`grpo.check_config`): the checkpoint the policy starts from exists, and every rollout server answers `/health` and
accepts the trainer's API key.

Without them a missing `grpo.init_from` failed after the mesh and optimizer were built, leaving an empty
`grpo_ckpt/`, and an unreachable `rollout.urls` failed with a raw engine error after metrics, TensorBoard files
and a weight export were written. Both read only: no folder is created (orbax's manager would create one).
"""

import os
import pathlib

import httpx
import ml_collections
import orbax.checkpoint as ocp

from osvl_jax import checkpoints
from osvl_jax.checkpoints import storage
from osvl_jax.rollout import api_key, factory

HEALTH_TIMEOUT = 5.0   # seconds for one GET /health (a server that is up answers at once)


def checkpoint_steps(workdir: str | pathlib.Path, name: str) -> list[int]:
  """The finished steps of `<workdir>/<name>` (a local folder or a URL), without creating anything; [] when the
  folder does not exist."""
  folder = checkpoints.directory(workdir, name)
  if not folder.is_dir():
    return []
  mngr = ocp.CheckpointManager(folder, options=ocp.CheckpointManagerOptions(create=False, read_only=True))
  return sorted(int(s) for s in mngr.all_steps())


def check_init_checkpoint(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> str:
  """Checks that the policy has something to start from (`grpo.init_policy`'s order).

  Returns:
    'resume' (`<workdir>/grpo_ckpt` has a step), 'sft' (the SFT checkpoint of `grpo.init_from`, else of the
    workdir) or 'hf' (no SFT checkpoint, no init_from, `model.hf_path` set).
  Raises:
    FileNotFoundError: naming grpo.init_from (or the workdir) and the folder looked in, when nothing is found;
      naming model.hf_path when it is set but is not a folder holding config.json.
  """
  if checkpoint_steps(workdir, 'grpo_ckpt'):
    return 'resume'
  init_from = config.grpo.get('init_from') or ''
  init_dir = storage.path(init_from or workdir)
  if checkpoint_steps(init_dir, 'sft_ckpt'):
    return 'sft'
  if init_from:
    raise FileNotFoundError(f'grpo.init_from={init_from!r}: no SFT checkpoint in {init_dir / "sft_ckpt"} (set it '
                            'to the SFT run\'s workdir, or leave it empty to start from model.hf_path)')
  hf_path = config.model.get('hf_path') or ''
  if not hf_path:
    raise FileNotFoundError(f'grpo: no SFT checkpoint in {init_dir / "sft_ckpt"}; run osvl_jax.train.sft first, '
                            'set grpo.init_from to the SFT workdir, or set model.hf_path')
  if not (storage.path(hf_path) / 'config.json').exists():
    raise FileNotFoundError(f'model.hf_path={hf_path!r}: no config.json there (an HF Qwen3-VL folder is needed, '
                            f'as there is no SFT checkpoint in {init_dir / "sft_ckpt"})')
  return 'hf'


def check_servers(config: ml_collections.ConfigDict, timeout: float = HEALTH_TIMEOUT) -> list[str]:
  """With rollout.engine='sglang': `GET /health` on every URL of rollout.urls and rollout.admin_urls.

  Returns:
    The URLs checked ([] for the embedded engine).
  Raises:
    ConnectionError: naming the field and each URL that did not answer 200 within `timeout` seconds, and why.
    PermissionError: a server refuses the API key (`check_api_key`).
  """
  if factory.engine_name(config.rollout) != 'sglang':
    return []
  fields = {url: field for field in ('admin_urls', 'urls') for url in factory.url_list(config.rollout, field)}
  failed = []
  for url, field in fields.items():
    try:
      status = httpx.get(url.rstrip('/') + '/health', timeout=timeout).status_code
      if status != 200:
        failed.append(f'rollout.{field}: {url} answered /health with HTTP {status}')
    except httpx.HTTPError as e:
      failed.append(f'rollout.{field}: {url} did not answer /health within {timeout:g} s '
                    f'({type(e).__name__}: {e})')
  if failed:
    raise ConnectionError('rollout servers not ready: ' + '; '.join(failed) +
                          ' (start them first, e.g. `python -m osvl_jax.serve`, or fix the URLs)')
  check_api_key(fields, timeout)
  return list(fields)


def check_api_key(fields: dict[str, str], timeout: float = HEALTH_TIMEOUT) -> None:
  """`GET /model_info` (an authenticated endpoint: /health stays open on a server run with a key) on every URL,
  with the key the engine sends (`api_key.api_key_from_env`), so a missing or wrong key stops the run before a
  weight export rather than at the first `/update_weights_from_disk`.

  Args:
    fields: URL -> the config field it comes from ('urls' / 'admin_urls').
  Raises:
    PermissionError: naming the field, each URL that answered 401 / 403, and the variables read (never the key).
  """
  key = api_key.api_key_from_env()
  source = next((name for name in api_key.API_KEY_ENV if os.environ.get(name)), None)
  how = f'with the API key in ${source}' if key else 'without an API key'
  variables = f'${api_key.API_KEY_ENV[0]} (or ${api_key.API_KEY_ENV[1]})'
  refused = []
  for url, field in fields.items():
    headers = {'Authorization': f'Bearer {key}'} if key else None
    try:
      status = httpx.get(url.rstrip('/') + '/model_info', headers=headers, timeout=timeout).status_code
    except httpx.HTTPError:   # it answered /health a moment ago: the engine's own retries deal with the rest
      continue
    if status in (401, 403):
      refused.append(f'rollout.{field}: {url} answered /model_info with HTTP {status} {how}')
  if refused:
    raise PermissionError('rollout servers refuse the trainer: ' + '; '.join(refused) +
                          f': set {variables} to the key the servers were started with (--api_key)')


def check(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> None:
  """`check_init_checkpoint` and `check_servers` (module docstring). Raises their errors."""
  check_init_checkpoint(config, workdir)
  check_servers(config)

"""How a rollout's parts are made from config, one way for every caller (GRPO's rollouts, evaluation, the
pipeline's expert): `make_engine` (the policy engine of a `rollout` section) and `make_builder`.

Engines (`rollout.engine`, DESIGN.md §6b, §9):
  embedded  the in-process JAX sampler (`jax_sampler.JaxSampler`) over a model the caller holds: tests, the demo,
            evaluation of a checkpoint on CPU / TPU.
  sglang    servers of SGLang's native `/generate` API at `rollout.urls` (one URL, a list used round-robin, or an
            `sglang-router`): SGLang on GPUs or `python -m osvl_jax.serve` (`sglang_client.SGLangEngine`);
            token ids and log-probs out, weight updates from disk.
  openai    any OpenAI-compatible `/v1/chat/completions` endpoint with image inputs at `rollout.base_url`, model
            `rollout.model` (`openai_engine.OpenAIEngine`): text in, text out, rendered by the builder into the
            token-exact record; no log-probs, so evaluation and the pipeline's expert only, never RL.

The section's fields (`check_engine_config` checks them; each job's config documents them):
  engine ('embedded' when unset); max_new_tokens (per turn); max_total_tokens (per trajectory: the embedded
  sampler's context is max_total_tokens + max_new_tokens); temperature, top_p (optional, default 1.0);
  prefix_cache_slots (embedded, optional int >= 0, default 0); mesh (embedded, optional: the rollout layout,
  `embedded/layout.py`: {'tensor': T (0 = none: one device, the default; -1 = auto, sized to hold the weights and
  the KV of max_concurrency rows; T >= 1), 'data': R (replicas, -1 = the remaining devices, the default)}); urls,
  admin_urls (sglang; admin_urls: where weight
  updates go, default the urls, behind a router its workers); base_url (with '/v1'), model, api_key_env (openai;
  the variable holding the key, default: `$OSVL_API_KEY`, else `$SGLANG_API_KEY`, else none);
  timeout_s (seconds per request, default 600), retries (of a failed request, default 4) and max_concurrency
  (requests in flight, default 256) for the two remote engines.
"""

import os
from collections.abc import Callable

import ml_collections

from osvl_jax import config_checks as checks
from osvl_jax import trajectory as traj_lib
from osvl_jax.rollout import engine as engine_lib

ENGINES = ('embedded', 'sglang', 'openai')
# Engines whose turns carry the policy's own token ids and log-probs, and whose weights the trainer can update.
TRAINABLE = ('embedded', 'sglang')


def engine_name(section: ml_collections.ConfigDict) -> str:
  """`section.engine`, 'embedded' when unset."""
  return section.get('engine') or 'embedded'


def url_list(section: ml_collections.ConfigDict, field: str, path: str = 'rollout') -> list[str]:
  """The URL(s) of `section.<field>` as a list (one URL, a list, or a comma-separated string).

  Raises:
    ValueError: naming `<path>.<field>`, for one that is not http(s)://.
  """
  value = section.get(field) or ()
  urls = [u.strip() for u in value.split(',') if u.strip()] if isinstance(value, str) else list(value)
  bad = [u for u in urls if not isinstance(u, str) or not u.startswith(('http://', 'https://'))]
  if bad:
    raise ValueError(f'{path}.{field}={value!r}: expected an http(s):// URL or a list of them, got {bad[0]!r}')
  return urls


def check_engine_config(section: ml_collections.ConfigDict, training: bool = False, path: str = 'rollout') -> str:
  """Checks the engine fields of a rollout section (module docstring) without building anything; the engine name.

  Args:
    section: the rollout section (`config.rollout`, or the pipeline's expert section as one).
    training: the rollouts train a policy (GRPO): the engine must return the policy's own tokens and log-probs.
    path: the section's dotted name, for the errors.
  Raises:
    ValueError: naming the field: an unknown engine; 'openai' for training; prefix_cache_slots not an int >= 0;
      'sglang' without urls or with a url that is not http(s)://; 'openai' without base_url or model; timeout_s
      not > 0; retries not an int >= 0; max_concurrency not an int >= 1; a rollout.mesh field unknown or out of
      range (`check_mesh_config`).
  """
  root = section
  for key in reversed(path.split('.')):  # the dotted paths the checks name
    root = {key: root}
  name = checks.choice(root, f'{path}.engine', ENGINES) if section.get('engine') else 'embedded'
  if training and name not in TRAINABLE:
    raise ValueError(f'{path}.engine={name!r} cannot roll out for RL: GRPO trains on the policy\'s own token ids '
                     'and their log-probs, which an OpenAI-compatible chat endpoint (text in, text out) does not '
                     f'return; use one of {TRAINABLE} (an OpenAI endpoint serves evaluation and the pipeline\'s '
                     'expert)')
  checks.number(root, f'{path}.prefix_cache_slots', integer=True, low=0, optional=True)
  check_mesh_config(section, path)
  checks.number(root, f'{path}.timeout_s', low=0, low_open=True, optional=True)
  checks.number(root, f'{path}.retries', integer=True, low=0, optional=True)
  checks.number(root, f'{path}.max_concurrency', integer=True, low=1, optional=True)
  if name == 'sglang':
    if not url_list(section, 'urls', path):
      raise ValueError(f"{path}.urls is empty: {path}.engine='sglang' needs the server (or router) URL(s)")
    url_list(section, 'admin_urls', path)
  if name == 'openai':
    if not section.get('base_url') or not section.get('model'):
      raise ValueError(f"{path}.engine='openai' needs {path}.base_url (with /v1) and {path}.model, got "
                       f"{section.get('base_url')!r} and {section.get('model')!r}")
    url_list(section, 'base_url', path)
  return name


def check_mesh_config(section: ml_collections.ConfigDict, path: str = 'rollout') -> None:
  """Checks `<path>.mesh` (optional; the embedded sampler's rollout layout) without devices: a mapping of 'tensor'
  (0 = no layout, -1 = auto, or an int >= 1) and 'data' (-1 = the remaining devices, or an int >= 1; -1 when
  tensor is 0). Whether the devices fit is checked when the mesh is built (`layout.rollout_mesh`).

  Raises:
    ValueError: naming `<path>.mesh.<field>`: an unknown field, a size out of range, data set while tensor is 0.
  """
  mesh = section.get('mesh')
  if not mesh:
    return
  if not hasattr(mesh, 'items'):
    raise ValueError(f"{path}.mesh={mesh!r}: expected a mapping like {{'tensor': 2, 'data': -1}}")
  unknown = sorted(set(dict(mesh.items())) - {'data', 'tensor'})
  if unknown:
    raise ValueError(f"{path}.mesh.{unknown[0]}: unknown field; the rollout mesh has 'tensor' (tensor-parallel "
                     "degree: 0 = no layout, -1 = auto) and 'data' (replicas, -1 = the remaining devices)")
  for axis, allowed in (('tensor', (0, -1)), ('data', (-1,))):
    value = mesh.get(axis)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or (value < 1 and value not in allowed)):
      raise ValueError(f'{path}.mesh.{axis}={value!r}: expected an int >= 1, or '
                       + ('0 (no rollout layout) or -1 (auto)' if axis == 'tensor' else '-1 for the remaining devices'))
  if mesh.get('tensor') == 0 and mesh.get('data') not in (None, -1):
    raise ValueError(f'{path}.mesh.data={mesh.get("data")!r} with {path}.mesh.tensor=0 (no rollout layout): set '
                     f'{path}.mesh.tensor (>= 1, or -1 = auto), or data back to -1')


def rollout_mesh(section: ml_collections.ConfigDict, model, path: str = 'rollout'):
  """The embedded sampler's rollout mesh of a rollout section over `model` (a `Qwen3VLModel`, concrete or
  `nnx.eval_shape`d), or None (no layout): `layout.rollout_mesh` of `<path>.mesh` with the section's KV budget,
  max_concurrency rows of max_total_tokens + max_new_tokens tokens, prefix_cache_slots shared rows. Build it once
  and pass it to `make_engine` (and to `checkpoints.load_policy`, to read the weights into it).

  Raises:
    ValueError: from `layout.rollout_mesh`, naming `<path>.mesh.<field>` (or `<path>.max_concurrency`).
  """
  from osvl_jax.rollout.embedded import layout  # pylint: disable=g-import-not-at-top  # (jax)
  return layout.rollout_mesh(section.get('mesh'), model, section.get('max_concurrency'),
                             int(section.max_total_tokens) + int(section.max_new_tokens),
                             int(section.get('prefix_cache_slots') or 0), path=f'{path}.mesh')


def make_engine(section: ml_collections.ConfigDict, tokenizer, *, model=None, processor=None, seed: int = 0,
                training: bool = False, mesh=None) -> engine_lib.Engine:
  """The policy engine of a rollout section (module docstring): the one way an engine is built from config.

  Args:
    section: the rollout section; `check_engine_config` runs on it first.
    tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer`).
    model: the policy (`Qwen3VLModel`) the embedded engine samples; unused by the remote engines.
    processor: the `ImageProcessor` of raw image arrays given to the embedded engine.
    seed: the embedded sampler's PRNG seed (servers sample with their own).
    training: the rollouts train a policy (refuses 'openai', see `check_engine_config`).
    mesh: the embedded sampler's rollout mesh, when the caller built it (`rollout_mesh`, to load the weights into
      it); None: `rollout_mesh(section, model)`, built here.
  Returns:
    A `JaxSampler` ('embedded'), `SGLangEngine` ('sglang') or `OpenAIEngine` ('openai').
  Raises:
    ValueError: from `check_engine_config`; 'embedded' without a model; a value out of an engine's range; a
      rollout mesh the devices or the model do not fit (`rollout_mesh`, naming rollout.mesh.<field>).
  """
  name = check_engine_config(section, training)
  # The engine's default sampling; a caller that samples otherwise says so per call (`engine.Sampling`).
  temperature, top_p = float(section.get('temperature', 1.0)), float(section.get('top_p', 1.0))
  max_new = int(section.max_new_tokens)
  remote = {'timeout': float(section.get('timeout_s') or 600.0),
            'retries': int(4 if section.get('retries') is None else section.retries),
            'concurrency': int(section.get('max_concurrency') or 256)}
  if name == 'embedded':
    if model is None:
      raise ValueError("rollout.engine='embedded' samples a model in this process: none was given")
    from osvl_jax.rollout.embedded import jax_sampler  # pylint: disable=g-import-not-at-top  # (jax, the model)
    return jax_sampler.JaxSampler(model, tokenizer, processor, max_new_tokens=max_new, temperature=temperature,
                                  top_p=top_p, seed=seed, max_len=int(section.max_total_tokens) + max_new,
                                  prefix_cache_slots=int(section.get('prefix_cache_slots') or 0),
                                  mesh=rollout_mesh(section, model) if mesh is None else mesh)
  if name == 'sglang':
    from osvl_jax.rollout.remote import sglang_client  # pylint: disable=g-import-not-at-top
    return sglang_client.SGLangEngine(url_list(section, 'urls'), tokenizer, max_new_tokens=max_new,
                                      temperature=temperature, top_p=top_p,
                                      admin_urls=url_list(section, 'admin_urls') or None, **remote)
  from osvl_jax.rollout.remote import openai_engine  # pylint: disable=g-import-not-at-top
  key_env = section.get('api_key_env') or ''
  return openai_engine.OpenAIEngine(str(section.base_url), str(section.model), tokenizer, max_new_tokens=max_new,
                                    temperature=temperature, top_p=top_p,
                                    api_key=os.environ.get(key_env) if key_env else None, **remote)


def make_builder(tokenizer, processor: traj_lib.ImageProcessor, env=None,
                 system_prompt: str | None = None) -> Callable[[], traj_lib.TrajectoryBuilder]:
  """A zero-argument factory of `TrajectoryBuilder`s (what `agent_loop.run_episodes` takes) that render the system
  turn with `env`'s tool schemas and parse the policy's calls in `env`'s tool-schema profile (`tools.tool_schema`:
  'osvl' or 'official'), so a call is parsed and checked in the same profile.

  Args:
    tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer`).
    processor: the policy's `ImageProcessor`.
    env: the `tools.env.ToolEnv` the episodes call, or None for an episode without tools (no schemas; the 'osvl'
      profile).
    system_prompt: the agent's instructions (`trajectory.system_prompt_text`); None = the builder's default.
  """
  schemas = env.schemas() if env is not None else []
  profile = env.profile if env is not None else 'osvl'
  return lambda: traj_lib.TrajectoryBuilder(tokenizer, processor, schemas, system_prompt=system_prompt,
                                            profile=profile)

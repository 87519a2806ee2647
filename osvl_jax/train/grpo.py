"""Multi-turn fatal-aware GRPO (Sec. 4.2, Eq. 9-12).

Reads top to bottom: prompts, policy (from the SFT checkpoint), tools, rollout engine; then per step: roll out G
samples per prompt with the published policy version, score them (Eq. 9), group advantages (Eq. 11), post-fatal
mask (Eq. 10), the clipped policy-gradient update (Eq. 12) under the official schedule, publish the new version
to the engine, metrics, checkpoint. The engine is the in-process JAX sampler or SGLang-API servers
(`config.rollout.engine`, `rollouts.RolloutRunner`); `grpo.max_staleness` 1 overlaps the next rollout with the
update (`train`).

The update (`grpo_update.make_update_fn`): old log-probs computed once for the rollout batch, then one optimizer
step per mini-batch of `grpo.mini_batch_prompts` prompts' groups, `grpo.ppo_epochs` passes; each mini-batch's
gradient accumulated over `grpo.micro_batch_size`-row micro-batches (normalised by the mini-batch, so
micro-batching and the mesh size do not change it). Everything runs on the mesh of `config.mesh`, built once in
main and passed down (rows over ('data', 'fsdp'), parameters and optimizer state sharded by the model's rules, as
in SFT: `policy.create` / `placement.shard_batch`). What it shares with SFT lives in `train/` modules
(`policy_config`, `policy`, `data`), never in `sft.py`.

  .venv/bin/python -m osvl_jax.train.grpo --config=configs/demo.py --workdir=workdir/demo
  ... --config.rollout.engine=sglang --config.rollout.urls=http://127.0.0.1:30000 --config.grpo.max_staleness=1

The policy starts from the latest checkpoint in `<workdir>/sft_ckpt` (or `config.grpo.init_from`);
rerunning with the same workdir resumes from `<workdir>/grpo_ckpt`.
"""

import concurrent.futures
import pathlib
import pickle
import time

import jax
import ml_collections
import numpy as np
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from osvl_jax import checkpoints
from osvl_jax import compile_cache
from osvl_jax import config_checks as checks
from osvl_jax import distributed
from osvl_jax.checkpoints import storage
from osvl_jax.judges import registry as judges_registry
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rl import advantages as advantages_lib
from osvl_jax.rl import fatal as fatal_lib
from osvl_jax.rl import losses
from osvl_jax.rollout import agent_loop
from osvl_jax.train import (data, grpo_batch, grpo_update, metrics, placement, policy, policy_config, preflight, rollouts,
                            validation)



def check_config(config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None = None) -> None:
  """Fails fast, before anything is read or written, on a GRPO config the trainer cannot run.

  Raises:
    ValueError: naming the field: `policy_config.check_model_config`'s; an unknown fatal_mode / fatal_index /
      estimator / aggregation; the judge's (`judges.registry.check_config`: judge.name, and for 'llm' an empty
      judge.base_url / judge.model, on_error, temperature, prompts); grpo.steps / prompts_per_step / ckpt_every not ints >= 1,
      num_generations < 2 (a group of one has no baseline), lr <= 0, warmup_steps outside [0, steps), weight_decay
      < 0, grad_clip <= 0, eps_low not in [0, 1), eps_high < 0, beta < 0, alpha not in [0, 1], delta <= 0, std_ddof
      not 0 or 1, clip_ratio_c <= 1, temperature <= 0, top_p not in (0, 1], heldout_prompts (optional) < 0,
      zero_pixels (optional) not in `rollouts.ZERO_PIXELS`; `validation.check_config`'s (val_every not an int >= 0,
      or > 0 without heldout_prompts or a valid eval.temperature / eval.top_p);
      rollout max_turns / max_new_tokens /
      fatal_k < 1, max_total_tokens < max_new_tokens, max_prompt_tokens / max_response_tokens (optional; 0 = only
      what max_total_tokens implies) not ints >= 0, max_total_tokens < max_prompt_tokens + max_response_tokens when
      both are set; rollout.env_errors (optional) not in `fatal.ENV_ERROR_MODES`, env_retries not an int >= 1 with
      'retry', env_retry_backoff_s < 0; `grpo_batch.check_budgets`' (grpo.length_buckets,
      grpo.max_loss_tokens); micro_batch_size < 0 or not dividing the group batch or not a multiple of the mesh's
      data x fsdp size (`config.mesh`); pack_rows (optional) beside micro_batch_size or not a multiple of that size;
      the rollout engine's (`rollouts.check_engine_config`: engine, urls, admin_urls,
      weights_dir — a gs:// `workdir` needs it set — weights_dtype, weights_keep); more than one JAX process without
      rollout.engine='sglang'.
  """
  if jax.process_count() > 1 and (config.rollout.get('engine') or 'embedded') != 'sglang':
    raise ValueError(f"rollout.engine={config.rollout.get('engine')!r} with {jax.process_count()} processes: a "
                     "multi-host GRPO job rolls out on servers (rollout.engine='sglang', rollout.urls); the "
                     'embedded sampler runs in one process')
  # judge.name registered; an llm judge needs judge.base_url and judge.model (the paper configs give neither: they
  # come on the command line), valid on_error / temperature / prompts. First, as it needs no devices.
  judges_registry.check_config(config.get('judge'), 'judge')
  policy_config.check_model_config(config)
  cfg = config.grpo
  for choices, name in ((fatal_lib.FATAL_MODES, cfg.fatal_mode),
                        (fatal_lib.FATAL_INDEX, config.rollout.fatal_index),
                        (advantages_lib.ESTIMATORS, cfg.get('estimator', 'grpo')),
                        (losses.AGGREGATIONS, cfg.get('aggregation', 'seq_mean_token_mean'))):
    choices.get(name)  # raises ValueError naming the choice and the registered names
  for field in ('grpo.steps', 'grpo.prompts_per_step', 'grpo.ckpt_every', 'rollout.max_turns',
                'rollout.max_new_tokens', 'rollout.fatal_k'):
    checks.positive_int(config, field)
  checks.number(config, 'grpo.num_generations', integer=True, low=2)
  checks.number(config, 'grpo.lr', low=0, low_open=True)
  checks.warmup_steps(config, 'grpo')
  checks.number(config, 'grpo.weight_decay', low=0, optional=True)
  checks.number(config, 'grpo.grad_clip', low=0, low_open=True, optional=True)
  checks.number(config, 'grpo.eps_low', low=0, high=1, high_open=True)
  checks.number(config, 'grpo.eps_high', low=0)
  checks.number(config, 'grpo.beta', low=0)
  checks.number(config, 'grpo.alpha', low=0, high=1)
  checks.number(config, 'grpo.delta', low=0, low_open=True)
  if cfg.get('std_ddof') is not None:
    checks.choice(config, 'grpo.std_ddof', (0, 1))
  checks.number(config, 'grpo.clip_ratio_c', low=1, low_open=True, optional=True)
  checks.number(config, 'grpo.patches_per_shard', integer=True, low=0, optional=True)
  checks.number(config, 'grpo.heldout_prompts', integer=True, low=0, optional=True)  # held out of training
  validation.check_config(config)  # grpo.val_every: on the held-out prompts, with the eval section's sampling
  if cfg.get('zero_pixels') is not None:
    checks.choice(config, 'grpo.zero_pixels', rollouts.ZERO_PIXELS)
  if cfg.get('lr_schedule') is not None:
    checks.choice(config, 'grpo.lr_schedule', policy.SCHEDULES)
  checks.number(config, 'grpo.temperature', low=0, low_open=True)
  checks.number(config, 'grpo.top_p', low=0, low_open=True, high=1)
  total = checks.positive_int(config, 'rollout.max_total_tokens')
  if total < config.rollout.max_new_tokens:
    raise ValueError(f'rollout.max_total_tokens={total} < rollout.max_new_tokens={config.rollout.max_new_tokens}')
  prompt_budget = checks.number(config, 'rollout.max_prompt_tokens', integer=True, low=0, optional=True) or 0
  response_budget = checks.number(config, 'rollout.max_response_tokens', integer=True, low=0, optional=True) or 0
  if prompt_budget and response_budget and total < prompt_budget + response_budget:
    raise ValueError(f'rollout.max_total_tokens={total} < rollout.max_prompt_tokens={prompt_budget} + '
                     f'rollout.max_response_tokens={response_budget}: a trajectory must hold both budgets; set it to '
                     f'{prompt_budget + response_budget} (the paper files derive it as their sum)')
  if config.rollout.get('env_errors') is not None:
    if checks.choice(config, 'rollout.env_errors', fatal_lib.ENV_ERROR_MODES) == 'retry':
      checks.number(config, 'rollout.env_retries', integer=True, low=1)
  checks.number(config, 'rollout.env_retries', integer=True, low=0, optional=True)
  checks.number(config, 'rollout.env_retry_backoff_s', low=0, optional=True)
  grpo_batch.check_budgets(config)
  grpo_update.check_update_config(config)  # mini_batch_prompts, ppo_epochs, tis_cap, max_staleness, micro-batch
  rollouts.check_engine_config(config, workdir)
  rows = (cfg.get('mini_batch_prompts') or cfg.prompts_per_step) * cfg.num_generations  # one mini-batch
  micro = cfg.get('micro_batch_size') or rows
  shards = policy_config.batch_shards(config)
  if micro % shards:
    raise ValueError(f'grpo.micro_batch_size={micro} (rows per micro-batch) is not a multiple of the {shards} '
                     'data x fsdp devices of config.mesh')
  if cfg.get('pack_rows') and cfg.pack_rows % shards:
    raise ValueError(f'grpo.pack_rows={cfg.pack_rows} (packed rows per micro-batch) is not a multiple of the '
                     f'{shards} data x fsdp devices of config.mesh')
  if cfg.num_generations % shards:  # mini-batches are whole groups; their size varies (a prompt drawn twice, a
    # dropped stale group), so only a group size that splits over the devices keeps every micro-batch placeable
    raise ValueError(f'grpo.num_generations={cfg.num_generations} is not a multiple of the {shards} data x fsdp '
                     'devices of config.mesh')


def prompt_indices(step: int, prompts_per_step: int, num_prompts: int, seed: int) -> np.ndarray:
  """Prompts of `step` (seeded epochs, so a resumed run continues the same order)."""
  return data.batch_indices(step, prompts_per_step, num_prompts, seed + 1)


def _init_dir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> pathlib.Path:
  return storage.path(config.grpo.get('init_from') or workdir)  # gs://... stays a URL


def init_policy(config: ml_collections.ConfigDict, workdir: pathlib.Path, mesh: jax.sharding.Mesh):
  """Policy + optimizer created sharded on the run's `mesh`, resumed from `<workdir>/grpo_ckpt`, else initialised
  from the SFT checkpoint (restored onto this placement, whatever mesh wrote it)."""
  model, optimizer = policy.create(config, mesh, 'grpo', workdir)
  mngr = checkpoints.manager(workdir, 'grpo_ckpt')
  meta = checkpoints.restore(mngr, model, optimizer)
  if meta:
    print(f"grpo: resumed at step {meta['step']}", flush=True)
    return model, optimizer, mngr, meta['step']
  init_dir = _init_dir(config, workdir)
  sft_meta = checkpoints.restore(checkpoints.manager(init_dir, 'sft_ckpt'), model)
  if sft_meta is None and (config.grpo.get('init_from') or not config.model.get('hf_path')):
    raise FileNotFoundError(f'grpo: no SFT checkpoint in {init_dir / "sft_ckpt"}; run osvl_jax.train.sft first '
                            'or set config.grpo.init_from (leave it empty to start from model.hf_path)')
  source = init_dir / 'sft_ckpt' if sft_meta is not None else config.model.hf_path
  if (sft_meta or {}).get('system_prompt'):
    policy_config.check_system_prompt(config, sft_meta['system_prompt']['text'], f'the SFT checkpoint {source}')
  print(f'grpo: policy initialised from {source}', flush=True)
  return model, optimizer, mngr, 0


def init_reference(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                   mesh: jax.sharding.Mesh) -> nnx.Module | None:
  """π_ref for the KL term: a second, frozen copy of the SFT policy, sharded like the policy on the run's `mesh`;
  None when beta = 0 (no KL, no second model).

  Raises:
    FileNotFoundError: beta > 0 but there is no SFT checkpoint (and no hf_path) to take π_ref from.
  """
  if not config.grpo.beta:
    return None
  ref = policy.create_model(config, mesh, seed=config.seed, workdir=workdir)
  init_dir = _init_dir(config, workdir)
  if checkpoints.restore(checkpoints.manager(init_dir, 'sft_ckpt'), ref) is None and not config.model.get('hf_path'):
    raise FileNotFoundError(f'grpo: beta={config.grpo.beta} needs the SFT checkpoint in {init_dir / "sft_ckpt"} '
                            'as the reference policy')
  print(f"grpo: reference policy (beta={config.grpo.beta}) from {init_dir / 'sft_ckpt'}", flush=True)
  return ref


def drop_stale(trajectories: list, version: int, max_staleness: int) -> tuple[list, dict]:
  """Drops what is too old to train on at policy `version` (DESIGN.md §6, Weight versions).

  A trajectory whose `policy_version` < version − max_staleness is stale; a group (`prompt_id`) that loses any
  member is dropped whole (its Eq. 11 baseline would be computed over a different set of samples).

  Returns:
    (kept trajectories in their order, {'stale_dropped': stale trajectories, 'groups_dropped': whole groups lost,
     'staleness_mean', 'staleness_max': over all trajectories of version − policy_version}).
  """
  staleness = np.array([version - int(t.policy_version) for t in trajectories], np.int64)
  stale_groups = {t.prompt_id for t, s in zip(trajectories, staleness) if s > max_staleness}
  kept = [t for t in trajectories if t.prompt_id not in stale_groups]
  return kept, {'stale_dropped': int((staleness > max_staleness).sum()), 'groups_dropped': len(stale_groups),
                'staleness_mean': float(staleness.mean()) if staleness.size else 0.0,
                'staleness_max': int(staleness.max()) if staleness.size else 0}


def drop_over_budget(trajectories: list) -> tuple[list, int]:
  """Drops the groups of prompts refused for their token budget (`agent_loop.prompt_over_budget`: over
  rollout.max_prompt_tokens, or no room under max_total_tokens), as verl filters overlong prompts out of its dataset:
  prompt-only trajectories, never trained on, their groups out of the advantages and the loss' sequence count.

  Returns:
    (kept trajectories in their order, the number of prompts (groups) dropped: the metric prompts_over_budget).
  """
  over = {t.prompt_id for t in trajectories if agent_loop.prompt_over_budget(t)}
  return [t for t in trajectories if t.prompt_id not in over], len(over)


def dump_rollout_batch(workdir, step: int, rollout_batch: dict) -> None:
  """Debug (`grpo.dump_rollouts`): pickles the rollout batch that step `step` (1-based, as in the metrics) trains
  on, as every host receives it (trajectories after `drop_stale`, their scores, policy_versions, stale,
  rollout_seconds; and the run's fatal_mode), to `<workdir>/rollouts/<step:08d>.pkl`, so its update can be recomputed
  offline and `python -m osvl_jax.view` can show it; written as `<step>.pkl.tmp` renamed into place (a `.pkl` is
  whole)."""
  folder = workdir / 'rollouts'
  folder.mkdir(parents=True, exist_ok=True)
  tmp = folder / f'{int(step):08d}.pkl.tmp'
  tmp.write_bytes(pickle.dumps(rollout_batch, protocol=pickle.HIGHEST_PROTOCOL))
  tmp.replace(tmp.with_suffix(''))


def _load_prompts(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> list[dict]:
  """The RL prompts on process 0 (`data.load_prompts`), [] elsewhere. A dataset fault on process 0 (no `rl` split,
  no such folder) stops every process at this point with its message (broadcast), instead of leaving the others
  blocked in the first collective until the distributed shutdown times out.

  Raises:
    FileNotFoundError, ValueError: on every process, process 0's.
  """
  prompts, fault, error = [], None, None
  if distributed.is_main():
    try:
      prompts = data.load_prompts(config, workdir)
    except (FileNotFoundError, ValueError) as e:
      fault, error = (type(e).__name__, str(e)), e
  fault = distributed.broadcast_object(fault)
  if error is not None:
    raise error
  if fault is not None:
    raise (FileNotFoundError if fault[0] == 'FileNotFoundError' else ValueError)(f'process 0: {fault[1]}')
  return prompts


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
          mesh: jax.sharding.Mesh | None = None) -> nnx.Module:
  """Runs (or resumes) GRPO on `mesh` (main's; None = built here from `config.mesh`, once); returns the policy.
  Checkpoints in `<workdir>/grpo_ckpt`.

  Config (config.grpo unless noted): fatal_mode (none | hard | mask | mask_clamp), rollout.fatal_index
  (first | kth), estimator (grpo | rloo | dr_grpo), aggregation (seq_mean_token_mean = Eq. 12 | token_mean |
  seq_mean_token_sum), eps_low / eps_high, beta (> 0 loads π_ref), micro_batch_size (0 = whole batch),
  judge.name (rule | llm); config.mesh / config.sharding_rules place the policy and the batches;
  rollout.engine (embedded | sglang, `rollouts.RolloutRunner`); rollout.env_errors (count | retry: the agent loop
  retries environment errors, `rollout.limits` | exclude: trajectories cut by them, `grpo_batch.environment_cut`,
  leave the advantages and the loss, `grpo_batch.prepare_batch`); val_every (validation on the held-out prompts before
  step 1 and every val_every steps, stage 'val' records: `validation`).

  Versions: the policy version is the number of GRPO steps whose update has been applied (0 = the SFT policy;
  a step of several mini-batches counts once). It is published to the rollout engine before the first rollout
  and after each step's update.
  max_staleness 0: step s rolls out with version s, then updates. max_staleness >= 1: the rollout of step s + 1
  runs in a background thread (with version s) while step s updates, and is awaited before version s + 1 is
  published; so from the second step on each batch is one version behind the update. Trajectories older than
  version − max_staleness are dropped with their groups (`drop_stale`). A resumed run starts by rolling out
  (no prefetched batch survives a restart); prompts and seeds depend only on the step.

  Before anything is read or written: `check_config`, then `preflight.check` (the checkpoint the policy starts
  from exists; every rollout server answers /health), so a config fault leaves the workdir untouched.

  Multi-host (more than one JAX process, `osvl_jax.distributed`; servers only): process 0 alone reads the prompts,
  rolls out (its background thread with max_staleness 1), drops stale groups and scores; the rollout batch goes to
  every process (`distributed.broadcast_object`, in the main loop at the same point everywhere), which all build
  the same host batch and run the update on the global mesh; publishing gathers the parameters on every process
  and exports on process 0 (`weight_publish`). `grpo.dump_rollouts` (optional, default False) keeps each step's
  rollout batch (`dump_rollout_batch`).
  """
  workdir = storage.path(workdir)  # gs://... stays a URL
  cfg = config.grpo
  check_config(config, workdir)
  preflight.check(config, workdir)  # the init checkpoint exists, the servers answer: before anything is written
  prompts = _load_prompts(config, workdir)  # only process 0 rolls out (and reads them)
  mesh = sharding.mesh_from_config(config.get('mesh')) if mesh is None else mesh  # the run's one mesh
  rules = sharding.rules_from_config(config)
  model, optimizer, mngr, start = init_policy(config, workdir, mesh)
  ref_model = init_reference(config, workdir, mesh)
  runner = rollouts.RolloutRunner(config, model, workdir)
  judge = judges_registry.get_judge(config.get('judge'))
  writer = metrics.MetricWriter(workdir, 'grpo')
  patches = int(cfg.get('patches_per_shard', 0) or 0)  # the images' budget per batch shard (0: per micro-batch)
  update = grpo_update.make_update_fn(
      cfg, place=lambda b: placement.shard_batch(b, mesh, rules, model.config.vision, patches),
      batch_shards=sharding.batch_shards(mesh, rules))
  group, max_staleness = cfg.num_generations, int(cfg.get('max_staleness') or 0)

  def rollout(step: int) -> tuple[list, float]:
    t0 = time.time()
    items = [prompts[i] for i in prompt_indices(step, cfg.prompts_per_step, len(prompts), config.seed)]
    trajectories = runner.run(items, num_generations=group, temperature=cfg.temperature, top_p=cfg.top_p,
                              seed=config.seed * 100_003 + step)
    return trajectories, time.time() - t0

  publish_seconds = runner.publish(model, start)['seconds']  # version `start` (0: the SFT policy)
  validator = validation.Validator(config, workdir, runner, judge, writer)  # process 0, grpo.val_every > 0
  validator.maybe_validate(start)  # step 0 (before training), or a due step a resumed run has not validated yet
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='rollout')
  pending = None  # the next step's rollout, running while this step updates (max_staleness >= 1; process 0)
  try:
    for step in tqdm.trange(start, cfg.steps, desc='grpo', initial=start, total=cfg.steps,
                            disable=not distributed.is_main()):
      t0 = time.time()
      rollout_batch = None
      if distributed.is_main():  # process 0 alone rolls out and scores (servers, tools, judge)
        trajectories, rollout_seconds = pending.result() if pending is not None else rollout(step)
        pending = pool.submit(rollout, step + 1) if max_staleness and step + 1 < cfg.steps else None
        versions = sorted({int(t.policy_version) for t in trajectories})
        trajectories, stale = drop_stale(trajectories, step, max_staleness)
        trajectories, stale['prompts_over_budget'] = drop_over_budget(trajectories)  # logged in run_episodes too
        trajectories, masked = policy.mask_out_of_vocabulary(model, trajectories)
        stale['out_of_vocabulary_masked'] = masked   # a tool's text outside a compact vocabulary, as the sampler read it
        t_score = time.time()
        scores = grpo_batch.score_batch(trajectories, cfg, judge)
        rollout_batch = {'trajectories': trajectories, 'scores': scores, 'policy_versions': versions, 'stale': stale,
                         'rollout_seconds': rollout_seconds, 'score_seconds': time.time() - t_score}
        if cfg.get('dump_rollouts'):
          dump_rollout_batch(workdir, step + 1, {**rollout_batch, 'fatal_mode': cfg.fatal_mode})
      rollout_batch = distributed.broadcast_object(rollout_batch)  # every host: the same batch (a collective)
      trajectories = rollout_batch['trajectories']
      out = {}
      t_update = time.time()
      if trajectories:
        env_cut = grpo_batch.environment_cut(trajectories, config.rollout)  # their fatal cascade holds an env error
        exclude = env_cut if grpo_batch.env_errors(config.rollout) == 'exclude' else None
        batch, grid, scores, adv_stats = grpo_batch.prepare_batch(trajectories, cfg, scores=rollout_batch['scores'],
                                                                  exclude=exclude)
        batch['on_policy_rows'] = np.array([int(t.policy_version) == step for t in trajectories])  # the alarm's rows
        batch.pop('rewards')
        fatal_steps = batch.pop('fatal_steps')
        with sharding.use_mesh(mesh, rules):  # activation constraints on
          # π_old once for the whole batch, then one optimizer step per mini-batch (grpo_update, DESIGN.md §6)
          out, _ = update(model, optimizer, batch, grid, [t.prompt_id for t in trajectories], ref_model)
        out.update(grpo_batch.rollout_metrics(trajectories, scores, fatal_steps, adv_stats, batch['loss_mask'],
                                              env_cut))
      else:
        logging.warning('grpo step %d: no trajectory to train on (%d groups staler than max_staleness=%d, %d prompts '
                        'over their token budget); no update', step, rollout_batch['stale']['groups_dropped'],
                        max_staleness, rollout_batch['stale']['prompts_over_budget'])
      update_seconds = time.time() - t_update  # batch preparation, π_old, gradients, optimizer steps
      if pending is not None:
        concurrent.futures.wait([pending])  # its rollout used version `step`: publish only once it is done
      info = runner.publish(model, step + 1)  # every process (gathers the parameters); process 0 exports
      writer.write(step + 1, {
          **out,
          **rollout_batch['stale'],
          'injected_tool_failures': dict(getattr(runner.env, 'injected_counts', None) or {}),  # cumulative
          'batch_shards': sharding.batch_shards(mesh, rules),  # data x fsdp devices the rows are split over
          'weight_version': info['version'],  # published after this step's update
          'policy_versions': rollout_batch['policy_versions'],  # of the rollout batch, before drop_stale
          'publish_seconds': publish_seconds + info['seconds'],
          'rollout_seconds': rollout_batch['rollout_seconds'],
          'score_seconds': rollout_batch['score_seconds'],
          'update_seconds': update_seconds,
          'step_seconds': time.time() - t0,
      })
      publish_seconds = 0.0
      if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
        checkpoints.save(mngr, step + 1, model, optimizer,
                         {'stage': 'grpo', **policy_config.checkpoint_meta(config)})
      validator.maybe_validate(step + 1)  # the published version step + 1; the engine is idle (pending is done)
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
  writer.close()
  return model


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
  distributed.initialize()  # multi-host (TPU pod, or OSVL_* / JAX_COORDINATOR_ADDRESS variables); else a no-op
  check_config(_CONFIG.value, _WORKDIR.value)
  compile_cache.enable_for_run(_CONFIG.value, _WORKDIR.value)
  mesh = sharding.mesh_from_config(_CONFIG.value.get('mesh'))  # the run's one mesh, passed down (big_vision)
  train(_CONFIG.value, _WORKDIR.value, mesh)


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the modules import into each other (and tests) freely.
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/demo.py', 'ml_collections config file.')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder (checkpoints, metrics); reruns resume.', required=True)
  app.run(main)

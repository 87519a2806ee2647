"""The `make demo` job: a tiny Qwen3-VL search agent, SFT then fatal-aware GRPO, on CPU and real data.

Run:
  .venv/bin/python -m osvl_jax.demo --workdir=workdir/demo
  (or `make demo`; override any field with e.g. `--config.sft.steps=100`)
  Its dataset alone: .venv/bin/python -m data_pipeline.build --config=configs/demo.py --workdir=workdir/demo

Stages: build the dataset from the Wikispeedia graph + landmark photos (data_pipeline), SFT on the oracle
expert's trajectories, sample the SFT'd policy on the RL prompts (held out of SFT; expected: sft_format_ok >= 0.8),
then GRPO with fatal_mode='mask_clamp'. Expected last line:
  demo: sft_format_ok=<>=0.8> grpo_steps=10 grpo_group_size=4 mean_reward=<r> fatal_fraction=<f> \
        grpo_reward_first=<x> grpo_reward_last=<y>   (one line; the GRPO curve: <workdir>/grpo_reward.png)
"""

import ml_collections

from data_pipeline import build
from osvl_jax.judges import registry as judges_registry


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # JAX's persistent compilation cache ('' = <workdir>/jax_cache): a rerun or resume compiles nothing new.
  c.compile_cache_dir = ''

  # Image processor budget (pixels): 128x128 -> an 8x8 patch grid -> 16 image tokens.
  c.image = ml_collections.ConfigDict()
  c.image.min_pixels = 64 * 64
  c.image.max_pixels = 128 * 128

  # Data pipeline (DESIGN §7), embedded offline defaults; short paths and 3 hits per search keep the
  # expert trajectories (and so SFT on CPU) short. `dir` = '' builds/reads `<workdir>/data`.
  c.data = build.wikispeedia_walks(build.default_config())  # tau = 600, seed in-degree window [2, 600]
  c.data.num_items = 600  # walks attempted: 34 accepted walks
  c.data.attributes_per_path = 2  # 64 items (44 SFT trajectories, 14 RL prompts; BENCHMARKS.md)
  c.data.hop_probs = (0.7, 0.3, 0.0)
  c.data.top_k = 3
  c.data.min_pixels = c.image.get_ref('min_pixels')
  c.data.max_pixels = c.image.get_ref('max_pixels')
  c.data.dir = ''
  # One agent system prompt for the whole run (trajectory.system_prompt_text): the expert trajectories' (tied to
  # data.system_prompt), the GRPO rollouts', the checkpoints' meta (evaluation's default). The demo keeps the
  # builder's short instructions (CPU-sized contexts); the paper configs use 'agent_system_v3'.
  c.system_prompt = 'builder_default'
  c.data.system_prompt = c.get_ref('system_prompt')

  # Model: the tiny random Qwen3-VL (Qwen ids and special tokens; its rows: model.vocab below).
  c.model = ml_collections.ConfigDict()
  c.model.name = 'tiny'
  c.model.hf_path = ''  # an HF folder instead of `name`, e.g. a Qwen3-VL checkpoint.
  # Deeper than the test config (layers are cheap here; the vocabulary projection dominates the cost), and
  # rope_theta 1e4: with head_dim 16 there are only 8 rotary frequencies, and Qwen3-VL's 5e6 would leave almost
  # all of them too slow to tell nearby tokens apart.
  c.model.text = ml_collections.ConfigDict(
      {'num_hidden_layers': 4, 'intermediate_size': 256, 'rope_theta': 10_000.0})
  # Rows of the embedding and output projection: 'full' (every Qwen id), 'dataset' (only the Qwen ids the dataset
  # lists in <data dir>/vocab_ids.json: a compact vocabulary, an id remap at the model boundary, for fast tiny
  # experiments; no HF export) or the path of such a JSON list. The demo: 'dataset' (~5k ids: the expert
  # trajectories, the questions, the added tokens), its SFT step 2.6x faster than with the 152k rows
  # (BENCHMARKS.md); a search result's other ids read as <|endoftext|> (train.policy.mask_out_of_vocabulary).
  c.model.vocab = 'dataset'
  # Decoder layers under jax.lax.scan (stacked parameters; compile time independent of depth) and per-layer remat.
  c.model.scan_layers = False
  c.model.remat = False

  # The trainers' mesh (DESIGN.md §3): axis sizes, -1 = the remaining devices; the demo runs on one CPU device.
  # E.g. --config.mesh.fsdp=-1 shards parameters, optimizer state and batch rows over every device. Optional
  # c.sharding_rules = (('embed', None), ...) overrides logical -> mesh axis rules (models/qwen3_vl/sharding.py).
  c.mesh = ml_collections.ConfigDict({'data': 1, 'fsdp': 1, 'tensor': 1, 'expert': 1})

  c.tools = ml_collections.ConfigDict()
  c.tools.enabled = ('text_search', 'image_search', 'crop', 'sharpen')

  # Rollout budgets (tokens): per model call, and per trajectory.
  c.rollout = ml_collections.ConfigDict()
  c.rollout.max_turns = 10
  c.rollout.max_new_tokens = 128
  c.rollout.max_total_tokens = 4096
  c.rollout.max_prompt_tokens = 0  # tokens of the rendered prompt (0: only what max_total_tokens implies)
  # Tokens after the prompt: every turn and observation, verl's multi-turn response length (0: only what
  # max_total_tokens implies); the paper files: 4,096 + 70,000 (Table 5). osvl_jax/rollout/limits.py counts them.
  c.rollout.max_response_tokens = 0
  c.rollout.fatal_k = 3
  c.rollout.fatal_index = 'first'
  # End an episode at its fatal cascade (the official abort); False runs it on to its other limits (the paper's
  # "blind" vanilla baseline); the masks and the clamp are the same either way.
  c.rollout.stop_at_fatal = True
  # Tool errors of the environment (timeout, http_error, backend_error: tools/base.py), not of the policy's call:
  # 'count' (the paper: they count toward the fatal cascade like any error), 'retry' (a call is retried up to
  # env_retries times, env_retry_backoff_s x 2^attempt seconds apart, before the policy sees the error), 'exclude'
  # (a trajectory whose fatal cascade holds one is dropped from its group's advantages and from the loss, counted as
  # env_cut_trajectories / num_excluded: osvl_jax/rl/fatal.py cut_by_environment).
  c.rollout.env_errors = 'count'
  c.rollout.env_retries = 3
  c.rollout.env_retry_backoff_s = 1.0
  # The asyncio agent loop: episodes in flight at once, threads for blocking tool calls (1 keeps the order of
  # failure-injection draws reproducible; raise it with remote tools), wall-clock seconds per trajectory.
  c.rollout.max_concurrency = 64
  c.rollout.tool_workers = 1
  c.rollout.max_seconds = 600.0
  # The rollout engine (osvl_jax/train/rollouts.py, DESIGN.md §6b): 'embedded' = the in-process JAX sampler;
  # 'sglang' = servers of SGLang's native API at `urls` (SGLang on GPUs, `python -m osvl_jax.serve`, an
  # sglang-router), updated at `admin_urls` (default: the urls; behind a router: its workers) from HF folders
  # exported under `weights_dir` ('' = <workdir>/weights; must be a local folder the servers can read).
  c.rollout.engine = 'embedded'
  # The embedded sampler's prefix cache (osvl_jax/rollout/embedded/prefix_cache.py): each turn of an episode re-sends
  # its whole context; with slots the sampler prefills only what follows the longest prefix an earlier turn computed
  # (images included). A slot holds max_total_tokens + max_new_tokens of KV (4.3 MB for the demo model); 32 > the
  # demo's 32 concurrent eval episodes. 0 = off (SGLang servers keep their own, RadixAttention).
  c.rollout.prefix_cache_slots = 32
  # The embedded sampler's rollout layout (rollout/embedded/layout.py): tensor 0 = none (one device, the policy's own
  # placement), -1 = auto (the smallest tensor-parallel degree whose replica holds the weights and the KV cache of its
  # share of max_concurrency rows), T = tensor-parallel T; data = replicas, -1 = the remaining devices. E.g.
  # --config.rollout.mesh.tensor=2 --config.rollout.mesh.data=-1.
  c.rollout.mesh = ml_collections.ConfigDict({'tensor': 0, 'data': -1})
  # One URL or a list (either type may be set here or on the command line).
  c.rollout.urls = ml_collections.config_dict.placeholder(object)
  c.rollout.admin_urls = ml_collections.config_dict.placeholder(object)
  c.rollout.weights_dir = ''
  c.rollout.weights_dtype = 'bfloat16'  # what SGLang serves; 'float32' = the trainer's log-probs exactly
  c.rollout.weights_keep = 2  # exported versions kept on disk
  # Requests to the servers ('sglang'): seconds each, then retries with exponential backoff (connection, timeout,
  # 429 / 5xx); a turn that still fails ends its trajectory with an engine error (osvl_jax/rollout/factory.py).
  c.rollout.timeout_s = 600.0
  c.rollout.retries = 4

  c.sft = ml_collections.ConfigDict()
  # 650 steps x 2 of the 44 trajectories: sft_format_ok 0.86 (26 trajectories, one per walk: 0.66; BENCHMARKS.md).
  c.sft.steps = 650
  c.sft.batch_size = 2
  c.sft.micro_batch_size = 0  # rows per gradient-accumulation micro-batch; 0 = the batch (one fused step)
  c.sft.lr = 3e-3
  # 28 of the 650 steps; a fraction of sft.steps (as MaxText's warmup_steps_fraction), so --config.sft.steps=5
  # runs (warmup 0). An explicit --config.sft.warmup_steps is kept as given (sft.check_config says what fits).
  c.sft.warmup_steps = c.sft.get_ref('steps') * 2 // 45
  c.sft.lr_schedule = 'cosine'  # 'cosine' (to min_lr_ratio x lr) | 'constant', after warmup (policy.make_schedule)
  c.sft.min_lr_ratio = 0.1
  c.sft.adam_b2 = 0.95  # AdamW beta2 (the paper runs' frameworks: 0.999)
  c.sft.weight_decay = 0.0
  c.sft.grad_clip = 1.0
  # Image patches per batch shard (rows of one data x fsdp device), a multiple of 4: a fixed budget makes every
  # step one compiled program whatever its images (a batch needing more fails, naming the need); 0 = derived from
  # the dataset, its fullest row's patches x the rows per shard (`batching.sft_buckets`): also one program.
  c.sft.patches_per_shard = 0
  # Tokens per row of the compiled SFT steps (batching.sft_buckets): a batch takes the smallest bucket holding its
  # longest trajectory, one program per bucket used (the demo's 23 trajectories run 1,862-2,654 tokens; 4096 =
  # rollout.max_total_tokens holds anything the pipeline builds); () = one bucket, the longest trajectory.
  c.sft.length_buckets = (2304, 2816, 3328, 4096)
  # Packing (dynamic batch size, sft.make_packed_step): > 0 packs each step's trajectories into rows of the largest
  # length bucket (batching.pack) and runs them this many rows per micro-batch, one compiled program whatever the
  # lengths; the loss and gradient are the unpacked step's. 0 = one trajectory per row (the demo: its batch of 2
  # long trajectories gains nothing from packing, BENCHMARKS.md).
  c.sft.pack_rows = 0
  # Loss positions per row K (the vocabulary projection runs there), with patches_per_shard and length_buckets the
  # whole compiled shape from the config; a trajectory emitting more is refused at load. 0 = derived: each bucket's
  # most loss tokens (unpacked), the bound any full row meets (packed, batching.pack_budget).
  c.sft.max_loss_tokens = 0
  # MoE router losses (policy.router_loss: + coef x the load-balancing loss, + coef x ST-MoE z-loss); 0 = off, and
  # ignored by a dense model (the demo's). The paper's 30B-A3B GRPO run: 0.01 / 1e-3 (configs/qwen3vl_paper.py).
  c.sft.router_aux_loss_coef = 0.0
  c.sft.router_z_loss_coef = 0.0
  c.sft.router_loss_form = 'per_layer'  # Megatron's sum of per-layer losses | 'pooled' (HF's; moe.ROUTER_LOSS_FORMS)
  c.sft.log_every = 10
  c.sft.ckpt_every = 150

  # Sampling the SFT'd policy on the RL prompts (sft_format_ok).
  c.eval = ml_collections.ConfigDict()
  # The first 8 of the build's 14 RL prompts: 32 episodes, as many as rollout.prefix_cache_slots (all 14: 56
  # episodes, the cache thrashes and the eval takes 270 s instead of ~75; sft_format_ok 0.87 either way).
  c.eval.num_prompts = 8
  # Samples per prompt: sft_format_ok over ~150 steps instead of ~35 (its standard error ~0.03, not ~0.07).
  c.eval.num_samples = 4
  # Qwen3-VL-Instruct's generation_config defaults (temperature 0.7, top_p 0.8).
  c.eval.temperature = 0.7
  c.eval.top_p = 0.8

  c.grpo = ml_collections.ConfigDict()
  c.grpo.steps = 10
  c.grpo.prompts_per_step = 1
  c.grpo.num_generations = 4
  c.grpo.lr = 1e-4
  c.grpo.warmup_steps = 0  # GRPO steps of linear lr warmup (policy.make_tx), < grpo.steps
  c.grpo.lr_schedule = 'cosine'  # as sft.lr_schedule (the paper's GRPO runs: 'constant')
  c.grpo.min_lr_ratio = 0.1
  c.grpo.adam_b2 = 0.95  # as sft.adam_b2
  c.grpo.weight_decay = 0.0  # AdamW
  c.grpo.grad_clip = 1.0  # global-norm clipping
  c.grpo.eps_low = 0.2
  c.grpo.eps_high = 0.28
  c.grpo.beta = 0.0
  c.grpo.alpha = 0.8
  c.grpo.delta = 1e-6
  c.grpo.fatal_mode = 'mask_clamp'  # none | hard | mask | mask_clamp (Table 3b rows); fatal_index: c.rollout
  c.grpo.estimator = 'grpo'  # grpo (Eq. 11) | rloo | dr_grpo
  c.grpo.std_ddof = 1  # σ_G of Eq. 11: 1 = unbiased (verl, official code), 0 = population
  c.grpo.aggregation = 'seq_mean_token_mean'  # Eq. 12 | token_mean | seq_mean_token_sum
  # Dual-clip bound for Â < 0 (verl's clip_ratio_c, e.g. 3.0); None = Eq. 12 exactly.
  c.grpo.clip_ratio_c = ml_collections.config_dict.placeholder(float)
  # The update's compiled shapes (batching.bucket_sizes; DESIGN.md §3): tokens per row T, the smallest of these
  # holding the batch's longest trajectory (the largest >= rollout.max_total_tokens); loss positions K on a ladder
  # loss_bucket x 2^k up to min(T, max_loss_tokens) (0 = T; at least max_turns x max_new_tokens); image patches
  # per batch shard fixed by patches_per_shard, or 0 = on a ladder 4 x 2^k. One program per (T, K, P) rung.
  c.grpo.length_buckets = (2048, 4096)
  c.grpo.max_loss_tokens = 1280
  # One K rung (= max_loss_tokens): the demo's batches held 512 or 1024 loss positions, and the second rung's
  # compile (~29 s on the 2-core VM) cost more than the update at K = 1280 (5.0 s per step either way).
  c.grpo.loss_bucket = 1280
  c.grpo.patches_per_shard = 0
  c.grpo.micro_batch_size = 0  # rows per gradient-accumulation micro-batch; 0 = the whole group batch
  # Packing (dynamic batch size, grpo_update.Packing): > 0 packs each mini-batch's trajectories whole into rows of the
  # largest length bucket (max_loss_tokens loss positions, 0 = T), this many rows per micro-batch (micro_batch_size
  # then 0); the losses and gradients are the unpacked ones. 0 = one trajectory per row.
  c.grpo.pack_rows = 0
  c.grpo.router_aux_loss_coef = 0.0  # MoE router losses, as sft.router_aux_loss_coef / router_z_loss_coef
  c.grpo.router_z_loss_coef = 0.0
  c.grpo.router_loss_form = 'per_layer'
  # Update schedule (osvl_jax/train/grpo_update.py): prompts' groups per mini-batch = per optimizer step; 0 = the
  # whole rollout batch (the demo keeps one step per rollout batch; the official run: 64 of 256).
  c.grpo.mini_batch_prompts = 0
  c.grpo.ppo_epochs = 1  # passes over the mini-batches of a rollout batch
  # Truncated importance sampling: each token's loss × min(π_old / π_rollout, C); None = off (DESIGN.md §6).
  c.grpo.tis_cap = ml_collections.config_dict.placeholder(float)
  # The mismatch alarm: a step whose logprob_mismatch_abs_mean (mean |log π_rollout − log π_old| over the loss
  # tokens) exceeds this stops the run, naming the figure (an image-blind or stale engine); None / 0 = off.
  c.grpo.max_logprob_mismatch = 0.5
  # Policy versions a trajectory may lag (version = optimizer steps applied); 0 = strictly on-policy, 1 = the next
  # batch rolls out (one version behind) while this one updates (one rollout is in flight at most, so larger values
  # act as 1).
  c.grpo.max_staleness = 0
  # The rl split's last prompts held out of GRPO training (train.data.load_prompts; bench/learning.py evaluates on
  # them); 0 = train on every RL prompt.
  c.grpo.heldout_prompts = 0
  # Validation (osvl_jax/train/validation.py; verl's test_freq): every this many steps, and before step 1 and after
  # the last, the policy samples one rollout per held-out prompt (grpo.heldout_prompts must be > 0) at the
  # validation section's eval.temperature / eval.top_p; records of stage 'val' in metrics.jsonl. 0 = off.
  c.grpo.val_every = 0
  c.grpo.init_from = ''  # workdir holding sft_ckpt (policy init and π_ref); '' = this workdir
  c.grpo.temperature = 1.0
  c.grpo.top_p = 1.0
  c.grpo.ckpt_every = 5
  # The image-blind counter-test (osvl_jax/train/rollouts.py ZERO_PIXELS): 'rollout' | 'update' zero the pixels there;
  # 'none' is a real run.
  c.grpo.zero_pixels = 'none'
  c.grpo.dump_rollouts = False  # debug: pickle each step's rollout batch to <workdir>/rollouts/<step>.pkl

  # r_acc / r_query judges (osvl_jax/judges/registry.py): 'rule' offline, or 'llm' = any OpenAI-compatible
  # endpoint, e.g. --config.judge.name=llm --config.judge.base_url=http://127.0.0.1:8000/v1 --config.judge.model=m
  c.judge = judges_registry.default_config()
  return c

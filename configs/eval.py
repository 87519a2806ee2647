"""Evaluation of a policy on the paper's benchmarks (DESIGN.md §9), with the cost figures the paper leaves out.

Run:
  .venv/bin/python -m osvl_jax.evaluate --config=configs/eval.py --workdir=workdir/eval \
      --config.checkpoint=workdir/demo/grpo_ckpt --config.max_items_per_benchmark=8
  (no --config.checkpoint: the tiny random model; --config.modes=agentic,direct,rag,degrade for all four modes;
  a served model: --config.rollout.engine=sglang --config.rollout.urls=http://127.0.0.1:30000, or
  --config.rollout.engine=openai --config.rollout.base_url=http://127.0.0.1:8000/v1 --config.rollout.model=NAME;
  --config.budgets=2,4,8,16 adds the tool-call budget sweep and its plot; --config.benchmarks=fvqa,mmsearch;
  rerun with the same workdir to resume: a workdir evaluated with other settings is refused, naming them)

Writes `<workdir>/eval_settings.json` (what decides a result: policy, prompts, engine, sampling, judge, tools),
`<workdir>/results.jsonl` (one judged record per run x item, appended as items finish), `report.json`,
`report.md`, and with budgets `budget_sweep.json` + `budget_sweep.png`. Last line printed:
  benchmarks=<n> items=<m> report=<workdir>/report.json
"""

import ml_collections

from osvl_jax.judges import registry as judges_registry


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # JAX's persistent compilation cache ('' = <workdir>/jax_cache): a rerun or resume compiles nothing new.
  c.compile_cache_dir = ''

  # Benchmarks by name (osvl_jax.data.benchmarks.BENCHMARKS), a tuple or 'a,b'; an unknown name is an error before
  # anything is built. Those whose files are absent are reported, not run.
  c.benchmarks = ('simplevqa', 'mmsearch', 'livevqa', 'browsecomp_vl', 'fvqa', 'infoseek', 'vdr_bench')
  c.max_items_per_benchmark = 0  # 0 = all items
  # Per-benchmark overrides: {name: path or [paths]} and {name: image folder}; '' data_dir = osvl_jax.paths.
  c.benchmark_files = ml_collections.ConfigDict()
  c.image_roots = ml_collections.ConfigDict()
  c.data_dir = ''
  # The pipeline dataset the policy was trained on (its folder, e.g. `<W>/data`, holding build_config.json), or ''.
  # When that build merged external corpora (data.merge_external), those benchmarks are evaluated on their
  # held-out part only (`osvl_jax.data.benchmarks.held_out_items`): the other items may be in the training set.
  c.train_data = ''

  # Modes: agentic (the agent loop with tools), direct (no tools, one turn), rag (text-search results for the
  # question in the user turn, one turn), degrade (agentic on blurred / downscaled / skewed images). `modes` and
  # `budgets` take a tuple or a comma-separated string ('agentic,direct', '2,4').
  c.modes = ('agentic',)
  c.budgets = ()  # tool-call budget sweep, e.g. (2, 4, 8, 16): agentic runs with max_tool_calls = b, + plot
  c.max_tool_calls = 8  # tool calls per item in agentic / degrade (max_turns = max_tool_calls + 1)
  c.rag_top_k = 3
  c.degrade_kinds = ('blur', 'downscale', 'skew')  # item k gets kind k mod 3 (by a hash of its id)

  # Policy: '' = the tiny random model (config.model), else a checkpoint folder (`<W>/grpo_ckpt`,
  # `<W>/sft_ckpt`) or a workdir holding one (grpo_ckpt preferred); the architecture comes from the checkpoint.
  c.checkpoint = ''
  c.model = ml_collections.ConfigDict()
  c.model.name = 'tiny'
  c.model.hf_path = ''
  c.model.scan_layers = False
  c.model.text = ml_collections.ConfigDict(
      {'num_hidden_layers': 4, 'intermediate_size': 256, 'rope_theta': 10_000.0})

  c.image = ml_collections.ConfigDict()
  c.image.min_pixels = 64 * 64
  c.image.max_pixels = 128 * 128

  c.tools = ml_collections.ConfigDict()
  c.tools.enabled = ('text_search', 'image_search', 'crop', 'sharpen', 'perspective_correct')

  c.rollout = ml_collections.ConfigDict()
  c.rollout.max_new_tokens = 128
  c.rollout.max_total_tokens = 4096
  c.rollout.fatal_k = 3
  c.rollout.fatal_index = 'first'
  c.rollout.temperature = 0.0  # greedy: Pass@1 of one deterministic sample
  c.rollout.top_p = 1.0
  # The embedded sampler's prefix cache (slots of max_total_tokens + max_new_tokens of KV; configs/demo.py): 0 = off.
  c.rollout.prefix_cache_slots = 0
  # The embedded sampler's rollout layout (osvl_jax/rollout/embedded/layout.py; configs/demo.py): tensor 0 = none (one
  # device), -1 = auto, T = tensor-parallel T; data = replicas (-1 = the remaining devices). E.g. an 8B checkpoint on
  # 8 chips: --config.rollout.mesh.tensor=-1 (or =2, 4 replicas).
  c.rollout.mesh = ml_collections.ConfigDict({'tensor': 0, 'data': -1})
  # The engine (osvl_jax/rollout/factory.py): 'embedded' = the JAX sampler over `checkpoint` / `model` in this
  # process; 'sglang' = a model served over SGLang's native API at `urls` (one URL, a list or 'a,b'; SGLang
  # servers, `python -m osvl_jax.serve`, an sglang-router): `image` must then be the servers' pixel budget, or
  # every turn fails with a prompt_mismatch error; 'openai' = any OpenAI-compatible chat endpoint with image
  # inputs at `base_url` (with /v1), model `model` (API models; the key in $<api_key_env>): text replies, rendered
  # into the record with our tokenizer (the report's tokens are ours; `checkpoint` / `model` unused by both).
  c.rollout.engine = 'embedded'
  c.rollout.urls = ml_collections.config_dict.placeholder(object)
  c.rollout.base_url = ''
  c.rollout.model = ''
  c.rollout.api_key_env = 'OPENAI_API_KEY'
  c.rollout.timeout_s = 600.0  # per request (sglang, openai)
  c.rollout.retries = 4  # of a failed request: connection, timeout, 429 / 5xx, with exponential backoff
  c.rollout.max_concurrency = 64  # episodes, and so requests, in flight at once
  c.batch_size = 4  # items rolled out together; results are appended after each item is judged

  # Agent prompts (osvl_jax/judges/prompts): a versioned file name, or 'builder_default' for the trainer's
  # short instructions (trajectory.builder.DEFAULT_INSTRUCTIONS). system_prompt 'checkpoint': the one the
  # checkpoint was trained with (its meta; one system prompt per run), 'agent_system_v3' for an HF folder.
  c.system_prompt = 'checkpoint'
  c.direct_prompt = 'agent_direct_v1'
  c.rag_prompt = 'agent_rag_v1'

  # Accuracy judge: 'rule' offline, or 'llm' over an OpenAI-compatible endpoint (prompt accuracy_v1), e.g.
  # --config.judge.name=llm --config.judge.base_url=http://127.0.0.1:8000/v1 --config.judge.model=m
  c.judge = judges_registry.default_config()
  c.progress = True
  c.view = True  # write <workdir>/view/index.html: every stored trajectory as a static page (python -m osvl_jax.view)
  return c

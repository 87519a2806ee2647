"""The data pipeline job (DESIGN.md §7): Wikispeedia graph + landmark photos -> multi-hop visual QA items and
oracle expert SFT trajectories, offline.

Run:
  .venv/bin/python -m data_pipeline.build --config=configs/data_wikispeedia.py --workdir=workdir/data_wikispeedia
  (override any field, e.g. `--config.data.num_items=200 --config.data.seed=1`, or
  `--config.data.source=/path/enwiki-latest-pages-articles.xml.bz2` to build from a pages-articles dump: every
  stage then walks its graph, the seeds' infobox images looked up under `--config.data.image_dir=DIR`; the
  dataset goes to `<workdir>/data` unless `--config.data.dir=DIR`; rerunning with the same workdir resumes)

Filters A/B run against a policy endpoint when one is given (`--config.data.filter.base_url=http://HOST:PORT/v1
--config.data.filter.model=NAME`; offline they are skipped and counted).

Expert (stage `sft`, `data_pipeline/experts.py`): the oracle by default (offline); a model served by SGLang (or
`python -m osvl_jax.serve`) with `--config.data.synthesize.expert=model
--config.data.synthesize.base_url=http://HOST:PORT --config.data.synthesize.model=NAME`, or an API model behind
any OpenAI-compatible endpoint with `--config.data.synthesize.expert=openai
--config.data.synthesize.base_url=https://HOST/v1 --config.data.synthesize.model=NAME` (key in $OPENAI_API_KEY) (K =
`data.synthesize.num_samples` = 5 rollouts per item, kept after the answer judge and the process judge
`data.synthesize.min_process_score`; `data.synthesize.judge.name=llm` + `judge.base_url` / `judge.model` for the
LLM judges). `--config.data.synthesize.enabled=False` skips the stage. The kept trajectories are also written as
`<dataset>/sft_sharegpt.jsonl`, the official release's ShareGPT SFT format.

External corpora (stage `merge`): `--config.data.merge_external=True` adds FVQA / LiveVQA / WebQA items
(`data.merge_sources`) through the benchmark adapters, `data.merge_holdout` of each held out; offline only FVQA
ships its images, so only FVQA items are merged (the others are counted as `no_image`).

The Table 3a ablations: `--config.data.filter.enabled=False` (no filtering), `--config.data.degrade=False` (no
degradation subset), `--config.data.rewrite=False` (no fuzzy rewriting: the canonical question, v0 replaced by
the image's referring expression), `--config.data.anchor=answer` (the answer node's image; on Wikispeedia only
the 12 landmark articles have one, so most such items are rejected at `ground` with the reason counted).

The trainers read the same `data` section (`osvl_jax.data.pipeline.dataset_dir`); `configs/demo.py` has one too,
so `--config=configs/demo.py --workdir=workdir/demo` builds exactly the demo's dataset.
"""

import ml_collections

from data_pipeline import build


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Pipeline settings (`data_pipeline.build.default_config()`): item count, seed, hop distribution, oracle
  # search depth, the image budget of the trajectories' image tokens, tool overrides, output folder.
  c.data = build.default_config()
  build.wikispeedia_walks(c.data)  # tau = 600, seed in-degree window [2, 600] (the figures are there)
  return c


"""The data pipeline job (DESIGN.md §7): Wikispeedia graph + landmark photos -> multi-hop visual QA items and
oracle expert SFT trajectories, offline.

Run:
  .venv/bin/python -m data_pipeline.build --config=configs/data_wikispeedia.py --workdir=workdir/data_wikispeedia
  (override any field, e.g. `--config.data.num_items=200 --config.data.seed=1`, or
  `--config.data.source=/path/enwiki-latest-pages-articles.xml.bz2` for the `wiki` stage's link graph; the
  dataset goes to `<workdir>/data` unless `--config.data.dir=DIR`; rerunning with the same workdir resumes)

Filters A/B run against a policy endpoint when one is given (`--config.data.filter.base_url=http://HOST:PORT/v1
--config.data.filter.model=NAME`; offline they are skipped and counted). The Table 3a ablations:
`--config.data.filter.enabled=False` (no filtering), `--config.data.degrade=False` (no degradation subset).

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
  return c

"""The OpenSearch-VL data pipeline (DESIGN.md §7) over the Wikispeedia graph and the landmark photos.

Stages (each a function over lists of record dicts, deterministic in the seed, offline):
  paths.sample_paths -> qa.add_qa -> rewrite.rewrite -> ground.ground -> synthesize.synthesize
(the oracle expert is an `Engine` run by `osvl_jax.rollout.agent_loop.run_episodes`).
`build.build_dataset(config, out_dir)` runs them resumably and writes HF datasets `items` and `sft`, whose format
and readers live in `osvl_jax/data/pipeline.py`;
CLI: `python -m data_pipeline.build --config=configs/data_wikispeedia.py --workdir=W`.
"""

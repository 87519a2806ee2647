"""The OpenSearch-VL data pipeline (DESIGN.md §7) over the Wikispeedia graph and the landmark photos.

Stages (each a function over lists of record dicts, deterministic in the seed, offline):
  paths.sample_paths -> qa.add_qa -> rewrite.rewrite -> ground.ground -> synthesize.synthesize
`build.build_dataset(config, out_dir)` runs them resumably and writes HF datasets `items` and `sft`;
CLI: `python -m data_pipeline.build --out_dir=DIR --num_items=N --seed=S`.
"""

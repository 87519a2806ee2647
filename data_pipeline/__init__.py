"""The OpenSearch-VL data pipeline (DESIGN.md §7): a Wikipedia link graph (the Wikispeedia TSVs or a
pages-articles XML dump) to shortcut-free multi-hop visual questions and expert trajectories.

Stages (each a function over lists of record dicts, deterministic in the seed; offline unless an LLM / CLIP /
policy endpoint is configured):
  wiki (wiki.py, wiki_xml.py, wiki_tsv.py, graph.py) -> paths.sample_paths (over `wiki_graph.WikiGraph`) ->
  qa.add_qa (+ llm_questions.canonical_questions) -> (llm_descriptors.choose_descriptors +) rewrite.rewrite
  (relations.py; + llm_questions.unique_referent) -> ground.ground (+ clip_ground.ground_by_clip) -> merge -> filter -> degrade -> synthesize.synthesize /
  experts (the expert is an `Engine` run by `osvl_jax.rollout.agent_loop`).
`build.build_dataset(config, out_dir)` runs them resumably and writes HF datasets `items` and `sft`, whose format
and readers live in `osvl_jax/data/pipeline.py`;
CLI: `python -m data_pipeline.build --config=configs/data_wikispeedia.py --workdir=W`.
"""

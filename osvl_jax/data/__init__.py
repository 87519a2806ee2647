"""Readers of every dataset format the trainers and evaluators consume (DESIGN.md §2).

  pipeline.py  the datasets `python -m data_pipeline.build` writes (items, oracle SFT trajectories): format
               definition + readers (the pipeline imports the format from here; the trainer never imports the
               pipeline)
  official.py  the official OpenSearch-VL release (LLaMA-Factory ShareGPT SFT, RL prompt jsonl)
  benchmarks.py evaluation benchmarks -> EvalItem, adapters registered by name (DESIGN.md §9)
  eval_results.py an evaluation workdir's results.jsonl / trajectories.jsonl (written by `osvl_jax.eval.results`,
               shown by `osvl_jax.view`)
"""

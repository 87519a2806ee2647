"""Evaluation on the paper's benchmarks, with the cost figures the paper leaves out (DESIGN.md §9).

  runner.py   runs (agentic / direct / rag / degrade, tool-call budget sweep) of the one agent loop over the
              benchmark adapters' EvalItems, judged and appended per item to results.jsonl (resumable)
  runs.py     the runs and benchmark names of a config, checked before anything is built
  results.py  results.jsonl keyed by item content, under the fingerprint of eval_settings.json (other settings
              in the same workdir are refused); judge errors judged again on resume
  policy.py   the evaluated policy: its identity (checkpoint path, step, content) and loading it
  report.py   Pass@1 per benchmark + average; turns, tool calls, tokens, seconds (mean/median/p90); tool usage;
              error, fatal, abstention rates -> report.json + report.md
  degrade.py  blur / downscale / skew of the `degrade` mode
  plots.py    Pass@1 vs mean tool calls over the budget sweep

Entry point: `python -m osvl_jax.evaluate --config=configs/eval.py --workdir=W`.
"""

"""Parity matrix: Flax Qwen3-VL vs transformers on tiny random configs (same weights, same inputs).

Command: `.venv/bin/python bench/parity.py [--cases text,moe,...]`
Prints one line per case, `case=<name> max_abs_logit_diff=<x> tol=<t> ok=<bool>`, over real (non-pad) positions.
Expected: float32 cases <= 2e-5; bf16 (Flax bfloat16 vs HF float32) <= 0.05. Takes about a minute on 2 CPU cores.
Feeds BENCHMARKS.md, "Parity with transformers".
"""

import argparse
import time

from osvl_jax.models.qwen3_vl import parity


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--cases', default=','.join(parity.CASES))
  args = ap.parse_args()
  for name in args.cases.split(','):
    t0 = time.time()
    diff = parity.run_case(name).max_abs_diff()
    tol = parity.BF16_TOL if name == 'bf16' else parity.TOL
    print(f'case={name} max_abs_logit_diff={diff:.3g} tol={tol:g} ok={diff <= tol} seconds={time.time() - t0:.1f}',
          flush=True)


if __name__ == '__main__':
  main()

"""SFT steps unpacked (length buckets, one trajectory per row) vs packed (sft.pack_rows) on a built dataset.

Command: `.venv/bin/python bench/sft_packing.py --workdir=workdir/demo [--steps 26] [--batch_size 2] [--pack_rows 1]`
(the dataset is `<workdir>/data`, e.g. the demo's: `python -m data_pipeline.build --config=configs/demo.py
--workdir=W`). The demo config's model on one device; both runs start from the same initial weights and take the
same batches (`train.data.batch_indices`), one after the other in one process. Prints per mode
  mode=<plain|packed> steady_step_s=<mean after the first 6 steps> micro_batches=<mean per step> loss_last=<x>
and the packed budget (T, K, P). The losses of the two modes must agree (packing changes no loss; Eq. 8 sums over
the step's tokens); the speed is what packing buys or costs for this dataset's lengths.
Feeds BENCHMARKS.md, "SFT packing".
"""

import argparse
import sys
import time

WARM = 6  # steps excluded from the steady mean (the first of each length bucket compiles)


def run(workdir: str, mode: str, steps: int, batch_size: int, pack_rows: int) -> dict:
  # Imported here, so that --help answers without loading JAX and the model code.
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from osvl_jax.models.qwen3_vl import sharding  # pylint: disable=import-outside-toplevel
  from osvl_jax.train import data, policy, sft  # pylint: disable=import-outside-toplevel
  sys.path.insert(0, 'configs')
  import demo as demo_config  # pylint: disable=import-outside-toplevel

  config = demo_config.get_config()
  config.sft.batch_size = batch_size
  if mode == 'packed':
    config.sft.pack_rows = pack_rows
  trajectories = data.load_sft_trajectories(config, workdir)
  mesh, rules = sharding.mesh_from_config(config.mesh), sharding.rules_from_config(config)
  model, optimizer = policy.create(config, mesh, 'sft')
  out = {'mode': mode}
  if mode == 'packed':
    step, budget = sft.packer(config.sft, trajectories, mesh, rules, model.config.vision)
    out['budget'] = tuple(budget)
  else:
    step = sft.make_step(config.sft, sft.placer(config.sft, trajectories, mesh, rules, model.config.vision))
  times, losses, micro = [], [], []
  for i in range(steps):
    rows = [trajectories[j] for j in data.batch_indices(i, batch_size, len(trajectories), config.seed)]
    t0 = time.perf_counter()
    with sharding.use_mesh(mesh, rules):
      metrics = jax.device_get(step(model, optimizer, rows))
    times.append(time.perf_counter() - t0)
    losses.append(float(metrics['loss']))
    micro.append(metrics.get('micro_batches', 1))
  out.update(steady_step_s=float(np.mean(times[WARM:])), micro_batches=float(np.mean(micro)), losses=losses)
  return out


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', help='a workdir holding data/ (a built dataset); required')
  parser.add_argument('--steps', type=int, default=26, help=f'SFT steps per mode (> {WARM})')
  parser.add_argument('--batch_size', type=int, default=2, help='trajectories per step')
  parser.add_argument('--pack_rows', type=int, default=1, help='packed rows per micro-batch')
  args = parser.parse_args(argv)
  if not args.workdir:
    parser.error('--workdir is required')
  if args.steps <= WARM or args.batch_size < 1 or args.pack_rows < 1:
    parser.error(f'--steps must be > {WARM}, --batch_size and --pack_rows >= 1')
  results = [run(args.workdir, mode, args.steps, args.batch_size, args.pack_rows) for mode in ('plain', 'packed')]
  for r in results:
    print(f"mode={r['mode']} steady_step_s={r['steady_step_s']:.3f} micro_batches={r['micro_batches']:.2f} "
          f"loss_last={r['losses'][-1]:.6f}" + (f" budget={r['budget']}" if 'budget' in r else ''))
  gap = max(abs(a - b) for a, b in zip(results[0]['losses'], results[1]['losses']))
  print(f'max_loss_gap={gap:.2e}')
  return results


if __name__ == '__main__':
  main()

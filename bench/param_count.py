"""Parameter counts of the real Qwen3-VL family: Flax (abstract shapes) vs transformers (meta device).

Command: `.venv/bin/python bench/param_count.py`
Prints `config=<name> flax_params=<n> hf_params=<n> equal=<bool>` for 8B, 4B (real config.json), and 2B, 30B-A3B,
32B (assembled hparams, `qwen/configs/qwen3_vl_family_hparams.assembled.json`). Nothing is allocated: the Flax
model is built under `nnx.eval_shape`, the HF one on `torch.device('meta')`. Takes ~1 minute on 2 CPU cores.
Feeds BENCHMARKS.md, "Parameter counts".
"""

import argparse


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  return p.parse_args(argv)


def main(argv=None):
  parse_args(argv)  # --help prints the usage and exits before jax / flax / transformers are imported.
  from osvl_jax.models.qwen3_vl import params_count  # pylint: disable=g-import-not-at-top
  from osvl_jax.paths import data_dir  # pylint: disable=g-import-not-at-top

  root = data_dir() / 'qwen' / 'configs'
  for name, hf_dict in params_count.family_hf_dicts(root).items():
    flax_n = params_count.flax_param_count(hf_dict)
    hf_n = params_count.hf_param_count(hf_dict)
    print(f'config={name} flax_params={flax_n} hf_params={hf_n} equal={flax_n == hf_n}', flush=True)


if __name__ == '__main__':
  main()

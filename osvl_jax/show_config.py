"""Prints a config file's resolved settings, overrides applied (ml_collections' YAML-like dump, references resolved).

  python -m osvl_jax.show_config --config=configs/qwen3vl_paper.py:grpo_8b [--config.grpo.lr=2e-6 ...]

Reads the config only: nothing is built, loaded or written.
"""

from absl import app
from ml_collections import config_flags


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  print(_CONFIG.value)


if __name__ == '__main__':
  _CONFIG = config_flags.DEFINE_config_file('config', None, 'ml_collections config file.', lock_config=True)
  app.run(main)

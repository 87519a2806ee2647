"""`python -m osvl_jax.plan --config=configs/qwen3vl_paper.py:grpo_8b [--chip=v5p] [--compile] [--compile_tokens=2048]`

Prints the per-chip memory plan of the config's training step on its slice (`config.tpu`, `config.mesh`), from
abstract shapes only; the last line is
  params_gb_per_chip=<x> optimizer_gb_per_chip=<y> activations_gb_per_chip=<z> fits=<true|false>   (GB = 1e9 B)
For a GRPO config (stage 'grpo') the rollout section follows (`osvl_jax/plan/rollout_phase.py`): the embedded
sampler's rollout layout (rollout.mesh; unset: one device, as the sampler runs today), its weights, KV cache at the
config's rollout batch and context, prefix-cache pool, decode and prefill temporaries and the reshard's transient
copy per chip, the phases with the trainer's state live beside them, the rows that fit and the smallest tensor
degree that fits; its last line, the program's last, is
  rollout_gb_per_chip=<x> kv_gb_per_chip=<y> peak_gb_per_chip=<z> fits=<true|false>   (training and rollouts together)
`--compile` also compiles the SFT step of that config on the local devices (mesh fsdp=<device count>, e.g. 8
simulated CPU devices with XLA_FLAGS=--xla_force_host_platform_device_count=8) for one row of `--compile_tokens`
tokens per device, and prints XLA's memory analysis beside the estimate for that mesh and their ratio; for GRPO also
the embedded sampler's prefill (`--compile_tokens` / 2 prompt tokens per row) and one decode step on a rollout layout
of the local devices (one row per device, a cache of `--compile_tokens` slots) beside their estimates.
"""

from absl import app, flags
from ml_collections import config_flags

from osvl_jax import plan

_CONFIG = config_flags.DEFINE_config_file('config', None, 'ml_collections config file.')
_CHIP = flags.DEFINE_string('chip', None, f'Chip whose HBM the plan is checked against ({sorted(plan.HBM_GIB)}); '
                            'default: the chip of config.tpu.')
_LOSS_TOKENS = flags.DEFINE_integer('loss_tokens', 0, 'Loss positions per row; 0 = every token (upper bound).')
_COMPILE = flags.DEFINE_bool('compile', False, 'Also compile the SFT step (and for GRPO a decode step) on the '
                             'local devices and compare.')
_COMPILE_TOKENS = flags.DEFINE_integer('compile_tokens', 2048, 'Tokens per row of the --compile step (and KV cache '
                                       'slots of its decode step).')


def main(argv):
  del argv
  config = _CONFIG.value
  print(plan.run(config, chip=_CHIP.value, loss_tokens=_LOSS_TOKENS.value or None,
                 compile_tokens=_COMPILE_TOKENS.value if _COMPILE.value else None), flush=True)


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)

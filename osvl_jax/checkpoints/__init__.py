"""Checkpoints and policies on disk: the one way a policy comes off disk (DESIGN.md §2).

  store    orbax checkpoints of (params, optimizer state, step, meta) in `<workdir>/<name>/` (`manager`, `save`,
           `restore`, `read_meta`)
  storage  workdir paths that may be cloud URLs (`path`, `is_remote`)
  resolve  which checkpoint a reference means ('latest' | 'sft' | 'grpo', a `*_ckpt` folder, a step folder, a
           workdir) and the architecture it records (`resolve`, `latest`, `read_config`)
  load     `load_policy` (a checkpoint or an HF folder; into shardings on a mesh), `policy_shape` (its abstract
           form, for sizing a layout) and `build_model` (`config.model`)

Used by the trainers, the server, export and evaluation; nothing here imports `osvl_jax.train`.
"""

from osvl_jax.checkpoints.load import (ATTENTION_IMPLS, DTYPES, build_model, is_hf_folder, load_policy,
                                      model_dtypes, policy_shape, set_layer_options, vocab_ids)
from osvl_jax.checkpoints.resolve import CHECKPOINT_CHOICES, CHECKPOINT_DIRS, latest, read_config, resolve
from osvl_jax.checkpoints.store import directory, manager, read_meta, restore, save

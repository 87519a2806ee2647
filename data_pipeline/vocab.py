"""A dataset's compact vocabulary, `<dataset dir>/vocab_ids.json` (`pipeline_data.VOCAB_FILE`, what
`model.vocab='dataset'` reads): the sorted Qwen ids its trajectories and prompts use, with the added tokens (the
chat template's and the vision ones). A rollout context's id outside it reads as `<|endoftext|>`
(`train.policy.mask_out_of_vocabulary`)."""

import json
import pathlib
from collections.abc import Iterable

from osvl_jax.data import pipeline as pipeline_data


def write(out: pathlib.Path, id_lists: Iterable[Iterable[int]]) -> list[int]:
  """Writes `<out>/vocab_ids.json` durably: the union of `id_lists` and the added tokens, sorted. Returns it."""
  from osvl_jax import trajectory as traj_lib  # pylint: disable=g-import-not-at-top
  ids = set(traj_lib.ADDED_TOKENS) | set(traj_lib.EOS_IDS)
  for id_list in id_lists:
    ids.update(int(i) for i in id_list)
  vocab = sorted(ids)
  pipeline_data.write_durably(out / pipeline_data.VOCAB_FILE, json.dumps(vocab))
  return vocab


def write_wikipedia(out: pathlib.Path, sft: list[dict], items: list[dict], system: str) -> int:
  """The Wikipedia build's vocabulary (`write`): the expert trajectories' ids, the system prompt's and every
  accepted item's question's. Returns the number of ids."""
  from osvl_jax import trajectory as traj_lib  # pylint: disable=g-import-not-at-top
  tokenizer = traj_lib.load_tokenizer()
  texts = [system] + [r['question'] for r in items if not r.get('rejected')]
  return len(write(out, [t['token_ids'] for t in sft] + [tokenizer.encode(text) for text in texts]))

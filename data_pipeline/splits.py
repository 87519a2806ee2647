"""The training splits a build writes from its accepted items: `sft` (expert trajectories, written by the `sft`
stage) and `rl` (the GRPO prompts), disjoint by construction, plus the `sft` split in the official release's
ShareGPT format.

The paper trains RL on ~8K prompts apart from the 36,592 SFT trajectories (PAPER.md): a policy is not rewarded on
the questions it imitated. Here an accepted item is an RL prompt when it produced no SFT trajectory, for one of two
reasons, counted in the `rl` split's counts (and stats.json):
  held_out       it falls in the `data.rl_fraction` held out of synthesis: a deterministic hash of
                 '<seed>/<walk id>' (`benchmarks.holdout_key`, `walk_id`: the items of one walk together) below
                 the fraction, decided before the `sft` stage;
  no_trajectory  the expert produced no kept trajectory for it (rejected by the answer or process judge, failed),
                 or synthesis is off / skipped (then every accepted item is an RL prompt).
The `rl` split is computed from the `sft` records actually written, so it never holds an SFT item, nor an item of a
walk with one (`walk_id`), whatever build wrote the `sft` split.
"""

import pathlib
import re
from collections.abc import Sequence

from data_pipeline import entities
from osvl_jax.data import benchmarks

RL_COLUMNS = ('prompt_id', 'reason')  # the `rl` split: one row per RL prompt (its item is in `items`)
HELD_OUT, NO_TRAJECTORY = 'held_out', 'no_trajectory'
# An item asking another attribute of a walk's answer node (`qa.add_qa`'s attributes_per_path): '<walk id>-<attr>'.
_MORE_ATTRIBUTE = re.compile(r'-(?:' + '|'.join(a.name for a in entities.ATTRIBUTES) + r')$')


def item_id(walk: str, attribute: str) -> str:
  """The prompt_id of a walk's item asking `attribute` beside its first one ('wiki-s0-00012', 'currency' ->
  'wiki-s0-00012-currency'); `walk_id` reads it back."""
  return f'{walk}-{attribute}'


def walk_id(prompt_id: str) -> str:
  """The walk an item's question comes from: its prompt_id less a `-<attribute>` suffix ('wiki-s0-00012-currency'
  -> 'wiki-s0-00012'); the items of one walk share a split (an RL prompt never shares its path with SFT)."""
  return _MORE_ATTRIBUTE.sub('', str(prompt_id))


def rl_held_out(prompt_id: str, fraction: float, seed: int) -> bool:
  """Whether an accepted item is held out of synthesis for RL (`data.rl_fraction`): hash('<seed>/<walk id>') <
  fraction (`benchmarks.holdout_key`, `walk_id`), the same on every rerun and host."""
  return benchmarks.holdout_key(f'rl{seed}', walk_id(prompt_id)) < fraction


def synthesis_items(items: Sequence[dict], fraction: float, seed: int) -> list[dict]:
  """The item rows the `sft` stage may synthesise: all but the accepted ones held out for RL (`rl_held_out`);
  rejected rows are passed on (synthesis skips them)."""
  return [r for r in items if r['rejected'] or not rl_held_out(r['prompt_id'], fraction, seed)]


def rl_split(items: Sequence[dict], sft_records: Sequence[dict], fraction: float,
             seed: int) -> tuple[list[dict], dict]:
  """The `rl` split: the accepted items whose walk (`walk_id`) has no SFT trajectory.

  Args:
    items: the `items` split's rows (prompt_id, rejected, ...).
    sft_records: the `sft` split's rows (prompt_id of each trajectory); empty when synthesis is off.
    fraction, seed: `data.rl_fraction` and `data.seed` (`rl_held_out`), to name each prompt's reason.
  Returns:
    (rows {prompt_id, reason}, counts {'prompts', 'held_out', 'no_trajectory', 'sft_items', 'fraction'}).
  """
  in_sft = {str(r['prompt_id']) for r in sft_records}
  walks_in_sft = {walk_id(p) for p in in_sft}
  rows = [{'prompt_id': r['prompt_id'],
           'reason': HELD_OUT if rl_held_out(r['prompt_id'], fraction, seed) else NO_TRAJECTORY}
          for r in items if not r['rejected'] and walk_id(r['prompt_id']) not in walks_in_sft]
  counts = {'prompts': len(rows), HELD_OUT: sum(r['reason'] == HELD_OUT for r in rows),
            NO_TRAJECTORY: sum(r['reason'] == NO_TRAJECTORY for r in rows), 'sft_items': len(in_sft),
            'fraction': fraction}
  return rows, counts


def sharegpt(records: list[dict], path: pathlib.Path, tool_config: dict, system_prompt: str | None) -> dict:
  """The `sft` records also as the official release's ShareGPT SFT file (`official.write_sft`), written when
  `path` is missing (a resumed build keeps the file it has).

  Returns:
    counts {'written', 'skipped', 'images', 'resumed'} ('written' = the file's lines when resumed).
  """
  if path.is_file():
    return {'written': sum(1 for line in path.read_text().splitlines() if line.strip()), 'resumed': True}
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.data import official
  from tools import env as env_lib
  trajectories = [traj_lib.Trajectory.from_record(r) for r in records]
  return dict(official.write_sft(trajectories, path, env_lib.ToolEnv(tool_config).schemas(), system_prompt),
              resumed=False)

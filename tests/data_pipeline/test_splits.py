"""The `rl` split is disjoint from the `sft` split (`data_pipeline.splits`): an RL prompt never comes from an item
that produced an SFT trajectory, whatever the hold-out says."""

import pytest

from data_pipeline import splits
from osvl_jax.data import benchmarks


def _items(n):
  return [{'prompt_id': f'wiki-{i}', 'rejected': None} for i in range(n)] + [{'prompt_id': 'bad', 'rejected': 'leak'}]


def test_the_hold_out_is_the_hashed_fraction_and_only_the_rest_is_synthesised():
  items = _items(400)
  held = {r['prompt_id'] for r in items if not r['rejected'] and splits.rl_held_out(r['prompt_id'], 0.25, 7)}
  assert held == {r['prompt_id'] for r in items[:-1] if benchmarks.holdout_key('rl7', r['prompt_id']) < 0.25}
  assert 70 < len(held) < 130                                      # ~ 0.25 x 400
  assert held != {r['prompt_id'] for r in items[:-1] if splits.rl_held_out(r['prompt_id'], 0.25, 8)}   # seeded
  todo = splits.synthesis_items(items, 0.25, 7)
  assert {r['prompt_id'] for r in todo} == {r['prompt_id'] for r in items} - held   # rejected rows pass through
  assert splits.synthesis_items(items, 0.0, 7) == items


@pytest.mark.parametrize('fraction', [0.0, 0.3])
def test_rl_prompts_are_the_accepted_items_with_no_trajectory(fraction):
  items = _items(40)
  synthesised = splits.synthesis_items(items, fraction, 0)
  # The expert kept trajectories (two samples) for every other synthesised item; plus one held-out item that an
  # older build synthesised all the same: it is an SFT item, so never an RL prompt.
  sft = [{'prompt_id': r['prompt_id']} for r in synthesised[::2] if not r['rejected']] * 2
  held = [r for r in items if not r['rejected'] and splits.rl_held_out(r['prompt_id'], fraction, 0)]
  if held:
    sft.append({'prompt_id': held[0]['prompt_id']})
  rows, counts = splits.rl_split(items, sft, fraction, 0)
  rl_ids, sft_ids = [r['prompt_id'] for r in rows], {r['prompt_id'] for r in sft}
  assert not set(rl_ids) & sft_ids and 'bad' not in rl_ids and len(rl_ids) == len(set(rl_ids))
  assert set(rl_ids) | sft_ids == {r['prompt_id'] for r in items if not r['rejected']}
  assert counts['prompts'] == len(rows) and counts['sft_items'] == len(sft_ids)
  assert counts['held_out'] == len(held) - (1 if held else 0)
  assert counts['no_trajectory'] == len(rows) - counts['held_out']
  assert {r['reason'] for r in rows} <= {splits.HELD_OUT, splits.NO_TRAJECTORY}


def test_without_synthesis_every_accepted_item_is_an_rl_prompt():
  rows, counts = splits.rl_split(_items(5), [], 0.5, 0)
  assert [r['prompt_id'] for r in rows] == [f'wiki-{i}' for i in range(5)] and counts['prompts'] == 5


def test_the_items_of_one_walk_share_a_split():
  # qa.add_qa's attributes_per_path: 'wiki-s0-00012' asks Egypt's capital, 'wiki-s0-00012-currency' its currency.
  assert splits.walk_id('wiki-s0-00012-currency') == splits.walk_id('wiki-s0-00012-calling_code') == 'wiki-s0-00012'
  assert splits.walk_id('wiki-s0-00012') == 'wiki-s0-00012' and splits.walk_id('vqa-0-capitals') == 'vqa-0-capitals'
  assert splits.item_id('wiki-s0-00012', 'largest_city') == 'wiki-s0-00012-largest_city'
  assert splits.walk_id(splits.item_id('wiki-s0-00012', 'largest_city')) == 'wiki-s0-00012'
  walks = [f'wiki-s0-{i:05d}' for i in range(200)]
  items = [{'prompt_id': p + suffix, 'rejected': None} for p in walks for suffix in ('', '-currency', '-tld')]
  held = [[splits.rl_held_out(p + s, 0.3, 0) for s in ('', '-currency', '-tld')] for p in walks]
  assert all(len(set(h)) == 1 for h in held) and 30 < sum(h[0] for h in held) < 90   # ~ 0.3 x 200 walks
  # An item the expert failed on (no trajectory) is no RL prompt when another item of its walk is an SFT item.
  sft = [{'prompt_id': r['prompt_id']} for r in splits.synthesis_items(items, 0.3, 0) if r['prompt_id'][-4:] != '-tld']
  rows, _ = splits.rl_split(items, sft, 0.3, 0)
  rl_walks, sft_walks = {splits.walk_id(r['prompt_id']) for r in rows}, {splits.walk_id(r['prompt_id']) for r in sft}
  assert not rl_walks & sft_walks and len(rows) == 3 * len(rl_walks) == 3 * sum(h[0] for h in held)

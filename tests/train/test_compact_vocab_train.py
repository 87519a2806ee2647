"""`config.model.vocab`: SFT on a dataset's compact vocabulary, its checkpoint, and the config checks of the field."""

import json

import numpy as np
import pytest

from osvl_jax import checkpoints
from osvl_jax.train import metrics, policy_config, sft
from tests.train import test_train


def _config(data_dir):
  """The demo config on `data_dir`, one SFT step of 2 rows, one decoder layer (compiles faster)."""
  c = test_train._config(data_dir, 1)
  c.sft.warmup_steps = 0
  c.model.text.num_hidden_layers = 1
  return c


@pytest.fixture(scope='module')
def trajectories():
  return test_train._episodes([test_train.SEARCH, test_train.ANSWER])


def _vocab(trajectories) -> list[int]:
  return sorted({int(i) for t in trajectories for i in t.token_ids})


def test_sft_with_the_datasets_vocabulary_trains_a_compact_model(trajectories, tmp_path):
  data = tmp_path / 'data'
  test_train._write_sft_dataset(trajectories, data)
  vocab = _vocab(trajectories)
  (data / 'vocab_ids.json').write_text(json.dumps(vocab))
  config = _config(data)
  config.model.vocab = 'dataset'
  model = sft.train(config, tmp_path / 'w')
  assert model.config.text.vocab_ids == tuple(vocab)
  assert model.language_model.embed_tokens.embedding[...].shape == (len(vocab), 64)
  # Eq. 8 at init: the mean NLL of a random model is about log(rows), here ~5.2, not log(151936) ~ 11.9.
  (row,) = metrics.read_metrics(tmp_path / 'w', 'sft')
  assert abs(row['loss'] - np.log(len(vocab))) < 1.0
  restored, _ = checkpoints.load_policy('sft', workdir=tmp_path / 'w')   # what GRPO / serve / evaluate load
  assert restored.config.text.vocab_ids == tuple(vocab)
  np.testing.assert_array_equal(restored.language_model.embed_tokens.embedding[...],
                                model.language_model.embed_tokens.embedding[...])


def test_sft_refuses_a_trajectory_outside_the_vocabulary_naming_it(trajectories, tmp_path):
  data = tmp_path / 'data'
  test_train._write_sft_dataset(trajectories, data)
  vocab = _vocab(trajectories)
  missing = int(trajectories[1].token_ids[-3])
  (tmp_path / 'vocab.json').write_text(json.dumps([i for i in vocab if i != missing]))
  config = _config(data)
  config.model.vocab = str(tmp_path / 'vocab.json')
  with pytest.raises(ValueError, match=rf"SFT trajectory 'q0' \(sample 0\): token id {missing} .* is outside the "
                                       rf'compact vocabulary of {len(vocab) - 1} ids'):
    sft.train(config, tmp_path / 'w')
  assert not (tmp_path / 'w' / 'sft_ckpt').exists()


@pytest.mark.parametrize('vocab, content, match', [
    ('words', None, "'words': expected 'full', 'dataset' or the path"),
    ('{tmp}/absent.json', None, 'cannot read the vocabulary'),
    ('{tmp}/v.json', '{"ids": [1, 2]}', 'must hold a non-empty JSON list of Qwen ids'),
    ('{tmp}/v.json', '[1, 2.5]', 'must hold a non-empty JSON list of Qwen ids'),
    ('{tmp}/v.json', '[1, 151936]', r'ids in \[0, 151936\)'),
    ('{tmp}/v.json', '[]', 'non-empty'),
    ('dataset', None, 'cannot read the vocabulary .*data/vocab_ids.json'),   # data.dir without the file
])
def test_model_vocab_is_checked_naming_the_field(tmp_path, vocab, content, match):
  if content is not None:
    (tmp_path / 'v.json').write_text(content)
  config = _config(tmp_path / 'data')
  config.model.vocab = vocab.format(tmp=tmp_path)
  with pytest.raises(ValueError, match='model.vocab=.*' + match):
    policy_config.check_model_config(config)


def test_model_vocab_full_and_a_valid_file_pass_the_checks(tmp_path):
  (tmp_path / 'v.json').write_text('[5, 3, 3, 151935]')
  config = _config(tmp_path / 'data')
  policy_config.check_model_config(config)   # 'full', the demo's
  config.model.vocab = str(tmp_path / 'v.json')
  policy_config.check_model_config(config)
  assert checkpoints.vocab_ids(config) == (3, 5, 151935)   # sorted, unique


def test_grpo_reads_observation_ids_outside_the_vocabulary_as_endoftext(trajectories):
  """A tool's text outside the vocabulary, after the last emitted token or before one: the trajectory stays (its
  reward counts in its group), those ids become <|endoftext|> as the sampler read them; an emitted id outside the
  vocabulary is refused, naming the trajectory."""
  import dataclasses
  from osvl_jax import trajectory as tj
  from osvl_jax.models.qwen3_vl import config as config_lib
  from osvl_jax.train import policy
  vocab = _vocab(trajectories)
  outside = max(vocab) + 1        # an id the world never listed
  t = trajectories[1]
  last_emitted = int(np.flatnonzero(t.gen_mask)[-1])
  tail = np.array([tj.IM_START_ID, outside, tj.IM_END_ID], t.token_ids.dtype)   # an observation past the end
  echo = dataclasses.replace(
      t, token_ids=np.concatenate([t.token_ids, tail]), gen_mask=np.concatenate([t.gen_mask, np.zeros(3, bool)]),
      step_of_token=np.concatenate([t.step_of_token, np.full(3, t.step_of_token[-1], t.step_of_token.dtype)]),
      rollout_logprobs=None if t.rollout_logprobs is None else np.concatenate([t.rollout_logprobs, np.zeros(3)]))
  last_emitted = len(t.token_ids) - 1 + 2   # the index of `outside`
  text = dataclasses.replace(config_lib.Qwen3VLConfig.tiny().text, vocab_ids=tuple(vocab))
  model = type('M', (), {'config': dataclasses.replace(config_lib.Qwen3VLConfig.tiny(), text=text)})()
  kept, changed = policy.mask_out_of_vocabulary(model, [trajectories[0], echo])
  assert changed == 1 and [t.prompt_id for t in kept] == ['q0', 'q1']
  assert kept[0] is trajectories[0] and kept[1].token_ids[last_emitted] == tj.ENDOFTEXT_ID
  np.testing.assert_array_equal(np.delete(kept[1].token_ids, last_emitted), np.delete(echo.token_ids, last_emitted))
  gen = np.asarray(t.gen_mask, bool)
  before = int(np.flatnonzero(~gen & (np.arange(len(gen)) < np.flatnonzero(gen)[-1]))[-1])
  seen = dataclasses.replace(t, token_ids=t.token_ids.copy())
  seen.token_ids[before] = outside   # an observation id the policy read before emitting: <|endoftext|>
  (masked,), changed = policy.mask_out_of_vocabulary(model, [seen])
  assert changed == 1 and masked.token_ids[before] == tj.ENDOFTEXT_ID
  np.testing.assert_array_equal(np.delete(masked.token_ids, before), np.delete(t.token_ids, before))
  emitted = dataclasses.replace(t, token_ids=t.token_ids.copy())
  emitted.token_ids[int(np.flatnonzero(t.gen_mask)[-1])] = outside   # an id the policy cannot have emitted: refused
  with pytest.raises(ValueError, match=rf"trajectory 'q1' \(sample 0\), its emitted ids: token id {outside}"):
    policy.mask_out_of_vocabulary(model, [emitted])
  full = type('M', (), {'config': config_lib.Qwen3VLConfig.tiny()})()
  assert policy.mask_out_of_vocabulary(full, trajectories) == (list(trajectories), 0)


def test_a_batch_that_failed_after_policy_turns_is_trained_on_one_with_no_policy_token_is_refused(trajectories):
  """Episodes that ended on an engine error after a policy turn are still a batch to train on (low rewards); only a
  batch without any policy token is refused."""
  import dataclasses
  from osvl_jax.train import rollouts
  failed = [dataclasses.replace(t, stop_reason='error', error='engine failed at step 1') for t in trajectories]
  rollouts.check_not_all_failed(failed)
  prompt_only = [dataclasses.replace(t, gen_mask=np.zeros_like(t.gen_mask)) for t in failed]
  with pytest.raises(RuntimeError, match='all 2 trajectories ended on an error before a policy token'):
    rollouts.check_not_all_failed(prompt_only)

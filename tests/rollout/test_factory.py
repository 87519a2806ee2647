"""`rollout.factory.make_engine`: the one way an engine is built from a rollout section, its checks, and the refusal
of a text-only engine for RL."""

import ml_collections
import pytest

from osvl_jax.rollout import factory
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.remote import openai_engine, sglang_client


def section(**fields):
  base = {'max_new_tokens': 16, 'max_total_tokens': 256}
  return ml_collections.ConfigDict({**base, **fields})


def test_embedded_samples_the_given_model_with_the_section_settings(model, tokenizer):
  engine = factory.make_engine(section(temperature=0.0, top_p=0.5, prefix_cache_slots=2), tokenizer, model=model,
                               seed=3)
  assert isinstance(engine, jax_sampler.JaxSampler)
  assert (engine.max_new_tokens, engine.max_len, engine.temperature, engine.top_p) == (16, 272, 0.0, 0.5)
  with pytest.raises(ValueError, match='none was given'):
    factory.make_engine(section(), tokenizer)


def test_sglang_takes_a_url_list_or_a_comma_string_and_admin_urls(tokenizer):
  engine = factory.make_engine(section(engine='sglang', urls='http://a:1, http://b:2', admin_urls=('http://w:3',),
                                       retries=1, timeout_s=5.0, max_concurrency=7, temperature=0.7), tokenizer)
  assert isinstance(engine, sglang_client.SGLangEngine)
  assert engine.urls == ['http://a:1', 'http://b:2'] and engine.admin_urls == ['http://w:3']
  assert (engine.retries, engine.concurrency, engine.temperature, engine.top_p) == (1, 7, 0.7, 1.0)


def test_openai_names_its_endpoint_and_reads_the_key_from_the_named_variable(tokenizer, monkeypatch):
  monkeypatch.setenv('MY_KEY', 'sk-test')
  engine = factory.make_engine(section(engine='openai', base_url='http://h:1/v1/', model='m', api_key_env='MY_KEY'),
                               tokenizer)
  assert isinstance(engine, openai_engine.OpenAIEngine)
  assert (engine.base_url, engine.model, engine.max_new_tokens) == ('http://h:1/v1', 'm', 16)
  assert engine.client.api_key == 'sk-test' and 'sk-test' not in repr(engine.client)
  assert engine.weight_updates is None and engine.continuous_batching


def test_rl_refuses_the_openai_engine_saying_why(tokenizer):
  s = section(engine='openai', base_url='http://h:1/v1', model='m')
  with pytest.raises(ValueError, match=r"rollout.engine='openai' cannot roll out for RL: GRPO trains on the "
                     r"policy's own token ids and their log-probs"):
    factory.make_engine(s, tokenizer, training=True)
  assert factory.check_engine_config(s) == 'openai'   # evaluation and the expert may use it


@pytest.mark.parametrize('fields, match', [
    ({'engine': 'vllm'}, r"rollout.engine='vllm': expected one of \('embedded', 'sglang', 'openai'\)"),
    ({'engine': 'sglang'}, 'rollout.urls is empty'),
    ({'engine': 'sglang', 'urls': '127.0.0.1:30000'}, 'rollout.urls'),
    ({'engine': 'openai', 'base_url': 'http://h:1/v1'}, r'rollout.base_url \(with /v1\) and rollout.model'),
    ({'engine': 'openai', 'base_url': 'h:1/v1', 'model': 'm'}, 'rollout.base_url'),
    ({'prefix_cache_slots': -1}, 'rollout.prefix_cache_slots=-1'),
    ({'engine': 'sglang', 'urls': 'http://h:1', 'retries': -1}, 'rollout.retries=-1'),
    ({'engine': 'sglang', 'urls': 'http://h:1', 'timeout_s': 0}, 'rollout.timeout_s=0'),
])
def test_a_bad_engine_field_is_refused_naming_it(fields, match):
  with pytest.raises(ValueError, match=match):
    factory.check_engine_config(section(**fields))


def test_a_nested_section_is_named_by_its_path():
  with pytest.raises(ValueError, match=r'data.synthesize.engine'):
    factory.check_engine_config(section(engine='x'), path='data.synthesize')

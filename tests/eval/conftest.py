"""Shared parts of the eval tests: the real tokenizer, a ToolEnv, the eval config made small, a scripted answer
and a counting judge (a test double of the LLM judge, built on the `judges.base.Judge` interface)."""

import importlib.util
import pathlib

import pytest

from osvl_jax import trajectory as tj
from osvl_jax.judges import base as judges_base
from tools import env as tools_env

_spec = importlib.util.spec_from_file_location('eval_config', pathlib.Path(__file__).parents[2] / 'configs/eval.py')
eval_config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_config)


@pytest.fixture(scope='module')
def tokenizer():
  return tj.load_tokenizer()


@pytest.fixture(scope='module')
def env():
  return tools_env.ToolEnv({'enabled': ('text_search', 'crop', 'sharpen', 'perspective_correct')})


def small_config(**kw):
  c = eval_config.get_config()
  c.benchmarks = ('fvqa', 'mmsearch')
  c.max_items_per_benchmark = 3
  c.batch_size = 2
  c.progress = False
  c.max_tool_calls = 2
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64
  c.update(kw)
  return c


SCRIPT = ['<think>look closer</think>\n<tool_call>{"name": "crop", "arguments": {"image": "img_1", "x": 0, "y": 0, '
          '"width": 0.5, "height": 0.5}}</tool_call>',
          '<think>done</think>\n<response>Tagus River</response>']


class CountingJudge(judges_base.Judge):
  """Records every accuracy call; raises KeyboardInterrupt (a kill) at call number `kill_at`."""
  name = 'counting'

  def __init__(self, kill_at=None, error=False):
    super().__init__()
    self.judged, self.kill_at, self.error = [], kill_at, error

  def accuracy(self, question, response, answers, *, hints=None):
    if self.kill_at is not None and len(self.judged) + 1 == self.kill_at:
      raise KeyboardInterrupt('killed')
    self.judged.append(question)
    if self.error:
      return judges_base.Verdict(0.0, 'JudgeParseError: no Correct/Incorrect verdict', 'Maybe.')
    return judges_base.Verdict(float('Tagus' in response and 'Tagus River' in answers))

  def query_quality(self, question, tool_calls, results, *, answers=(), response=None):
    return judges_base.Verdict(0.0)



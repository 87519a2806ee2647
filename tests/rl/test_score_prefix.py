"""r_fmt and r_query see only the pre-fatal prefix (DESIGN.md §6; osvl_jax/train/rollouts.py `score`).

Question 'Which city?' (content words: {'city'}); steps: text_search('Agra') -> ok, then three calls to the unknown
tool `browse` (execution errors). Rule judge r_query (osvl_jax/judges/rule.py) = mean(success, novelty, grounding):
  prefix of 1 step (f_i = 1, 'first'):  success 1, novelty 1, grounding 0 ('agra' ∉ {'city'})  -> 2/3
  prefix of 3 steps (f_i = 3, 'kth'):   success 1/3, novelty 2/3 (the 2nd browse repeats), grounding 0 -> 1/3
  all 4 steps (the fault):              success 1/4, novelty 2/4, grounding 0                  -> 1/4
  prefix of 0 steps (f_i = 0):          no calls -> 0
r_fmt = mean format_ok over the prefix: the search step is well formed and ok -> 1; the browse steps are not.
No final response -> r_acc = 0, so r = r_fmt · 0.2 · r_query.
"""

import threading

import pytest

from osvl_jax import trajectory as tj
from osvl_jax.judges import base as judges_base
from osvl_jax.train import rollouts
from tools import base

SEARCH = tj.render_assistant_text('Look.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
BAD = tj.render_assistant_text('Try.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
OK = base.ToolResult(ok=True, text='[1] Agra: a city.')
ERR = base.error('unknown_tool', 'no tool named browse')


def _trajectory(fatal_step):
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start('Which city?', None)
  for text, result in [(SEARCH, OK), (BAD, ERR), (BAD, ERR), (BAD, ERR)]:
    builder.append_assistant_text(text)
    builder.append_observation(result)
  return builder.finish(prompt_id='p', answers=['Agra'], fatal_step=fatal_step)


@pytest.mark.parametrize('fatal_step, r_fmt, r_query', [
    (1, 1.0, 2 / 3),
    (3, 1 / 3, 1 / 3),
    (0, 0.0, 0.0),
    (None, 1 / 4, 1 / 4),  # non-fatal (not a real rollout: K = 3 would have stopped it): every step counts
])
def test_rule_judge_scores_the_prefix_only(fatal_step, r_fmt, r_query):
  s = rollouts.score(_trajectory(fatal_step))
  assert s['r_fmt'] == pytest.approx(r_fmt)
  assert s['r_query'] == pytest.approx(r_query)
  assert s['r_acc'] == 0.0
  assert s['reward'] == pytest.approx(r_fmt * 0.2 * r_query)


class _RecordingJudge(judges_base.Judge):
  name = 'recording'

  def __init__(self):
    super().__init__()
    self.calls = None

  def accuracy(self, question, response, answers, *, hints=None):
    return judges_base.Verdict(0.0)

  def query_quality(self, question, tool_calls, results, *, answers=(), response=None):
    self.calls = (list(tool_calls), list(results), list(answers), response)
    return judges_base.Verdict(0.5)


def test_any_judge_receives_the_prefix_only():
  judge = _RecordingJudge()
  rollouts.score(_trajectory(1), judge=judge)
  calls, results, answers, response = judge.calls
  assert calls == [('text_search', {'query': 'Agra'})]
  assert [r.ok for r in results] == [True]
  assert (answers, response) == (['Agra'], None)   # the reference answers and the (absent) final response


class _BarrierJudge(_RecordingJudge):
  """Its `max_concurrency` query_quality calls must all be in flight at once to pass the barrier (else it times
  out)."""

  def __init__(self, max_concurrency):
    super().__init__()
    self.max_concurrency = max_concurrency
    self.barrier = threading.Barrier(max_concurrency, timeout=30)
    self.threads = set()

  def query_quality(self, question, tool_calls, results, *, answers=(), response=None):
    self.threads.add(threading.get_ident())
    if self.max_concurrency > 1:
      self.barrier.wait()
    return judges_base.Verdict(0.5)


@pytest.mark.parametrize('threads', [1, 3])
def test_score_all_asks_the_judge_for_max_concurrency_verdicts_at_once(threads):
  trajectories = [_trajectory(1)] * 3
  judge = _BarrierJudge(threads)
  scores = rollouts.score_all(trajectories, judge=judge)
  assert [s['r_query'] for s in scores] == [0.5] * 3
  assert len(judge.threads) == threads  # 1: all in the caller's thread (the rule judge's default)

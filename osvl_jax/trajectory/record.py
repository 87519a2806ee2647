"""The Trajectory record: `Step`, `Trajectory`, and its storage (HF `datasets` rows, JSON lines) (DESIGN.md §4)."""

import base64
import dataclasses
import json
import os
from collections.abc import Iterator, Sequence

import numpy as np

from osvl_jax.trajectory.actions import ParsedAction
from osvl_jax.trajectory.images import ImageRef
from tools import image_io
from tools.base import ToolResult


class TrajectoryError(ValueError):
  """A trajectory breaks an invariant the trainer relies on (`validate_trajectory`); the message names each problem."""


class PromptTooLongError(TrajectoryError):
  """A rendered prompt exceeds its token budget; prompts are never cut (a cut could split an image span)."""


# Why an episode stopped (`Trajectory.stop_reason`). 'token_budget' and 'context_full' mean the token budget cut
# the episode short; 'error' means an append failed in a way no tool error can report (e.g. the policy emitted an
# id outside the vocabulary, or even the error observation could not be rendered): the trajectory ends at the last
# whole step and the other episodes of the batch go on; or that the prompt could not be rendered (a refused input
# image, a prompt over its budget): a prompt-only trajectory with no steps. `Trajectory.error` says why.
# 'time_budget': the episode's wall-clock budget (`rollout.max_seconds`) ran out; it ends at the last whole step.
# 'error' is also an engine failure (`Trajectory.error` = 'engine <class> failed at step <l>: ...').
STOP_REASONS = ('response', 'max_turns', 'fatal', 'token_budget', 'context_full', 'time_budget', 'error')
TRUNCATION_REASONS = ('token_budget', 'context_full', 'time_budget')


@dataclasses.dataclass
class Step:
  """One assistant turn l and what answered it.

  Attributes:
    index: l, 0-based.
    text: the decoded assistant turn (without the closing <|im_end|>).
    action: parse_action(text).
    result: the ToolResult of the call (None for a response, or a call never executed).
    format_ok: r_fmt^(l) of DESIGN §6 = action.format_ok and the result is not a tool-execution error.
    seconds: generation + tool wall time of the step (retries and their backoff included).
    env_retries: environment errors of this call retried before `result` came (`rollout.env_errors='retry'`),
      which the policy never saw.
  """
  index: int
  text: str
  action: ParsedAction
  result: ToolResult | None = None
  format_ok: bool = False
  seconds: float = 0.0
  env_retries: int = 0

  @property
  def is_execution_error(self) -> bool:
    """True when the tool result is an execution error (counts towards the fatal cascade)."""
    return self.result is not None and self.result.is_execution_error

  @property
  def is_environment_error(self) -> bool:
    """True when the tool result is an environment's execution error (timeout, http_error, backend_error)."""
    return self.result is not None and self.result.is_environment_error


@dataclasses.dataclass(eq=False)
class Trajectory:
  """One token-exact episode (DESIGN.md §4); T tokens, L+1 steps, I images.

  Attributes:
    prompt_id: group key (all samples of one prompt share it).
    sample_index: index of the sample within its group.
    token_ids: int32 [T].
    gen_mask: bool [T], True on tokens the policy emitted (Eq. 8's M_gen).
    step_of_token: int32 [T], the step l of each token, -1 on the initial prompt.
    images: I ImageRefs in order of appearance (img_1 = the input image, then tool outputs).
    steps: the steps l = 0..L.
    final_response: the response text of the last step, None if the episode did not answer.
    fatal_step: f_i, None when non-fatal.
    rollout_logprobs: float32 [T] from the engine (0 off gen_mask) or None.
    policy_version: version of the weights that produced it: the oldest of `token_versions` when the engine
      reported versions (a turn can straddle a weight update, DESIGN.md §6b), else what the loop was given.
    token_versions: int32 [T], the weight version of each emitted token (-1 off gen_mask), or None when the engine
      did not report versions for every turn.
    question: the user question.
    answers: accepted answers (may be empty at inference).
    stop_reason: why the episode ended, one of `STOP_REASONS` ('response', 'max_turns', 'fatal',
      'token_budget': the next step would not fit `max_total_tokens` or `max_response_tokens`, so the trajectory
      ends at the last whole step; 'context_full': the engine's context is full; 'time_budget': the wall-clock budget ran out, the
      trajectory ends at the last whole step; 'error': an append failed and could not be reported as a tool
      error, or the engine failed, the trajectory ends at the last whole step), or None when not produced by the agent loop (SFT
      data, hand-built). `truncated` is True for the budget reasons.
    error: why, for stop_reason 'error' (else None). A prompt that could not be rendered (an input image the
      processor refuses, a prompt over its budget) gives a prompt-only trajectory with no steps: its ids are the
      prompt without what failed (see `rollout.agent_loop.run_episodes`).
  """
  prompt_id: str
  sample_index: int
  token_ids: np.ndarray
  gen_mask: np.ndarray
  step_of_token: np.ndarray
  images: list[ImageRef]
  steps: list[Step]
  final_response: str | None = None
  fatal_step: int | None = None
  rollout_logprobs: np.ndarray | None = None
  policy_version: int = 0
  token_versions: np.ndarray | None = None
  question: str = ''
  answers: list[str] = dataclasses.field(default_factory=list)
  stop_reason: str | None = None
  error: str | None = None

  @property
  def num_tokens(self) -> int:
    return int(self.token_ids.shape[0])

  @property
  def truncated(self) -> bool:
    """True when a token or time budget ended the episode (the steps that did not fit were dropped whole)."""
    return self.stop_reason in TRUNCATION_REASONS

  @property
  def execution_errors(self) -> list[bool]:
    """Per step: the tool result is an execution error (input of `rl.fatal.fatal_step`)."""
    return [s.is_execution_error for s in self.steps]

  @property
  def environment_errors(self) -> list[bool]:
    """Per step: the tool result is an environment error (`rl.fatal.cut_by_environment`)."""
    return [s.is_environment_error for s in self.steps]

  @property
  def step_format_ok(self) -> list[bool]:
    """Per step: r_fmt^(l) (input of `rl.rewards.format_reward`)."""
    return [s.format_ok for s in self.steps]

  @property
  def image_grid_thw(self) -> np.ndarray:
    """int32 [I, 3]."""
    return np.array([im.grid_thw for im in self.images], np.int32).reshape(-1, 3)

  @property
  def pixel_values(self) -> np.ndarray:
    """float32 [sum N_i, 1536], all images' patches concatenated in order."""
    if not self.images:
      return np.zeros((0, 3 * 2 * 16 * 16), np.float32)
    return np.concatenate([im.pixel_values for im in self.images], axis=0)

  def decode(self, tokenizer) -> str:
    """The whole sequence as text (for logs; never re-tokenize it for training)."""
    return tokenizer.decode(self.token_ids.tolist(), skip_special_tokens=False)

  def to_record(self) -> dict:
    """A dict of plain Python values for HF `datasets` (use `record_features()` as the schema).

    Images become PNG bytes + grid (pixel_values are recomputed on load); tool images are not stored twice:
    they are the images after the prompt's, in order, reattached by `from_record`. `to_json` is the same record
    as one JSON line (PNG bytes base64-encoded).
    """
    return {
        'prompt_id': str(self.prompt_id),
        'sample_index': int(self.sample_index),
        'question': self.question,
        'answers': [str(a) for a in self.answers],
        'token_ids': np.asarray(self.token_ids, np.int32).tolist(),
        'gen_mask': np.asarray(self.gen_mask, bool).tolist(),
        'step_of_token': np.asarray(self.step_of_token, np.int32).tolist(),
        'images': [{
            'png': im.to_png(),
            'grid_thw': np.asarray(im.grid_thw, np.int32).tolist(),
            'patch_size': im.patch_size,
            'temporal_patch_size': im.temporal_patch_size,
            'merge_size': im.merge_size,
        } for im in self.images],
        'steps': [_step_to_record(s) for s in self.steps],
        'final_response': self.final_response,
        'fatal_step': -1 if self.fatal_step is None else int(self.fatal_step),
        'rollout_logprobs': (None if self.rollout_logprobs is None else
                             np.asarray(self.rollout_logprobs, np.float32).tolist()),
        'policy_version': int(self.policy_version),
        'token_versions': (None if self.token_versions is None else
                           np.asarray(self.token_versions, np.int32).tolist()),
        'stop_reason': self.stop_reason,
        'error': self.error,
    }

  def to_json(self) -> str:
    """`to_record()` as one line of JSON: each `images[i].png` is the base64 (RFC 4648, padded) of the PNG bytes."""
    record = self.to_record()
    record['images'] = [{**im, 'png': base64.b64encode(im['png']).decode('ascii')} for im in record['images']]
    return json.dumps(record, ensure_ascii=False, separators=(',', ':'))

  @classmethod
  def from_json(cls, line: str) -> 'Trajectory':
    """Inverse of `to_json`."""
    return cls.from_record(json.loads(line))

  @classmethod
  def from_record(cls, record: dict) -> 'Trajectory':
    """Inverse of `to_record` (also accepts rows read back from HF `datasets`, and base64 PNG strings)."""
    images = []
    for i, im in enumerate(record['images']):
      png = im['png']
      if isinstance(png, str):
        png = base64.b64decode(png)
      pixels = image_io.load_image(png)
      try:
        images.append(ImageRef.from_pixels_and_grid(
            pixels, im['grid_thw'], int(im.get('patch_size', 16)), int(im.get('temporal_patch_size', 2)),
            int(im.get('merge_size', 2))))
      except ValueError as e:
        raise ValueError(f'record {record.get("prompt_id")!r}: image {i + 1}: {e}') from e
    num_prompt_images = len(images) - sum(int(s['result_num_images']) for s in record['steps'] if s.get('has_result'))
    steps, next_image = [], max(num_prompt_images, 0)
    for s in record['steps']:
      step = _step_from_record(s)
      if step.result is not None:
        k = int(s['result_num_images'])
        step.result.images = [im.pixels for im in images[next_image:next_image + k]]
        next_image += k
      steps.append(step)
    logprobs = record.get('rollout_logprobs')
    versions = record.get('token_versions')
    fatal = record.get('fatal_step')
    return cls(
        prompt_id=record['prompt_id'], sample_index=int(record['sample_index']),
        token_ids=np.asarray(record['token_ids'], np.int32), gen_mask=np.asarray(record['gen_mask'], bool),
        step_of_token=np.asarray(record['step_of_token'], np.int32), images=images, steps=steps,
        final_response=record.get('final_response'),
        fatal_step=None if fatal is None or int(fatal) < 0 else int(fatal),
        rollout_logprobs=None if logprobs is None else np.asarray(logprobs, np.float32),
        policy_version=int(record.get('policy_version', 0)),
        token_versions=None if versions is None else np.asarray(versions, np.int32),
        question=record.get('question', ''),
        answers=list(record.get('answers') or []), stop_reason=record.get('stop_reason'),
        error=record.get('error'))


def _step_to_record(s: Step) -> dict:
  a, r = s.action, s.result
  return {
      'index': int(s.index), 'text': s.text, 'format_ok': bool(s.format_ok), 'seconds': float(s.seconds),
      'env_retries': int(s.env_retries),
      'kind': a.kind, 'think': a.think, 'name': a.name,
      'arguments_json': json.dumps(a.arguments, ensure_ascii=False, default=str), 'response': a.response,
      'action_error': a.error, 'action_format_ok': bool(a.format_ok), 'problems': list(a.problems),
      'has_result': r is not None,
      'result_ok': bool(r.ok) if r is not None else False,
      'result_error_kind': r.error_kind if r is not None else None,
      'result_text': r.text if r is not None else '',
      'result_seconds': float(r.seconds) if r is not None else 0.0,
      'result_num_images': len(r.images) if r is not None else 0,
  }


def _step_from_record(s: dict) -> Step:
  action = ParsedAction(
      think=s.get('think'), kind=s['kind'], name=s.get('name'), arguments=json.loads(s.get('arguments_json') or '{}'),
      response=s.get('response'), error=s.get('action_error'), format_ok=bool(s.get('action_format_ok')),
      problems=list(s.get('problems') or []))
  result = None
  if s.get('has_result'):
    result = ToolResult(ok=bool(s['result_ok']), error_kind=s.get('result_error_kind'), text=s.get('result_text', ''),
                        images=[], seconds=float(s.get('result_seconds', 0.0)))
  return Step(index=int(s['index']), text=s['text'], action=action, result=result, format_ok=bool(s['format_ok']),
              seconds=float(s.get('seconds', 0.0)), env_retries=int(s.get('env_retries') or 0))


def record_features():
  """The `datasets.Features` of `Trajectory.to_record()` (pass it when writing, so None columns keep types)."""
  import datasets  # pylint: disable=g-import-not-at-top
  v = datasets.Value
  step = {
      'index': v('int32'), 'text': v('string'), 'format_ok': v('bool'), 'seconds': v('float64'),
      'env_retries': v('int32'),
      'kind': v('string'), 'think': v('string'), 'name': v('string'), 'arguments_json': v('string'),
      'response': v('string'), 'action_error': v('string'), 'action_format_ok': v('bool'),
      'problems': datasets.List(v('string')), 'has_result': v('bool'), 'result_ok': v('bool'),
      'result_error_kind': v('string'), 'result_text': v('string'), 'result_seconds': v('float64'),
      'result_num_images': v('int32'),
  }
  image = {'png': v('binary'), 'grid_thw': datasets.List(v('int32')), 'patch_size': v('int32'),
           'temporal_patch_size': v('int32'), 'merge_size': v('int32')}
  return datasets.Features({
      'prompt_id': v('string'), 'sample_index': v('int32'), 'question': v('string'),
      'answers': datasets.List(v('string')), 'token_ids': datasets.List(v('int32')),
      'gen_mask': datasets.List(v('bool')), 'step_of_token': datasets.List(v('int32')),
      'images': datasets.List(image), 'steps': datasets.List(step), 'final_response': v('string'),
      'fatal_step': v('int32'), 'rollout_logprobs': datasets.List(v('float32')), 'policy_version': v('int64'),
      'token_versions': datasets.List(v('int32')), 'stop_reason': v('string'), 'error': v('string'),
  })



# JSON lines: one `Trajectory.to_json()` per line.

def write_jsonl(trajectories: Sequence[Trajectory], path: str | os.PathLike) -> None:
  """Writes one `Trajectory.to_json()` line per trajectory (UTF-8)."""
  with open(path, 'w', encoding='utf-8') as f:
    for traj in trajectories:
      f.write(traj.to_json() + '\n')


def read_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
  """Yields the trajectories of a file written by `write_jsonl` (blank lines skipped)."""
  with open(path, encoding='utf-8') as f:
    for line in f:
      if line.strip():
        yield Trajectory.from_json(line)

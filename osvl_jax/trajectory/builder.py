"""Append-only rendering of one episode into a Trajectory: `TrajectoryBuilder` (DESIGN.md §4).

The ids after each append start with the ids before it: earlier turns, <think> blocks included, stay in the
context exactly as emitted (no chat template re-renders them). Every append is transactional: one that raises
leaves the builder exactly as it was (no half observation, no half step).

Tokenization: the environment's text (template text, the question, tool output, image names) is tokenized the
way a Hugging Face tokenizer reads the whole rendered string: each maximal run of text between special tokens is
one string (`tokens._encode_parts`; 'city?' + '\n' -> '?\n' is one token). Every turn boundary is a special
token (`<|im_end|>`, `<|im_start|>`), and so is every image span's start, so a run never crosses a turn or an
image: the appends stay append-only. A context ends with '<|im_start|>assistant\n', as a served prompt with the
generation prompt does; the ids the policy then emits are kept as emitted. So the ids equal what the exported
chat template renders (`export_hf.chat_template`): a policy served by SGLang / vLLM sees the format it was
trained on.
"""

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from osvl_jax.trajectory.actions import PROFILES, ParsedAction, parse_action
from osvl_jax.trajectory.images import ImageProcessor, ImageRef
from osvl_jax.trajectory.record import STOP_REASONS, PromptTooLongError, Step, Trajectory
from osvl_jax.trajectory.tokens import (
    ADDED_TOKENS, EOS_IDS, IM_END_ID, IM_START_ID, IMAGE_PAD_ID, TOOL_RESPONSE_END_ID, TOOL_RESPONSE_ID,
    VISION_END_ID, VISION_IDS, VISION_START_ID, VOCAB_SIZE, _Untrusted, _encode, _encode_parts, model_input_ids)
from tools.base import ToolResult

DEFAULT_INSTRUCTIONS = (
    "You are a multimodal search agent. Images are named img_1 (the user's), img_2, ... in order of appearance. "
    'Each turn, reason in <think></think>, then give exactly one <tool_call></tool_call>, or '
    '<response>final answer</response> when sure.')

BUILDER_DEFAULT = 'builder_default'  # a config's `system_prompt` naming DEFAULT_INSTRUCTIONS


def system_prompt_text(spec: str | None) -> str:
  """The agent's instructions named by a config's `system_prompt` (one per run: pipeline synthesis, the SFT data,
  GRPO rollouts and evaluation render the same system turn): a versioned prompt of `osvl_jax/judges/prompts`
  ('agent_system_v3', the paper's agent prompt; 'agent_system' = the latest), or 'builder_default' / None for
  `DEFAULT_INSTRUCTIONS` (the demo's: short, for a CPU run).

  Raises:
    ValueError: naming the spec and the prompts present, for an unknown prompt.
  """
  if spec is None or spec == BUILDER_DEFAULT:
    return DEFAULT_INSTRUCTIONS
  from osvl_jax.judges import prompts  # pylint: disable=g-import-not-at-top
  try:
    return prompts.load(str(spec))
  except ValueError as e:
    raise ValueError(f"system_prompt={spec!r}: expected {BUILDER_DEFAULT!r} or an agent prompt ({e})") from e


_TOOLS_HEADER = ('\n\n# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n'
                 '<tools>\n')
_TOOLS_FOOTER = ('\n</tools>\n\nFor each function call, return a json object with function name and arguments '
                 'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
                 '"arguments": <args-json-object>}\n</tool_call>')


def render_system_text(tool_schemas: Sequence[dict], system_prompt: str | None = None) -> str:
  """The system turn's content: instructions, then the Hermes/Qwen3 tools section (one JSON line per schema)."""
  text = DEFAULT_INSTRUCTIONS if system_prompt is None else system_prompt
  if tool_schemas:
    text += _TOOLS_HEADER + '\n'.join(json.dumps(s, ensure_ascii=False) for s in tool_schemas) + _TOOLS_FOOTER
  return text


class TrajectoryBuilder:
  """Append-only construction of one Trajectory; the ids after each append start with the ids before it.

  Use: start(question, image); then per step: prompt_ids()/images -> engine -> append_assistant(ids) ->
  (tool call) append_observation(result); finally finish(...). `truncate(n)` drops whole steps from the end
  (token budgets: never a part of a step, an image span or a tool call).
  """

  def __init__(self, tokenizer, image_processor: ImageProcessor, tool_schemas: Sequence[dict],
               system_prompt: str | None = None, profile: str = 'osvl'):
    if profile not in PROFILES:
      raise ValueError(f'unknown tool-schema profile {profile!r}; expected one of {PROFILES}')
    self.tokenizer = tokenizer
    self.image_processor = image_processor
    self.tool_schemas = list(tool_schemas)
    self.system_prompt = system_prompt
    self.profile = profile
    self._ids: list[int] = []
    self._gen: list[bool] = []
    self._step: list[int] = []
    self._logprobs: list[float] = []
    self._step_logprobs: list[bool] = []  # per step: the engine gave log-probs
    self._versions: list[int] = []  # per token: weight version of an emitted token, -1 elsewhere
    self._step_versions: list[bool] = []  # per step: the engine gave versions
    self._images: list[ImageRef] = []
    self._steps: list[Step] = []
    self._marks: list[tuple[int, int]] = []  # per step: (tokens, images) before it began
    self.question: str | None = None

  # -- state -------------------------------------------------------------------------------------------------
  @property
  def images(self) -> list[ImageRef]:
    """Images so far, in order (img_1, img_2, ...)."""
    return list(self._images)

  @property
  def steps(self) -> list[Step]:
    return list(self._steps)

  @property
  def num_tokens(self) -> int:
    return len(self._ids)

  @property
  def done(self) -> bool:
    """True once the last step is a response."""
    return bool(self._steps) and self._steps[-1].action.kind == 'response'

  @property
  def awaiting_observation(self) -> bool:
    """True when the last step is a tool call / malformed call without a result yet."""
    return bool(self._steps) and self._steps[-1].action.kind != 'response' and self._steps[-1].result is None

  def prompt_ids(self) -> np.ndarray:
    """int32 [T]: the context for the next model call (ends with '<|im_start|>assistant\\n').

    These are `model_input_ids(token_ids, gen_mask)`: the trajectory's ids, except that a vision id the policy
    emitted reads as `<|vision_pad|>` (text), so the `<|image_pad|>` count always matches `images`.
    """
    return model_input_ids(np.asarray(self._ids, np.int32), np.asarray(self._gen, bool))

  # -- appends -----------------------------------------------------------------------------------------------
  def _append(self, ids: Sequence[int], gen: bool, step: int, logprobs: Sequence[float] | None = None,
              versions: Sequence[int] | None = None):
    self._ids.extend(int(i) for i in ids)
    self._gen.extend([gen] * len(ids))
    self._step.extend([step] * len(ids))
    self._logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))
    self._versions.extend([int(x) for x in versions] if versions is not None else [-1] * len(ids))

  @staticmethod
  def _image_span_parts(name: str, ref: ImageRef) -> list:
    """'\nimg_k: <|vision_start|><|image_pad|>×num_tokens<|vision_end|>' as `_encode_parts` pieces."""
    return ['\n', f'{name}: ', VISION_START_ID] + [IMAGE_PAD_ID] * ref.num_tokens + [VISION_END_ID]

  def _encode_parts(self, parts: list, what: str) -> list[int]:
    """`tokens._encode_parts`; ValueError naming `what` for text the tokenizer refuses (e.g. lone surrogates)."""
    try:
      return _encode_parts(self.tokenizer, parts)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f'{what} cannot be tokenized: {type(e).__name__}: {e}') from e

  def start(self, question: str, image: np.ndarray | Sequence[np.ndarray] | None,
            max_tokens: int | None = None) -> None:
    """Renders system + user turn + '<|im_start|>assistant\\n' (gen_mask 0, step -1).

    Args:
      question: the user question.
      image: uint8 [H, W, 3] input image (img_1), a list of them (img_1, img_2, ..., each on its own line), or
        None for a text-only question.
      max_tokens: the prompt budget; None for none.
    Each run of text between special tokens is tokenized as one string (`tokens._encode_parts`), the question
    as plain text (never added tokens): the ids are those the exported chat template gives (`export_hf`).
    Raises (transactional: the builder is unchanged, and `start` may be called again):
      PromptTooLongError: when the rendered prompt has more than `max_tokens` tokens. A prompt is never cut:
        cutting could leave an image span without the pads its grid needs.
      ValueError: an image the processor refuses (not uint8 RGB, empty, aspect ratio over 200, ...; the message
        names img_k), or a question the tokenizer refuses.
    """
    if self._ids:
      raise RuntimeError('TrajectoryBuilder.start called twice')
    system = render_system_text(self.tool_schemas, self.system_prompt)
    images = [] if image is None else list(image) if isinstance(image, (list, tuple)) else [image]
    refs = [self.image_processor.process(im, name=f'img_{k + 1}') for k, im in enumerate(images)]
    parts = [IM_START_ID, 'system\n' + system, IM_END_ID, '\n', IM_START_ID, 'user\n', _Untrusted(question or '')]
    for k, ref in enumerate(refs):
      parts += self._image_span_parts(f'img_{k + 1}', ref)
    parts += [IM_END_ID, '\n', IM_START_ID, 'assistant\n']
    ids = self._encode_parts(parts, 'the question')
    if max_tokens is not None and len(ids) > max_tokens:
      pads = sum(ref.num_tokens + 2 for ref in refs)
      raise PromptTooLongError(
          f'prompt has {len(ids)} tokens ({pads} of them in {len(refs)} image span(s)), over the '
          f'prompt budget of {max_tokens}; prompts and image spans are never cut: drop the prompt, shrink its '
          f'image (ImageProcessor.max_pixels) or raise the budget')
    # Commit.
    self.question = question
    self._images.extend(refs)
    self._append(ids, False, -1)

  def append_assistant(self, ids: Sequence[int], logprobs: Sequence[float] | None = None,
                       seconds: float = 0.0, cut: bool = False,
                       versions: Sequence[int] | None = None) -> ParsedAction:
    """Appends the ids the policy emitted for the next step (gen_mask 1) and parses them.

    Args:
      ids: int [n], should end with an end-of-sequence id (`<|im_end|>`, or Qwen's other one `<|endoftext|>`).
        Ids after the first end-of-sequence id are not part of the turn (generation stops there) and are
        dropped with their log-probs. If the turn does not end with `<|im_end|>` (length cut, or it ended with
        `<|endoftext|>`), `<|im_end|>` is appended with gen_mask 0 to close it.
      logprobs: float [n] engine log-probs of `ids`, or None.
      seconds: generation time of the step.
      versions: int [n] weight version of each id (`Generation.token_versions`, integers >= 0), or None.
      cut: the engine stopped at its per-turn limit (`max_new_tokens`, finish_reason 'length') before
        <|im_end|>. The turn is kept as emitted (the policy is accountable for it) but never executed: its
        action becomes 'malformed' with error 'turn cut at the token limit ...' (so a half-written tool call
        cannot run, and a half-written response is not an answer).
    A turn containing a vision id (`VISION_IDS`: `<|image_pad|>`, `<|vision_start|>`, `<|vision_end|>`,
    `<|video_pad|>`) is kept as emitted but is a malformed step, never executed; the model reads those ids as
    text (`prompt_ids`, `tokens.model_input_ids`), so they never break the pad/feature count.
    Returns:
      parse_action of the decoded text (the step is recorded; its result comes with append_observation).
    Raises:
      RuntimeError: out of order (before `start`, after a response, or while an observation is due).
      ValueError: `logprobs` / `versions` of another length than `ids`, a negative version, or an id outside
        [0, VOCAB_SIZE). The builder is unchanged when it raises.
    """
    self._check_can_act()
    try:
      ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    except (TypeError, ValueError, OverflowError) as e:
      raise ValueError(f'assistant ids are not integers: {e}') from e
    if logprobs is not None:
      logprobs = [float(x) for x in np.asarray(logprobs, np.float64).reshape(-1)]
      if len(logprobs) != len(ids):
        raise ValueError(f'{len(logprobs)} logprobs for {len(ids)} ids')
    if versions is not None:
      versions = [int(x) for x in np.asarray(versions).reshape(-1)]
      if len(versions) != len(ids) or any(x < 0 for x in versions):
        raise ValueError(f'versions must be one integer >= 0 per id: {len(versions)} for {len(ids)} ids')
    bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
    if bad:
      raise ValueError(f'assistant ids outside the vocabulary [0, {VOCAB_SIZE}): {bad[:5]}')
    stops = [k for k, i in enumerate(ids) if i in EOS_IDS]
    if stops:  # the turn ends at its first end-of-sequence id
      ids = ids[:stops[0] + 1]
      logprobs = None if logprobs is None else logprobs[:stops[0] + 1]
      versions = None if versions is None else versions[:stops[0] + 1]
    body = ids[:-1] if ids and ids[-1] in EOS_IDS else ids
    try:
      text = self.tokenizer.decode(body, skip_special_tokens=False)
    except Exception:  # pylint: disable=broad-except  # ids past the tokenizer's table decode to nothing
      text = self.tokenizer.decode([i for i in body if i < len(self.tokenizer)], skip_special_tokens=False)
    vision = sorted({ADDED_TOKENS[i][0] for i in body if i in VISION_IDS})
    action = self._parse(text, cut=cut and (not ids or ids[-1] not in EOS_IDS))
    if vision:
      why = (f'the turn contains {", ".join(vision)}: vision tokens are written by the environment only; '
             f'not executed')
      action = ParsedAction(think=action.think, kind='malformed', error=why, problems=action.problems + [why])
    # Commit (nothing above mutates the builder).
    step = len(self._steps)
    self._begin_step(logprobs is not None, versions is not None)
    self._append(ids, True, step, logprobs, versions)
    if not ids or ids[-1] != IM_END_ID:
      self._append([IM_END_ID], False, step)
    self._record_step(text, seconds, action)
    return action

  def append_assistant_text(self, text: str, seconds: float = 0.0) -> ParsedAction:
    """Appends an expert's assistant turn given as text (SFT data): its ids + <|im_end|>, all gen_mask 1."""
    self._check_can_act()
    ids = _encode(self.tokenizer, text) + [IM_END_ID]
    action = self._parse(text)
    step = len(self._steps)
    self._begin_step(False)
    self._append(ids, True, step)
    self._record_step(text, seconds, action)
    return action

  def _begin_step(self, has_logprobs: bool, has_versions: bool = False):
    self._marks.append((len(self._ids), len(self._images)))
    self._step_logprobs.append(has_logprobs)
    self._step_versions.append(has_versions)

  def truncate(self, num_steps: int) -> None:
    """Keeps only the first `num_steps` whole steps (assistant turn + observation), dropping the rest.

    The sequence then ends where step `num_steps` began (after an observation's '<|im_start|>assistant\\n'),
    with the images of the kept steps only; no step, tool call or image span is ever split.
    """
    if not 0 <= num_steps <= len(self._steps):
      raise ValueError(f'truncate({num_steps}): the builder has {len(self._steps)} steps')
    if num_steps == len(self._steps):
      return
    tokens, images = self._marks[num_steps]
    for buf in (self._ids, self._gen, self._step, self._logprobs, self._versions):
      del buf[tokens:]
    del self._images[images:]
    del self._steps[num_steps:]
    del self._marks[num_steps:]
    del self._step_logprobs[num_steps:]
    del self._step_versions[num_steps:]

  def _check_can_act(self):
    if not self._ids:
      raise RuntimeError('call TrajectoryBuilder.start first')
    if self.done:
      raise RuntimeError('the episode already ended with a response')
    if self.awaiting_observation:
      raise RuntimeError(f'step {len(self._steps) - 1} is a tool call: call append_observation first')

  def _parse(self, text: str, cut: bool = False) -> ParsedAction:
    action = parse_action(text, self.profile)
    if cut:
      why = 'turn cut at the token limit (max_new_tokens) before <|im_end|>; not executed'
      action = ParsedAction(think=action.think, kind='malformed', error=why, problems=action.problems + [why])
    return action

  def _record_step(self, text: str, seconds: float, action: ParsedAction) -> None:
    self._steps.append(Step(index=len(self._steps), text=text, action=action, result=None,
                            format_ok=action.format_ok, seconds=float(seconds)))

  def append_observation(self, result: ToolResult) -> list[str]:
    """Appends the tool result of the last step as a user turn, then '<|im_start|>assistant\\n'.

    Renders '\\n<|im_start|>user\\n<tool_response>\\n{text}\\nimg_k: <|vision_start|>…<|vision_end|>\\n
    </tool_response><|im_end|>\\n<|im_start|>assistant\\n' (gen_mask 0, step = the last step's index).
    Transactional: every image is processed and every id computed before anything is recorded, so an append
    that raises leaves the builder unchanged (the step still awaits its observation).

    Args:
      result: the ToolResult of the last step's call (a malformed call gets `error('malformed_call', …)`).
    Returns:
      the names given to the result's images (img_k, ...).
    Raises:
      RuntimeError: when no tool-call step awaits an observation.
      ValueError: when an image of `result` cannot be shown to the model (`ImageProcessor.process`: not uint8
        RGB, empty, aspect ratio over 200, ...; the message names the image), or its text cannot be tokenized.
    """
    if not self.awaiting_observation:
      raise RuntimeError('append_observation needs a preceding tool-call step without a result')
    step = self._steps[-1]
    l = step.index
    text = result.text if (result.text or result.error_kind is None) else f'Error: {result.error_kind}'
    parts = ['\n', IM_START_ID, 'user\n', TOOL_RESPONSE_ID, '\n', _Untrusted(str(text))]
    refs, names = [], []
    for image in result.images:
      name = f'img_{len(self._images) + len(refs) + 1}'
      refs.append(self.image_processor.process(image, name=name))  # ValueError naming the image
      names.append(name)
      parts += self._image_span_parts(name, refs[-1])
    parts += ['\n', TOOL_RESPONSE_END_ID, IM_END_ID, '\n', IM_START_ID, 'assistant\n']
    ids = self._encode_parts(parts, 'tool text')  # e.g. lone surrogates the tokenizer refuses
    # Commit.
    step.result = result
    step.format_ok = step.action.format_ok and not result.is_execution_error
    step.seconds += float(result.seconds)
    self._images.extend(refs)
    self._append(ids, False, l)
    return names

  def finish(self, prompt_id: str = '', sample_index: int = 0, answers: Sequence[str] = (),
             fatal_step: int | None = None, policy_version: int = 0, stop_reason: str | None = None,
             error: str | None = None) -> Trajectory:
    """The Trajectory so far (the builder may keep being used; the arrays are copies).

    final_response is the last step's response when it is one. A trailing observation's
    '<|im_start|>assistant\\n' stays in the sequence (gen_mask 0).

    Args:
      prompt_id, sample_index: group key and index in the group.
      answers: accepted answers.
      fatal_step: f_i from `rl.fatal.fatal_step` over `Trajectory.execution_errors`, or None.
      policy_version: weights version that produced the episode, used when the engine reported no per-token
        versions (with them, the trajectory's policy_version is its oldest token's).
      stop_reason: one of `STOP_REASONS` or None (see `Trajectory.stop_reason`).
      error: why the episode ended with stop_reason 'error' (`Trajectory.error`).
    """
    if stop_reason is not None and stop_reason not in STOP_REASONS:
      raise ValueError(f'stop_reason={stop_reason!r} is not one of {STOP_REASONS}')
    if not self._ids:
      raise RuntimeError('call TrajectoryBuilder.start first')
    if fatal_step is not None and not 0 <= fatal_step < max(len(self._steps), 1):
      raise ValueError(f'fatal_step={fatal_step} outside the {len(self._steps)} steps')
    final = self._steps[-1].action.response if self.done else None
    versions = None
    if self._steps and all(self._step_versions):
      versions = np.asarray(self._versions, np.int32)
      emitted = versions[np.asarray(self._gen, bool)]
      policy_version = int(emitted.min()) if emitted.size else policy_version
    return Trajectory(
        prompt_id=prompt_id, sample_index=int(sample_index), token_ids=np.asarray(self._ids, np.int32),
        gen_mask=np.asarray(self._gen, bool), step_of_token=np.asarray(self._step, np.int32),
        images=list(self._images), steps=[dataclasses.replace(s) for s in self._steps], final_response=final,
        fatal_step=fatal_step,
        rollout_logprobs=(np.asarray(self._logprobs, np.float32) if (self._steps and all(self._step_logprobs))
                          else None),
        policy_version=int(policy_version), token_versions=versions, question=self.question or '',
        answers=list(answers),
        stop_reason=stop_reason, error=error)


"""The generation interface shared by every policy engine (DESIGN.md §1.3).

An engine turns a batch of contexts (token ids the policy sees + the images those ids refer to) into one
assistant turn per context. Sampling engines: `jax_sampler.JaxSampler` (embedded, CPU/TPU, tests, demo) and the
SGLang HTTP client (GPU production). Text engines (`TextEngine`) write each turn as text and tokenize it:
`ScriptedEngine` below replays fixed texts (a test double of the policy for testing the agent loop without a
model), and `data_pipeline.synthesize.OracleEngine` is the pipeline's oracle expert.

Token exactness (DESIGN.md §4): `Generation.ids` are exactly the ids the policy emitted, including the stop
token when it stopped on an end-of-sequence id (`<|im_end|>` or `<|endoftext|>`, `EOS_IDS`); the agent loop
appends them verbatim to the trajectory, never re-tokenizing `Generation.text`.
"""

import abc
import asyncio
import concurrent.futures
import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from osvl_jax.trajectory import tokens as tokens_lib

IM_END_ID = tokens_lib.IM_END_ID  # <|im_end|>: end of an assistant turn.
EOS_IDS = tokens_lib.EOS_IDS  # <|im_end|> and <|endoftext|>: generation stops at either.

# finish_reason values.
FINISH_STOP = 'stop'          # emitted <|im_end|> or <|endoftext|> (the last id is that stop token).
FINISH_STOP_STRING = 'stop_string'  # the text reached one of the stop strings (last id completes it).
FINISH_LENGTH = 'length'      # max_new_tokens reached, or the context filled the engine's max_len.
FINISH_REASONS = (FINISH_STOP, FINISH_STOP_STRING, FINISH_LENGTH)


class Sampling(NamedTuple):
  """Sampling settings of one `Engine.generate` call (Tunix's per-call rollout config): they hold for that call only;
  an engine's own settings are its defaults for calls without one. Nobody sets them on an engine.

  Attributes:
    temperature: finite, >= 0 (0: greedy).
    top_p: nucleus mass in (0, 1] (1: no nucleus cut).
  """
  temperature: float = 1.0
  top_p: float = 1.0

  def checked(self) -> 'Sampling':
    """This, as floats. Raises ValueError naming the setting out of its range (a NaN temperature, top_p 0)."""
    temperature, top_p = float(self.temperature), float(self.top_p)
    if not (temperature >= 0 and np.isfinite(temperature)):
      raise ValueError(f'temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}')
    if not 0 < top_p <= 1:
      raise ValueError(f'top_p must be in (0, 1] (use temperature=0 for greedy), got {self.top_p!r}')
    return Sampling(temperature, top_p)


class Context(NamedTuple):
  """What the policy sees for one row: a plain tuple `(prompt_ids, images)` is accepted as well.

  Attributes:
    prompt_ids: int32 [T], the whole trajectory so far, ending with `<|im_start|>assistant\\n`.
    images: list of `trajectory.ImageRef` in order of appearance; their `<|image_pad|>` runs are in
      `prompt_ids` (one pad per merged patch, `prod(grid_thw) // merge_size**2`).
  """
  prompt_ids: np.ndarray
  images: Sequence[Any]


@dataclasses.dataclass
class Generation:
  """One assistant turn produced by an engine.

  Attributes:
    ids: int32 [N], the ids the policy emitted, including the stop token when it stopped on one of `EOS_IDS`.
    logprobs: float32 [N], log-probability of each emitted id (which distribution: see the engine's docstring;
      zeros for `ScriptedEngine`), or None for an engine without a distribution (the oracle expert): the
      trajectory's `rollout_logprobs` is then None.
    text: the decoded `ids` without special stop tokens (what the parser reads).
    finish_reason: one of `FINISH_REASONS`.
    weight_version: the weights that produced the turn (SGLang's `meta_info.weight_version`; the embedded
      sampler's `weight_version`), or None when unknown.
    weight_versions: per-token version spans `[{'version', 'start', 'end'}]` (output-token indices, end
      exclusive) when the weights changed during the turn (SGLang's `meta_info.weight_versions`), else None.
  """
  ids: np.ndarray
  logprobs: np.ndarray | None
  text: str
  finish_reason: str
  weight_version: str | None = None
  weight_versions: list | None = None

  def __post_init__(self):
    self.ids = np.asarray(self.ids, dtype=np.int32).reshape(-1)
    if self.logprobs is not None:
      self.logprobs = np.asarray(self.logprobs, dtype=np.float32).reshape(-1)
      if self.ids.shape != self.logprobs.shape:
        raise ValueError(f'ids {self.ids.shape} and logprobs {self.logprobs.shape} differ in length')
    if self.finish_reason not in FINISH_REASONS:
      raise ValueError(f'finish_reason={self.finish_reason!r} is not one of {FINISH_REASONS}')

  def token_versions(self) -> np.ndarray | None:
    """int64 [N]: the weight version of each emitted id (DESIGN.md §6b), or None when a version is unknown.

    Tokens a span of `weight_versions` covers take its version, the others `weight_version`. Versions are the
    integers the trainer publishes (`rollout.weight_publish`); a server version that is not an integer (SGLang's
    'default' before any update) counts as unknown.
    """
    def as_int(version) -> int | None:
      text = str(version).strip()
      return int(text) if text.lstrip('-').isdigit() else None

    base = None if self.weight_version is None else as_int(self.weight_version)
    out = np.full(self.ids.shape, -1 if base is None else base, np.int64)
    for span in self.weight_versions or ():
      try:
        version, start, end = as_int(span['version']), int(span['start']), int(span['end'])
      except (KeyError, TypeError, ValueError):
        return None
      if version is None:
        return None
      out[max(start, 0):max(end, 0)] = version
    return None if (out < 0).any() else out


class Engine(abc.ABC):
  """A policy that writes one assistant turn for each of a batch of contexts.

  What an engine does is declared here, never found by probing (Tunix's `BaseRollout`): sampling settings travel
  with each call (`Sampling`), reseeding is `reseed`, and weight updates are `weight_updates` + the method it names.

  Attributes:
    continuous_batching: False (in-process engines: `JaxSampler`, `TextEngine`): one `generate` call is one
      batch, so the asyncio agent loop gathers the episodes waiting for a turn into one call. True (a server
      that batches concurrent requests itself, `SGLangEngine`, `OpenAIEngine`): the loop sends each episode's turn
      on its own, as soon as that episode is ready.
    weight_updates: how published weights reach the engine (`weight_publish.WeightPublisher`): 'disk' (HTTP servers:
      `update_weights_from_disk(path, weight_version=...)` loads an exported folder, `SGLangEngine`), 'in_process'
      (`set_model(model, weight_version)` snapshots the trainer's model, `JaxSampler`), or None (an engine whose
      policy is fixed: scripted engines, an OpenAI endpoint; `WeightPublisher` refuses it).
  """
  continuous_batching: bool = False
  weight_updates: str | None = None

  def reseed(self, seed: int) -> None:
    """Restarts the engine's sampling randomness at `seed` (a PRNG key, for reproducible rollouts). Default:
    nothing to restart (servers sample with their own seeds; scripted engines do not sample)."""
    del seed

  def set_model(self, model, weight_version: str | None = None) -> None:
    """The in-process weight update (`weight_updates == 'in_process'`): later turns sample `model` and report
    `weight_version` (None: unchanged).

    Raises:
      NotImplementedError: an engine that takes no in-process updates (this default).
    """
    raise NotImplementedError(f'{type(self).__name__} takes no in-process weight updates '
                              f'(weight_updates={self.weight_updates!r})')

  def update_weights_from_disk(self, model_path: str, weight_version: str | None = None, **fields) -> list[dict]:
    """The weight update of servers (`weight_updates == 'disk'`): each loads the HF folder `model_path`.

    Returns:
      One answer per server.
    Raises:
      NotImplementedError: an engine that takes no updates from disk (this default).
    """
    del weight_version, fields
    raise NotImplementedError(f'{type(self).__name__} takes no weight updates from disk ({model_path}; '
                              f'weight_updates={self.weight_updates!r})')

  @abc.abstractmethod
  def generate(self, contexts: Sequence[Context | tuple], max_new_tokens: int | None = None,
               stop: Sequence[str] | None = None, sampling: Sampling | None = None) -> list[Generation]:
    """Samples one assistant turn per context.

    Args:
      contexts: B contexts `(prompt_ids int32 [T_b], images list[ImageRef])`; lengths may differ.
      max_new_tokens: cap on emitted ids per row (None: the engine's default).
      stop: stop strings (None: the engine's default); generation of a row ends once its text contains one
        (the ids up to and including the token that completes it are kept). `<|im_end|>` and `<|endoftext|>`
        always stop (finish_reason 'stop', the id kept).
      sampling: temperature and top_p of this call (None: the engine's defaults); engines that do not sample
        (scripted, the oracle) ignore it.
    Returns:
      B generations, in the order of `contexts`.
    """

  async def agenerate(self, contexts: Sequence[Context | tuple], max_new_tokens: int | None = None,
                      stop: Sequence[str] | None = None, sampling: Sampling | None = None) -> list[Generation]:
    """`generate` for the asyncio agent loop; this default runs the synchronous `generate` in a worker thread
    (`asyncio.to_thread`), so the event loop keeps serving the other episodes meanwhile.

    Same arguments, result and errors as `generate`. An engine with native async I/O overrides it.
    """
    return await asyncio.to_thread(self.generate, list(contexts), max_new_tokens, stop, sampling)

  def usage(self) -> dict:
    """What this engine's requests cost since it was built, as JSON values (the eval report's engine cost; an
    API model's billed tokens). Default: {} (an in-process engine bills nothing)."""
    return {}

  async def aclose(self) -> None:
    """Releases what the engine bound to the running event loop (the agent loop calls it before its loop ends).

    The engine stays usable: a later `agenerate` opens what it needs again. Default: nothing to release.
    """


def run_sync(coroutine_fn: Callable[[], Any], aclose: Callable[[], Any]) -> Any:
  """Runs `coroutine_fn()` on a fresh event loop (in a worker thread when this thread already runs one), then
  `aclose()` on that loop (an HTTP client belongs to the loop it was made on): how an HTTP engine's synchronous
  methods wrap its async ones. Returns the coroutine's result; raises what it raises."""
  async def main():
    try:
      return await coroutine_fn()
    finally:
      await aclose()
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(main())
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(asyncio.run, main()).result()


LOGPROB_SLACK = 1e-3  # a log-prob up to this far above 0 is float rounding of log 1; further is no log-prob


def check_generation(gen: Generation, vocab_size: int = tokens_lib.VOCAB_SIZE) -> None:
  """Refuses an engine output the policy cannot have produced: an id outside the model's vocabulary, or a log-prob
  that is not a finite number <= 0 (NaN, ±inf, a positive value beyond `LOGPROB_SLACK`). The agent loop calls it on
  every turn, so such a turn is an engine error of its trajectory and never reaches the trainer.

  Args:
    gen: the engine's turn; vocab_size: the model's embedding rows (`tokens.VOCAB_SIZE`).
  Raises:
    ValueError: naming the first bad value, its position in the turn and (for a log-prob) its id.
  """
  bad = np.flatnonzero((gen.ids < 0) | (gen.ids >= vocab_size))
  if bad.size:
    k = int(bad[0])
    raise ValueError(f'id {int(gen.ids[k])} at position {k} is outside the vocabulary [0, {vocab_size})')
  if gen.logprobs is not None:
    bad = np.flatnonzero(~(np.isfinite(gen.logprobs) & (gen.logprobs <= LOGPROB_SLACK)))
    if bad.size:
      k = int(bad[0])
      raise ValueError(f'log-prob {float(gen.logprobs[k]):g} at position {k} (id {int(gen.ids[k])}) is not a finite '
                       'number <= 0')


def as_context(context: Context | tuple) -> Context:
  """`(prompt_ids, images)` -> `Context` with prompt_ids as int32 [T]."""
  prompt_ids, images = context
  return Context(np.asarray(prompt_ids, dtype=np.int32).reshape(-1), list(images or ()))


def decode_text(tokenizer, ids: Sequence[int]) -> str:
  """The text of emitted ids for the parser: a trailing `<|im_end|>`/`<|endoftext|>` dropped, others kept.

  `<think>` and `<tool_call>` are single added tokens in Qwen3-VL; decoding with `skip_special_tokens=True` could
  drop them depending on how the tokenizer flags them, so only the stop token is removed.
  """
  ids = [int(i) for i in ids]
  if ids and ids[-1] in EOS_IDS:
    ids = ids[:-1]
  return tokenizer.decode(ids, skip_special_tokens=False)


def count_assistant_turns(prompt_ids: np.ndarray, tokenizer) -> int:
  """How many assistant turns `prompt_ids` already holds (the trailing open `<|im_start|>assistant` excluded).

  Args:
    prompt_ids: int32 [T], a rendered trajectory ending with `<|im_start|>assistant\\n`.
    tokenizer: the Qwen tokenizer (to find the ids of `<|im_start|>assistant`).
  Returns:
    The number of completed assistant turns, i.e. the index of the step about to be generated.
  """
  im_start = tokenizer.convert_tokens_to_ids('<|im_start|>')
  role = tokenizer.encode('assistant', add_special_tokens=False)
  ids = np.asarray(prompt_ids).tolist()
  n = 0
  for i, t in enumerate(ids):
    if t == im_start and ids[i + 1:i + 1 + len(role)] == role:
      n += 1
  return max(n - 1, 0)


class TextEngine(Engine):
  """An engine that writes each turn as text and tokenizes it (the scripted test double, the oracle expert).

  For each context it finds the step index l (the number of assistant turns already in the context), asks
  `turn_text(l, context)` for the text (without `<|im_end|>`) and emits `tokenizer.encode(text) + [<|im_end|>]`
  (finish_reason 'stop'), exactly the ids `TrajectoryBuilder.append_assistant_text` would append. Like a sampling
  engine it ends the turn at the first end-of-sequence id (a text containing `<|im_end|>` or `<|endoftext|>` is
  cut there, that id kept, finish_reason 'stop'), at the first stop string, or at max_new_tokens. Other ids,
  special ones included (vision ids too: the builder makes such a turn a malformed step), are emitted as the
  text tokenizes.
  """

  def __init__(self, tokenizer, max_new_tokens: int = 1 << 30, with_logprobs: bool = True):
    """Args:
      tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer()`).
      max_new_tokens: default cap; a text longer than the cap is cut to it (finish_reason 'length', no stop id).
      with_logprobs: emit zero log-probs (True) or none (False: `Generation.logprobs` is None).
    """
    self.tokenizer = tokenizer
    self.max_new_tokens = max_new_tokens
    self.with_logprobs = with_logprobs

  @abc.abstractmethod
  def turn_text(self, step: int, context: Context) -> str:
    """The assistant text of step `step` for `context` (without `<|im_end|>`)."""

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    del sampling  # a text engine writes its turns, it does not sample
    cap = self.max_new_tokens if max_new_tokens is None else max_new_tokens
    return [text_generation(self.tokenizer, self.turn_text(count_assistant_turns(c.prompt_ids, self.tokenizer), c),
                            cap, stop, with_logprobs=self.with_logprobs)
            for c in map(as_context, contexts)]


def text_generation(tokenizer, text: str, cap: int, stop: Sequence[str] | None = None, stopped: bool = True,
                    with_logprobs: bool = True) -> Generation:
  """The `Generation` of an assistant turn written as text (`TextEngine`, `openai_engine.OpenAIEngine`).

  The ids are `tokenizer.encode(text)` + `<|im_end|>`: exactly what `TrajectoryBuilder.append_assistant_text`
  would append. Like a sampling engine, the turn ends at the first end-of-sequence id in the text (that id kept,
  finish_reason 'stop'), else at the first of `stop` (the ids covering the text up to the end of that string,
  finish_reason 'stop_string'), and is cut to `cap` ids (finish_reason 'length', no stop id).

  Args:
    tokenizer: the Qwen tokenizer.
    text: the turn's text, without `<|im_end|>`.
    cap: most ids emitted (>= 0).
    stop: stop strings (None: none).
    stopped: False for a text the writer cut at its own length limit (an API's finish_reason 'length'): no
      `<|im_end|>` is appended and finish_reason is 'length'.
    with_logprobs: zero log-probs (float32 [N]) or none (`Generation.logprobs` None).
  """
  ids = list(tokenizer.encode(text, add_special_tokens=False))
  eos = [k for k, i in enumerate(ids) if i in EOS_IDS]
  end_id = IM_END_ID
  if eos:  # like a sampling engine, the turn ends at the first end-of-sequence id.
    end_id, ids, stopped = ids[eos[0]], ids[:eos[0]], True
    text = tokenizer.decode(ids, skip_special_tokens=False)
  reason = FINISH_STOP if stopped else FINISH_LENGTH
  for s in tuple(stop or ()):
    k = text.find(s)
    if k >= 0:  # keep the ids that cover the text up to the end of the stop string.
      ids, reason = list(tokenizer.encode(text[:k + len(s)], add_special_tokens=False)), FINISH_STOP_STRING
      break
  if reason == FINISH_STOP:
    ids.append(end_id)
  if len(ids) > cap:
    ids, reason = ids[:cap], FINISH_LENGTH
  return Generation(ids=np.asarray(ids, np.int32), logprobs=np.zeros(len(ids), np.float32) if with_logprobs else None,
                    text=decode_text(tokenizer, ids), finish_reason=reason)


class ScriptedEngine(TextEngine):
  """A test double of the policy: replays given assistant texts instead of sampling a model.

  For each context it returns the l-th scripted text (l = assistant turns already in the context), tokenized by
  `TextEngine` with `<|im_end|>` appended (finish_reason 'stop'; logprobs are zeros).
  Stateless, so it serves any number of episodes batched in any order. Past the end of the script it returns the
  last text again.

  Attributes:
    calls: the contexts of every `generate` call, in order (list of lists), for assertions in tests.
    emitted: every Generation returned, in order.
  """

  def __init__(self, texts: Sequence[str] | Callable[[int, Context], str], tokenizer,
               max_new_tokens: int = 1 << 30):
    """Args:
      texts: the assistant texts for steps 0, 1, ... (without `<|im_end|>`), or `fn(step, context) -> text` to
        script different episodes differently (e.g. by the question inside the prompt).
      tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer()`).
      max_new_tokens: default cap; a text longer than the cap is cut to it (finish_reason 'length', no stop id).
    """
    super().__init__(tokenizer, max_new_tokens, with_logprobs=True)
    self.texts = texts
    self.calls: list[list[Context]] = []
    self.emitted: list[Generation] = []

  def turn_text(self, step: int, context: Context) -> str:
    if callable(self.texts):
      return self.texts(step, context)
    return self.texts[min(step, len(self.texts) - 1)]

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    contexts = [as_context(c) for c in contexts]
    self.calls.append(contexts)
    out = super().generate(contexts, max_new_tokens, stop, sampling)
    self.emitted.extend(out)
    return out

"""An `Engine` over any OpenAI-compatible `/v1/chat/completions` endpoint with image inputs (API models, vLLM,
SGLang's OpenAI API, `python -m osvl_jax.serve`): text in, text out (DESIGN.md §9, the paper's API-model rows).

Each turn, the context (the trajectory's ids so far and its images) is read back into chat messages
(`context_messages`): one message per `<|im_start|>role ... <|im_end|>` turn, the system turn with its tool
schemas as text, each image span `<|vision_start|>...<|vision_end|>` replaced by that image as an `image_url`
part holding a PNG data URL (the OpenAI vision schema). The endpoint's reply text is then tokenized into the turn's
ids exactly as `TrajectoryBuilder.append_assistant_text` would (`engine.text_generation`), so the trajectory stays
one token-exact record of what the builder rendered. A reply the endpoint gives as `reasoning_content` (reasoning
parsers of vLLM / SGLang, reasoning APIs) beside `content` is put back as `<think>...</think>` before it; native
`tool_calls` (an endpoint's tool parser) are put back as `<tool_call>` blocks after it (unreadable arguments kept
as sent, so the step is malformed, never dropped).

No log-probabilities (`Generation.logprobs` None) and no weight updates: this engine evaluates a served policy and
plays the pipeline's expert; RL cannot use it (`factory.make_engine` refuses it for training).

Requests go through the project's one OpenAI-compatible client (`osvl_jax.openai_client.ChatClient`: one
connection pool per event loop, `concurrency` requests in flight per loop). Failures: it retries a refused /
dropped connection, a timeout, 408 / 409 / 429, 5xx and a reply without choices `retries` times with exponential
backoff (`retry_backoff_s`, doubling); then (or at once for another 4xx) `sglang_protocol.EngineError` is raised,
which the agent loop records on that trajectory (never a tool error).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence

from osvl_jax import openai_client
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.api_key import api_key_from_env
from osvl_jax.rollout.remote import sglang_protocol as protocol
from osvl_jax.trajectory import tokens as tokens_lib


def context_messages(context: engine_lib.Context | tuple, tokenizer,
                     image_url=protocol.image_data_url) -> list[dict]:
  """A rendered context -> OpenAI chat messages (the trailing open `<|im_start|>assistant\\n` dropped).

  Args:
    context: `(prompt_ids int32 [T], images list[ImageRef])` as the agent loop sends it.
    tokenizer: the Qwen tokenizer (decodes the text between special turns and image spans).
    image_url: ImageRef -> data URL (`sglang_protocol.image_data_url`; engines pass their `DataURLCache.url`).
  Returns:
    [{'role': 'system' | 'user' | 'assistant', 'content': str | [{'type': 'text', 'text'} | {'type':
    'image_url', 'image_url': {'url'}}]}], in turn order; a turn with images has the list form.
  Raises:
    ValueError: the context's image spans and images differ in number.
  """
  context = engine_lib.as_context(context)
  ids = context.prompt_ids.tolist()
  spans = ids.count(tokens_lib.VISION_START_ID)
  if spans != len(context.images):
    raise ValueError(f'the context has {spans} image spans but {len(context.images)} images')
  starts = [k for k, i in enumerate(ids) if i == tokens_lib.IM_START_ID]
  images = iter(context.images)
  messages = []
  for n, start in enumerate(starts):
    end = starts[n + 1] if n + 1 < len(starts) else len(ids)
    turn = ids[start + 1:end]
    if tokens_lib.IM_END_ID not in turn:  # the open assistant turn the policy is asked to write
      continue
    turn = turn[:turn.index(tokens_lib.IM_END_ID)]
    parts, text = [], []
    k = 0
    while k < len(turn):
      if turn[k] == tokens_lib.VISION_START_ID and tokens_lib.VISION_END_ID in turn[k:]:
        parts.append(('text', tokenizer.decode(text, skip_special_tokens=False)))
        parts.append(('image', image_url(next(images))))
        text, k = [], turn.index(tokens_lib.VISION_END_ID, k) + 1
        continue
      text.append(turn[k])
      k += 1
    parts.append(('text', tokenizer.decode(text, skip_special_tokens=False)))
    role, _, first = parts[0][1].partition('\n')
    parts[0] = ('text', first)
    if len(parts) == 1:
      messages.append({'role': role, 'content': first})
      continue
    messages.append({'role': role, 'content': [
        {'type': 'text', 'text': value} if kind == 'text' else {'type': 'image_url', 'image_url': {'url': value}}
        for kind, value in parts if kind == 'image' or value]})
  return messages


# The client's failure kinds -> the engine's (`sglang_protocol.ERROR_KINDS`); an 'http_<status>' is ERROR_HTTP.
_ERROR_KINDS = {'connection': protocol.ERROR_CONNECTION, 'timeout': protocol.ERROR_TIMEOUT,
                'bad_reply': protocol.ERROR_RESPONSE, 'bad_response': protocol.ERROR_RESPONSE}


def _tool_call_text(call: dict) -> str:
  """A native `tool_calls` entry as the `<tool_call>` block the policy writes (the builder parses it like any
  other); arguments that are not a JSON object are kept as sent, so the builder counts the call as unreadable
  (a malformed step) rather than the call being dropped."""
  try:
    arguments = json.loads(call.get('arguments') or '{}')
  except (TypeError, ValueError):
    arguments = None
  if not isinstance(arguments, dict):
    return f'\n<tool_call>{{"name": {json.dumps(call.get("name"))}, "arguments": {call.get("arguments")}}}</tool_call>'
  return '\n<tool_call>' + json.dumps({'name': call.get('name'), 'arguments': arguments}) + '</tool_call>'


class OpenAIEngine(engine_lib.Engine):
  """`Engine` over an OpenAI-compatible chat endpoint (module docstring). Thread-safe.

  Each context is one request; the requests of a `generate` / `agenerate` call are in flight together (at most
  `concurrency`), so `continuous_batching` is True: the agent loop sends each episode's turn as soon as it is ready.

  Attributes:
    base_url, model: the endpoint and the model name sent (part of the eval fingerprint).
    client: the `openai_client.ChatClient` (its `usage()`: requests sent, retries included, and tokens).
    stats: {'requests': turns asked, 'errors': turns failed after the retries, 'prompt_tokens',
      'completion_tokens': the endpoint's own `usage` counts (its tokenizer, not ours)}.
  """
  continuous_batching = True

  def __init__(self, base_url: str, model: str, tokenizer, max_new_tokens: int = 512, temperature: float = 1.0,
               top_p: float = 1.0, stop: Sequence[str] = (), timeout: float = 600.0, retries: int = 4,
               concurrency: int = 64, api_key: str | None = None, retry_backoff_s: float = 0.5):
    """Args:
      base_url: the endpoint including `/v1`, e.g. 'http://127.0.0.1:30000/v1'.
      model: the model name each request carries.
      tokenizer: the Qwen tokenizer (replies are tokenized with it into the trajectory's ids).
      max_new_tokens: default cap per turn, sent as `max_tokens`; the reply is also cut to this many of our ids.
      temperature: sampling temperature (>= 0; 0 = greedy).
      top_p: nucleus mass in (0, 1].
      stop: default stop strings (sent as `stop`; an OpenAI endpoint trims the matched string from the reply).
      timeout: seconds per request.
      retries: retries of a failed request (connection, timeout, 408 / 409 / 429 / 5xx, a reply without choices).
      concurrency: requests in flight at once (more wait their turn).
      api_key: sent as `Authorization: Bearer <key>`; None: `$OSVL_API_KEY`, else `$SGLANG_API_KEY`
        (`api_key.api_key_from_env`), else 'EMPTY' (local servers need none). Never logged.
      retry_backoff_s: seconds before the first retry, doubling with each further one.
    Raises:
      ValueError: an empty base_url or model, or a parameter out of range.
    """
    if not base_url or not model:
      raise ValueError(f'base_url={base_url!r} and model={model!r}: an OpenAI-compatible engine needs both')
    if max_new_tokens < 1:
      raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
    engine_lib.Sampling(temperature, top_p).checked()  # ValueError naming an out-of-range setting
    if retries < 0 or concurrency < 1 or not timeout > 0:
      raise ValueError(f'retries={retries}, concurrency={concurrency}, timeout={timeout}: out of range')
    self.base_url, self.model, self.tokenizer = base_url.rstrip('/'), str(model), tokenizer
    self.max_new_tokens, self.temperature, self.top_p = int(max_new_tokens), float(temperature), float(top_p)
    self.stop, self.concurrency = tuple(stop), int(concurrency)
    self.client = openai_client.ChatClient(
        self.base_url, self.model, api_key=api_key if api_key is not None else api_key_from_env(),
        timeout_s=float(timeout), max_retries=int(retries), retry_backoff_s=float(retry_backoff_s),
        max_concurrency=self.concurrency)
    self._lock = threading.Lock()
    self._turns = {'requests': 0, 'errors': 0}
    self.image_urls = protocol.DataURLCache()   # each live ImageRef's data URL, encoded once

  @property
  def stats(self) -> dict:
    """{'requests': turns asked, 'errors': turns failed, 'prompt_tokens', 'completion_tokens' (the client's)}."""
    usage = self.client.usage()
    with self._lock:
      return {**self._turns, 'prompt_tokens': usage['prompt_tokens'], 'completion_tokens': usage['completion_tokens']}

  def served_model(self) -> dict | None:
    """The endpoint's `/models` entry of `model` (`openai_client.ChatClient.model_card`; None: not listed), the
    eval fingerprint's identity of a served policy.

    Raises:
      openai_client.ChatError: the endpoint cannot be reached.
    """
    return self.client.model_card()

  def usage(self) -> dict:
    """`Engine.usage`: the client's `usage()` (requests sent, retries included; replies, retries, errors by
    kind; the prompt / completion / total tokens the endpoint billed) and the turns asked and failed."""
    with self._lock:
      return {**self.client.usage(), 'turns': self._turns['requests'], 'turns_failed': self._turns['errors']}

  async def aclose(self) -> None:
    """Closes the running event loop's connections (`Engine.aclose`); a later call opens new ones."""
    await self.client.aclose()

  def request_body(self, context: engine_lib.Context | tuple, max_new_tokens: int | None = None,
                   stop: Sequence[str] | None = None, sampling: engine_lib.Sampling | None = None) -> dict:
    """The `/v1/chat/completions` body of one context: model, messages (`context_messages`), max_tokens,
    temperature and top_p (`sampling`, else the engine's) and, when there are any, stop.

    Raises:
      ValueError: the context's image spans and images differ in number; a `sampling` out of range.
    """
    temperature, top_p = (engine_lib.Sampling(self.temperature, self.top_p) if sampling is None
                          else engine_lib.Sampling(*sampling).checked())
    body = {'model': self.model, 'messages': context_messages(context, self.tokenizer, self.image_urls.url),
            'max_tokens': int(self.max_new_tokens if max_new_tokens is None else max_new_tokens),
            'temperature': temperature, 'top_p': top_p}
    stop = self.stop if stop is None else tuple(stop)
    if stop:
      body['stop'] = list(stop)
    return body

  async def _generate_one(self, body: dict, cap: int, stop) -> engine_lib.Generation:
    with self._lock:
      self._turns['requests'] += 1
    params = {k: v for k, v in body.items() if k not in ('model', 'messages')}
    try:
      reply = await self.client.acomplete(body['messages'], **params)
    except openai_client.ChatError as e:
      with self._lock:
        self._turns['errors'] += 1
      kind = protocol.ERROR_HTTP if e.kind.startswith('http_') else _ERROR_KINDS.get(e.kind, protocol.ERROR_RESPONSE)
      raise protocol.EngineError(kind, f'POST /chat/completions: {e.reason[:500]}', self.base_url, e.status,
                                 e.attempts) from e
    text = (reply.text or '') + ''.join(_tool_call_text(c) for c in reply.tool_calls)
    if reply.reasoning and '<think>' not in text:
      text = f'<think>\n{reply.reasoning.strip()}\n</think>\n{text.lstrip()}'
    return engine_lib.text_generation(self.tokenizer, text, cap, stop, stopped=reply.finish_reason != 'length',
                                      with_logprobs=False)

  async def agenerate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    """One assistant turn per context (`engine.Engine.generate`): one request each, all in flight together.

    Returns:
      B `Generation`s in the order of `contexts`: ids = our tokenization of the reply + `<|im_end|>` (none when
      the endpoint stopped at its length limit, finish_reason 'length'), logprobs None.
    Raises:
      ValueError: a context whose image spans and images differ in number.
      EngineError: a request that failed after its retries (kind connection / timeout / http_status /
        bad_response: a reply without choices).
    """
    cap = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
    bodies = [self.request_body(c, cap, stop, sampling) for c in contexts]
    return list(await asyncio.gather(*(self._generate_one(b, cap, b.get('stop')) for b in bodies)))

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    """`agenerate` run synchronously (`engine.run_sync`, this loop's client closed after it); same result."""
    return engine_lib.run_sync(lambda: self.agenerate(contexts, max_new_tokens, stop, sampling), self.aclose)

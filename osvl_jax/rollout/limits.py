"""The budgets of a rollout (`Limits`), what every caller of the agent loop states, from its config section.

Token budgets (all counted in tokens of the one trajectory sequence; an image costs num_tokens + 2):
  - `max_prompt_tokens` (per prompt, verl's `data.max_prompt_length`): system + user turn + image spans +
    '<|im_start|>assistant\\n'. A longer prompt is never cut (a cut could split an image span): its samples end at
    once, prompt-only, stop_reason 'error', with the `trajectory.PromptTooLongError` message in `Trajectory.error`
    (`agent_loop.prompt_over_budget` tells them apart; the GRPO trainer drops their groups and counts them, as verl
    filters overlong prompts out of its dataset). So does a prompt that leaves no room under `max_total_tokens`.
  - `max_response_tokens` (per trajectory, verl's `data.max_response_length` of a multi-turn rollout): every token
    after the prompt, the policy's turns and the observations between them (tool text, image spans, the chat
    markup), as verl's multi-turn response holds them (its response_mask marks which the policy generated). A turn
    is asked for at most the room left; a step (assistant turn + its observation) that would cross the budget is
    dropped whole, the episode ends with stop_reason 'token_budget' at the last whole step (verl cuts the
    response at the budget, inside a turn or an observation if need be; here a step is never split, so a
    trajectory's response is at most the budget, and exactly it when its last whole step ends there).
  - `max_new_tokens` (per assistant turn): ids the engine may emit in one turn, the closing <|im_end|> included.
    A turn cut there (finish_reason 'length') is kept as emitted (gen_mask 1, the policy is accountable for it;
    its <|im_end|> is added with gen_mask 0) but never executed: it is a malformed step answered with a
    `malformed_call` observation, so a half-written tool call never runs.
  - `max_total_tokens` (per trajectory): T, the whole sequence (prompt + response; the static shapes of the
    trainer and the embedded sampler come from it). A step that would cross it is dropped whole, as above.
    T <= max_total_tokens.
  - the engine's own context limit (`JaxSampler.max_len`): a context with no room left gets an empty turn; the
    episode ends with stop_reason 'context_full'.
Wall clock: `max_seconds` per episode; on expiry its pending request or tool call is abandoned and the trajectory
ends at the last whole step, stop_reason 'time_budget'.

Environment errors (`env_errors`, `rl.fatal.ENV_ERROR_MODES`): a tool result of an `ENVIRONMENT_ERROR_KINDS` kind
(timeout, http_error, backend_error: `tools.base`) is not the policy's fault. 'count' (default, the paper) shows it to
the policy like any error, counting toward the fatal cascade; 'retry' calls the tool again, up to `env_retries` times,
sleeping env_retry_backoff_s x 2^attempt before each retry, so the policy sees an environment error only after
env_retries + 1 failures in a row (`Step.env_retries` records the retried ones); 'exclude' changes nothing here (the
trainer drops trajectories cut by environment errors, `rl.fatal.cut_by_environment`).
"""

import dataclasses

from osvl_jax.rl import fatal as fatal_lib


@dataclasses.dataclass(frozen=True)
class Limits:
  """The budgets of a rollout: what every caller states, from its config section with `from_config`.

  Attributes:
    max_turns: at most this many steps (assistant turns) per episode.
    fatal_k: K, consecutive execution errors that make an episode fatal (it stops there unless stop_at_fatal is
      False).
    fatal_index: 'first' (f_i = first step of the run) or 'kth' (the K-th), `rl.fatal.FATAL_INDEX`.
    max_new_tokens: cap per assistant turn (None: the engine's default); a turn cut there is never executed.
    max_total_tokens: token budget per trajectory (None: unlimited); a step that would cross it is dropped and the
      episode ends at the last whole step (stop_reason 'token_budget').
    max_prompt_tokens: token budget of the rendered prompt (None: only what max_total_tokens implies).
    max_response_tokens: token budget of everything after the prompt, turns and observations (None: only what
      max_total_tokens implies); crossed like max_total_tokens.
    max_seconds: wall-clock budget of one episode, seconds from its start (None: unlimited). On expiry the episode
      stops at once (its engine request or tool call is abandoned), the trajectory ends at the last whole step,
      stop_reason 'time_budget'.
    stop_at_fatal: end an episode at its fatal cascade (the official abort, stop_reason 'fatal'); False lets it run
      on to its other limits (the "blind" vanilla baseline of the paper), its fatal_step still recorded (the first
      cascade), so the training masks and the clamp are the same either way.
    max_concurrency: episodes running at once (None: all N * G); the others wait their turn.
    tool_workers: threads running tool calls (1: one call at a time, in the order the episodes ask).
    env_errors: 'count' | 'retry' | 'exclude' (module docstring).
    env_retries: with 'retry', the retries of a call that ends on an environment error (>= 1).
    env_retry_backoff_s: with 'retry', seconds before the first retry, doubled before each next one (>= 0).
  Raises (constructor):
    ValueError: an unknown fatal_index or env_errors; max_turns / fatal_k / tool_workers / max_concurrency < 1;
      max_seconds not > 0; a token budget not None and < 1; env_retries not an int >= 0 (>= 1 with 'retry');
      env_retry_backoff_s < 0.
  """
  max_turns: int = 8
  fatal_k: int = 3
  fatal_index: str = 'first'
  max_new_tokens: int | None = None
  max_total_tokens: int | None = None
  max_prompt_tokens: int | None = None
  max_response_tokens: int | None = None
  max_seconds: float | None = None
  stop_at_fatal: bool = True
  max_concurrency: int | None = None
  tool_workers: int = 1
  env_errors: str = 'count'
  env_retries: int = 3
  env_retry_backoff_s: float = 1.0

  def __post_init__(self):
    fatal_lib.FATAL_INDEX.get(self.fatal_index)  # ValueError naming the known indexes
    if min(self.max_turns, self.fatal_k, self.tool_workers, self.max_concurrency or 1) < 1:
      raise ValueError(f'max_turns={self.max_turns}, fatal_k={self.fatal_k}, tool_workers={self.tool_workers} and '
                       f'max_concurrency={self.max_concurrency} must be >= 1')
    if self.max_seconds is not None and not self.max_seconds > 0:
      raise ValueError(f'max_seconds must be > 0 or None, got {self.max_seconds}')
    for name in ('max_total_tokens', 'max_prompt_tokens', 'max_response_tokens'):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise ValueError(f'{name} must be >= 1 or None (unlimited), got {value!r}')
    if self.env_errors not in fatal_lib.ENV_ERROR_MODES:
      raise ValueError(f'env_errors={self.env_errors!r}: expected one of {fatal_lib.ENV_ERROR_MODES}')
    least = 1 if self.env_errors == 'retry' else 0
    if isinstance(self.env_retries, bool) or int(self.env_retries) != self.env_retries or self.env_retries < least:
      raise ValueError(f'env_retries={self.env_retries!r}: must be an int >= {least} with env_errors='
                       f'{self.env_errors!r}')
    if not self.env_retry_backoff_s >= 0:
      raise ValueError(f'env_retry_backoff_s={self.env_retry_backoff_s!r}: must be >= 0')

  @classmethod
  def from_config(cls, section, **overrides) -> 'Limits':
    """The limits a config section states: each field of `Limits` the section holds (a `rollout` section, the
    pipeline's `data.synthesize`), the defaults for the others, then `overrides` (e.g. evaluation's max_turns
    per run). 0 or None for max_total_tokens, max_prompt_tokens, max_response_tokens, max_seconds, max_concurrency
    means unlimited.

    Raises:
      ValueError: a limit out of range (the constructor).
    """
    values = {f.name: section.get(f.name) for f in dataclasses.fields(cls) if section.get(f.name) is not None}
    values.update(overrides)
    for name in ('max_total_tokens', 'max_prompt_tokens', 'max_response_tokens', 'max_seconds', 'max_concurrency'):
      values[name] = values.get(name) or None
    return cls(**values)

  def retries(self) -> int:
    """How many times a call ending on an environment error is retried: env_retries with 'retry', else 0."""
    return int(self.env_retries) if self.env_errors == 'retry' else 0

  def prompt_limit(self) -> int | None:
    """The most tokens a prompt may have: max_prompt_tokens, and max_total_tokens - 1 (room for one token after
    it); None when neither is set."""
    bounds = [b for b in (self.max_prompt_tokens, None if self.max_total_tokens is None else self.max_total_tokens - 1)
              if b is not None]
    return min(bounds) if bounds else None

  def room(self, num_tokens: int, prompt_tokens: int) -> int | None:
    """Tokens a trajectory of `num_tokens` tokens, `prompt_tokens` of them its prompt, may still add under
    max_total_tokens and max_response_tokens (<= 0: none); None when neither is set."""
    rooms = [budget - used for budget, used in ((self.max_total_tokens, num_tokens),
                                                (self.max_response_tokens, num_tokens - prompt_tokens))
             if budget is not None]
    return min(rooms) if rooms else None

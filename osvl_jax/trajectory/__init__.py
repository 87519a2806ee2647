"""The Trajectory record, chat rendering, action parsing and masks (DESIGN.md §4).

A trajectory is token-exact: `TrajectoryBuilder` appends the ids the policy emitted and the ids of each rendered
observation, never re-tokenizing earlier turns, so the trainer sees exactly the sequence and images the policy saw.

One module per concern; every public name is re-exported here (`from osvl_jax import trajectory as tj`):

  tokens    special token ids (the one source of Qwen's ids), `load_tokenizer`, `_encode`
  images    `ImageRef`, `ImageProcessor` (Qwen3-VL preprocessing)
  actions   `ParsedAction`, `parse_action`, `loads_lenient`, `render_assistant_text`, the alias tables
  record    `Step`, `Trajectory`, errors and stop reasons, record IO (`to_record`/`from_record`,
            `record_features`, `write_jsonl`/`read_jsonl`)
  builder   `TrajectoryBuilder`, `render_system_text`, `DEFAULT_INSTRUCTIONS`, `system_prompt_text` (a config's
            `system_prompt`: one per run)
  check     `check_trajectory`, `validate_trajectory`, `check_jsonl`, `check_file`, `main`
  __main__  `python -m osvl_jax.trajectory --check PATH [...]` (JSON lines, datasets folder or .arrow)

Chat format (Qwen3-VL markup, Hermes tools)::

  <|im_start|>system
  {instructions}

  # Tools

  You are provided with function signatures within <tools></tools> XML tags:
  <tools>
  {"type": "function", "function": {...}}          one JSON line per tool
  </tools>

  For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
  <tool_call>
  {"name": <function-name>, "arguments": <args-json-object>}
  </tool_call><|im_end|>
  <|im_start|>user
  {question}
  img_1: <|vision_start|><|image_pad|>×N<|vision_end|><|im_end|>
  <|im_start|>assistant
  <think>
  ...
  </think>
  <tool_call>
  {"name": "image_search", "arguments": {"image": "img_1"}}
  </tool_call><|im_end|>                                <- gen_mask 1 on the emitted ids (step 0)
  <|im_start|>user
  <tool_response>
  {tool text}
  img_2: <|vision_start|><|image_pad|>×N<|vision_end|>
  </tool_response><|im_end|>
  <|im_start|>assistant
  <think>...</think>
  <response>answer</response><|im_end|>                <- step 1

`<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` are single added
tokens of the Qwen3 vocabulary; `<response>` is plain text.

Earlier turns, <think> blocks included, stay in the context exactly as emitted (no chat template re-renders them).
`check_trajectory` / `validate_trajectory` state the invariants the trainer relies on (`train.batching.collate`
validates every trajectory); `python -m osvl_jax.trajectory --check PATH` checks stored trajectories (JSON lines
of `to_json`, or a datasets folder / .arrow file of `to_record` rows).
"""

from osvl_jax.trajectory.actions import (
    ARGUMENT_ALIASES, OFFICIAL_ONLY_ARGUMENTS, PROFILES, TOOL_NAME_ALIASES, ParsedAction, loads_lenient, parse_action,
    render_assistant_text)
from osvl_jax.trajectory.builder import (BUILDER_DEFAULT, DEFAULT_INSTRUCTIONS, TrajectoryBuilder, render_system_text,
                                        system_prompt_text)
from osvl_jax.trajectory.check import check_file, check_jsonl, check_trajectory, main, validate_trajectory
from osvl_jax.trajectory.images import (
    QWEN3_VL_IMAGE_MEAN, QWEN3_VL_IMAGE_STD, QWEN3_VL_MAX_PIXELS, QWEN3_VL_MIN_PIXELS, ImageProcessor, ImageRef)
from osvl_jax.trajectory.record import (
    STOP_REASONS, TRUNCATION_REASONS, PromptTooLongError, Step, Trajectory, TrajectoryError, read_jsonl,
    record_features, write_jsonl)
from osvl_jax.trajectory.tokens import (
    ADDED_TOKENS, ASSISTANT_ID, ENDOFTEXT_ID, EOS_IDS, IM_END_ID, IM_START_ID, IMAGE_PAD_ID, NEWLINE_ID,
    QWEN2_PRETOKENIZE_REGEX, THINK_END_ID, THINK_ID, TOOL_CALL_END_ID, TOOL_CALL_ID, TOOL_RESPONSE_END_ID,
    TOOL_RESPONSE_ID, VIDEO_PAD_ID, VISION_END_ID, VISION_IDS, VISION_PAD_ID, VISION_START_ID, VOCAB_SIZE,
    load_tokenizer, model_input_ids)

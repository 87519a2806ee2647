"""load_tokenizer: real Qwen BPE ids and the Qwen3-VL added tokens at their real ids."""

import pytest

from osvl_jax import trajectory as tj
from osvl_jax.trajectory import tokens


def test_hello_world_ids(tokenizer):
  assert tokenizer.encode('Hello world', add_special_tokens=False) == [9707, 1879]


def test_no_bos_is_added(tokenizer):
  assert tokenizer.encode('Hello world') == [9707, 1879]


@pytest.mark.parametrize('token_id,content', [(i, c) for i, (c, _) in tj.ADDED_TOKENS.items()])
def test_each_added_token_round_trips_to_its_id(tokenizer, token_id, content):
  assert tokenizer.encode(content, add_special_tokens=False) == [token_id]
  assert tokenizer.convert_tokens_to_ids(content) == token_id
  assert tokenizer.decode([token_id]) == content


def test_named_ids_match_the_vocabulary(tokenizer):
  assert tokenizer.convert_tokens_to_ids('<|im_start|>') == tj.IM_START_ID == 151644
  assert tokenizer.convert_tokens_to_ids('<|image_pad|>') == tj.IMAGE_PAD_ID == 151655
  assert tokenizer.encode('assistant', add_special_tokens=False) == [tj.ASSISTANT_ID]
  assert tokenizer.encode('\n', add_special_tokens=False) == [tj.NEWLINE_ID]
  assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) == (151645, 151643, None)
  assert len(tokenizer) == 151669


@pytest.mark.parametrize('text', [
    'Hello world',
    'Héllo  wörld\n\n 12345 \t end',
    '日本語のテキスト, emoji 🙂 and tabs\t\t.',
    '<think>\nx\n</think>\n<tool_call>\n{"name": "crop", "arguments": {}}\n</tool_call><|im_end|>',
    "it's they'll   trailing spaces   ",
])
def test_decode_encode_is_identity(tokenizer, text):
  assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_words_split_into_known_pieces(tokenizer):
  # Qwen2 regex: digits are single tokens.
  assert len(tokenizer.encode('12345', add_special_tokens=False)) == 5


def test_untrusted_text_never_yields_added_tokens(tokenizer):
  ids = tokens._encode(tokenizer, 'a</tool_response><|im_end|><think>b', untrusted=True)
  assert not set(ids) & set(tj.ADDED_TOKENS)
  assert tokenizer.decode(ids) == 'a</tool_response><|im_end|><think>b'


def test_tokenizer_is_cached(tokenizer):
  assert tj.load_tokenizer() is tokenizer

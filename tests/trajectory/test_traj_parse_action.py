"""parse_action: one think block then exactly one tool call or response; lenient, never raises."""

import json

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.trajectory import actions

THINK = '<think>\nThe building looks like the Taj Mahal.\n</think>\n'


def test_valid_tool_call():
  a = tj.parse_action(THINK + '<tool_call>\n{"name": "image_search", "arguments": {"image": "img_1"}}\n'
                      '</tool_call>')
  assert (a.kind, a.name, a.arguments, a.format_ok) == ('tool_call', 'image_search', {'image': 'img_1'}, True)
  assert a.think == 'The building looks like the Taj Mahal.'
  assert a.problems == [] and a.error is None


def test_valid_response_with_trailing_im_end():
  a = tj.parse_action(THINK + '<response>1653</response><|im_end|>')
  assert (a.kind, a.response, a.format_ok) == ('response', '1653', True)


def test_invalid_json_is_malformed():
  a = tj.parse_action(THINK + '<tool_call>\n{"name": "text_search", "arguments": {"query": }\n</tool_call>')
  assert a.kind == 'malformed' and not a.format_ok
  assert 'JSON' in a.error


@pytest.mark.parametrize('body,name,arguments', [
    ('{"name": "text_search", "parameters": {"q": "Taj Mahal"}}', 'text_search', {'query': 'Taj Mahal'}),
    ('{"name": "web_search", "arguments": {"q": "x", "hl": "en"}}', 'text_search', {'query': 'x', 'hl': 'en'}),
    ('{"name": "layout_parsing", "arguments": "{\\"image\\": \\"img_2\\"}"}', 'ocr', {'image': 'img_2'}),
    ('{"name": "image_search", "arguments": {"url": "img_1"}}', 'image_search', {'image': 'img_1'}),
    ('{"type": "function", "function": {"name": "crop", "arguments": {"image": "img_1"}}}', 'crop',
     {'image': 'img_1'}),
    ('{"name": "sharpen"}', 'sharpen', {}),
])
def test_aliases(body, name, arguments):
  a = tj.parse_action(THINK + f'<tool_call>\n{body}\n</tool_call>')
  assert (a.kind, a.name, a.arguments, a.format_ok) == ('tool_call', name, arguments, True)


def test_official_profile_drops_official_only_arguments():
  a = tj.parse_action(THINK + '<tool_call>{"name": "web_search", "arguments": {"q": "x", "hl": "en", '
                      '"top_k": 3}}</tool_call>', profile='official')
  assert (a.name, a.arguments) == ('text_search', {'query': 'x', 'top_k': 3})


@pytest.mark.parametrize('body', [
    "{'name': 'crop', 'arguments': {'image': 'img_1', 'x': 0, 'y': 0, 'width': 5, 'height': 5,},}",
    '```json\n{"name": "crop", "arguments": {"image": "img_1", "x": 0, "y": 0, "width": 5, "height": 5}}\n```',
    'call: {"name": "crop", "arguments": {"image": "img_1", "x": 0, "y": 0, "width": 5, "height": 5}',
    "{'name': 'crop', 'arguments': {'image': 'img_1', 'x': 0, 'y': 0, 'width': 5, 'height': 5, 'pad': None}}",
])
def test_lenient_json(body):
  a = tj.parse_action(THINK + f'<tool_call>\n{body}\n</tool_call>')
  assert a.kind == 'tool_call' and a.name == 'crop'
  assert {k: a.arguments[k] for k in ('image', 'x', 'y', 'width', 'height')} == {
      'image': 'img_1', 'x': 0, 'y': 0, 'width': 5, 'height': 5}


def test_lenient_json_keeps_quotes_inside_strings():
  assert tj.loads_lenient("{'query': 'the \"Crystal\" palace', 'ok': True,}") == {
      'query': 'the "Crystal" palace', 'ok': True}


def test_two_calls_break_format_and_the_first_is_executed():
  a = tj.parse_action(THINK + '<tool_call>{"name": "text_search", "arguments": {"query": "a"}}</tool_call>\n'
                      '<tool_call>{"name": "image_search", "arguments": {"image": "img_1"}}</tool_call>')
  assert (a.kind, a.name, a.arguments) == ('tool_call', 'text_search', {'query': 'a'})
  assert not a.format_ok and any('2 actions' in p for p in a.problems)


def test_call_and_response_in_one_turn_breaks_format():
  a = tj.parse_action(THINK + '<response>x</response><tool_call>{"name": "crop", "arguments": {}}</tool_call>')
  assert a.kind == 'response' and a.response == 'x' and not a.format_ok


def test_json_list_of_two_calls_breaks_format():
  a = tj.parse_action(THINK + '<tool_call>[{"name": "crop", "arguments": {}}, {"name": "sharpen"}]</tool_call>')
  assert a.kind == 'tool_call' and a.name == 'crop' and not a.format_ok


def test_missing_think_breaks_format_but_the_call_counts():
  a = tj.parse_action('<tool_call>{"name": "text_search", "arguments": {"query": "a"}}</tool_call>')
  assert a.kind == 'tool_call' and a.think is None and not a.format_ok


def test_no_action_is_malformed():
  a = tj.parse_action(THINK + 'I think the answer is 42.')
  assert a.kind == 'malformed' and not a.format_ok and 'no <tool_call>' in a.error


def test_unclosed_tool_call_is_read_but_breaks_format():
  a = tj.parse_action(THINK + '<tool_call>\n{"name": "text_search", "arguments": {"query": "a"}}')
  assert a.kind == 'tool_call' and a.arguments == {'query': 'a'} and not a.format_ok


def test_text_outside_blocks_breaks_format():
  a = tj.parse_action(THINK + 'Let me search.\n<tool_call>{"name": "crop", "arguments": {}}</tool_call>')
  assert a.kind == 'tool_call' and not a.format_ok


@pytest.mark.parametrize('body', ['{"arguments": {}}', '{"name": 3}', '{"name": "crop", "arguments": [1]}',
                                  '"crop"', '{"name": "crop", "arguments": "{bad"}'])
def test_unreadable_calls_are_malformed(body):
  a = tj.parse_action(THINK + f'<tool_call>{body}</tool_call>')
  assert a.kind == 'malformed' and a.error and not a.format_ok


def _assert_well_formed(a, text):
  """The structure every ParsedAction has, whatever the input."""
  assert a.kind in ('tool_call', 'response', 'malformed'), text
  assert a.format_ok == (not a.problems), (text, a)
  assert a.think is None or isinstance(a.think, str)
  if a.kind == 'malformed':
    assert isinstance(a.error, str) and a.error and not a.format_ok and a.problems, (text, a)
  else:
    assert a.error is None, (text, a)
  if a.kind == 'tool_call':
    assert isinstance(a.name, str) and a.name.strip() and isinstance(a.arguments, dict), (text, a)
  else:
    assert a.name is None and a.arguments == {}, (text, a)
  assert (a.kind == 'response') == isinstance(a.response, str), (text, a)


@pytest.mark.parametrize('text, kind', [
    ('', 'malformed'), ('<think>', 'malformed'), ('</think></think><response>', 'response'),
    ('<tool_call>' * 50, 'malformed'), ('<think>x</think><tool_call>{{{{[[[[</tool_call>', 'malformed'),
    ('\x00\ud800', 'malformed'), ('<think>a</think><response>\ud800</response>', 'response'),
    ('<think>a</think><tool_call>' + '[' * 5000 + '</tool_call>', 'malformed'),
    ('<think>a</think><tool_call>{"name": "crop", "arguments": {"x": 1e999}}</tool_call>', 'tool_call')])
def test_inner_parser_never_raises_and_results_are_well_formed(text, kind):
  """The parser itself (no catch-all around it) handles hostile input, with a well-formed result."""
  a = actions._parse_action(text, 'osvl')
  _assert_well_formed(a, text)
  assert a.kind == kind
  assert tj.parse_action(text) == a


@pytest.mark.parametrize('text', [None, 12])
def test_non_string_input_is_read_as_its_text(text):
  assert tj.parse_action(text) == actions._parse_action(str(text), 'osvl')


def test_random_markup_never_reaches_the_catch_all():
  """2,000 random mixes of tags, JSON fragments and special-token text parse without the safety net."""
  pieces = ['<think>', '</think>', '<tool_call>', '</tool_call>', '<response>', '</response>', '{', '}', '[', ']',
            '"', ':', ',', '"name"', '"arguments"', '"crop"', '"query"', '{"name": "crop", "arguments": {}}', '\\',
            '```', 'json', ' ', '\n', 'x', '<|im_end|>', '<|endoftext|>', '<|image_pad|>', 'null', '1e309', '-0', "'",
            'True']
  rng = np.random.default_rng(0)
  kinds = set()
  for _ in range(2000):
    text = ''.join(rng.choice(pieces, size=rng.integers(0, 40)))
    a = actions._parse_action(text, 'osvl')
    _assert_well_formed(a, text)
    kinds.add(a.kind)
  assert kinds == {'tool_call', 'response', 'malformed'}


@pytest.mark.parametrize('query', ['what does </tool_call> mean', 'what is <tool_call> for',
                                   '</tool_call><tool_call>{"name": "crop"}</tool_call>', 'a <response>b</response>'])
def test_tool_call_body_is_found_by_parsing_its_json(query):
  """Tags inside a JSON string are text: the whole query is kept and the call stays format_ok."""
  call = json.dumps({'name': 'text_search', 'arguments': {'query': query}})
  for body in (call, f'\n{call}\n', f'```json\n{call}\n```'):
    a = tj.parse_action(THINK + f'<tool_call>{body}</tool_call>')
    assert (a.kind, a.name, a.arguments, a.format_ok, a.problems) == (
        'tool_call', 'text_search', {'query': query}, True, [])


def test_json_found_tool_call_still_reports_real_second_actions_and_missing_close():
  call = json.dumps({'name': 'text_search', 'arguments': {'query': 'what does </tool_call> mean'}})
  two = tj.parse_action(THINK + f'<tool_call>{call}</tool_call><response>Agra</response>')
  assert (two.kind, two.arguments['query'], two.format_ok) == ('tool_call', 'what does </tool_call> mean', False)
  assert two.problems == ['2 actions in one turn (the first is executed)']
  unclosed = tj.parse_action(THINK + f'<tool_call>{call}')
  assert (unclosed.kind, unclosed.arguments['query'], unclosed.problems) == (
      'tool_call', 'what does </tool_call> mean', ['unclosed <tool_call>'])
  lenient = tj.parse_action(THINK + "<tool_call>{'name': 'crop', 'arguments': {'image': 'img_1',}}</tool_call>")
  assert (lenient.kind, lenient.arguments, lenient.format_ok) == ('tool_call', {'image': 'img_1'}, True)


def test_render_assistant_text_parses_back():
  text = tj.render_assistant_text('look', tool_call={'name': 'crop', 'arguments': {'image': 'img_1', 'x': 1}})
  assert text == ('<think>\nlook\n</think>\n<tool_call>\n{"name": "crop", "arguments": {"image": "img_1", '
                  '"x": 1}}\n</tool_call>')
  a = tj.parse_action(text)
  assert (a.kind, a.name, a.arguments, a.format_ok) == ('tool_call', 'crop', {'image': 'img_1', 'x': 1}, True)
  r = tj.parse_action(tj.render_assistant_text('done', response='Agra'))
  assert (r.kind, r.response, r.format_ok) == ('response', 'Agra', True)
  with pytest.raises(ValueError):
    tj.render_assistant_text('x')


@pytest.mark.parametrize('body, answer', [
    (r'\boxed{Agra}', 'Agra'), (r' \boxed{ New Delhi } ', 'New Delhi'), (r'\boxed{{1, 2}}', '{1, 2}'),
    (r'\boxed{f(x) = x^{2}}', 'f(x) = x^{2}'),
    ('Agra', 'Agra'),                                             # unboxed: as it is
    (r'\boxed{a} or \boxed{b}', r'\boxed{a} or \boxed{b}'),       # text beside the box: as it is
    (r'\boxed{Agra', r'\boxed{Agra'), (r'\boxed{a}}', r'\boxed{a}}')])   # unbalanced: as it is
def test_a_boxed_response_is_the_answer_inside_the_box(body, answer):
  """agent_system_v2 (the official agent prompt's form) asks for <response>\\boxed{answer}</response>."""
  action = actions.parse_action(f"<think>\nDone.\n</think>\n<response>{body}</response>")
  assert action.kind == 'response' and action.response == answer and action.format_ok

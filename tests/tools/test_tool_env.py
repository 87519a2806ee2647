"""tools/env.py, tools/schema.py, tools/specs/: schemas, argument checks and error kinds of ToolEnv.call."""

import cv2
import numpy as np
import pytest
from PIL import Image

from osvl_jax import paths
from tools import base
from tools import env as tools_env
from tools import schema


@pytest.fixture(scope='module')
def env():
  return tools_env.ToolEnv()


@pytest.fixture(scope='module')
def taj():
  return np.asarray(Image.open(paths.data_dir() / 'images/landmarks/taj-mahal.jpg').convert('RGB'))


def test_schemas_list_four_tools_with_required_args(env):
  schemas = env.schemas()
  assert [s['function']['name'] for s in schemas] == ['text_search', 'image_search', 'crop', 'sharpen']
  required = {s['function']['name']: s['function']['parameters']['required'] for s in schemas}
  assert required == {'text_search': ['query'], 'image_search': ['image'],
                      'crop': ['image', 'x', 'y', 'width', 'height'], 'sharpen': ['image']}
  for s in schemas:
    assert s['type'] == 'function' and s['function']['description']
    assert s['function']['parameters']['type'] == 'object'
  props = schemas[0]['function']['parameters']['properties']
  assert props['top_k'] == {'type': 'integer', 'description': 'Number of results.', 'minimum': 1,
                            'maximum': 20, 'default': 5}
  assert schemas[1]['function']['parameters']['properties']['image']['type'] == 'string'


def test_config_selects_enabled_tools():
  env = tools_env.ToolEnv({'enabled': ('crop',)})
  assert [s['function']['name'] for s in env.schemas()] == ['crop']
  r = env.call('text_search', {'query': 'x'}, [])
  assert (r.ok, r.error_kind) == (False, 'unknown_tool')
  with pytest.raises(ValueError, match='nope'):
    tools_env.ToolEnv({'enabled': ('nope',)})


def test_text_search_call(env):
  r = env.call('text_search', {'query': 'Taj Mahal Agra mausoleum'}, [])
  assert r.ok and r.error_kind is None and r.seconds > 0
  lines = r.text.split('\n')
  assert len(lines) == 5 and lines[0].startswith('[1] Taj Mahal: ')
  r = env.call('text_search', {'query': 'Taj Mahal', 'top_k': 2.0}, [])  # Integral float is an integer.
  assert r.ok and len(r.text.split('\n')) == 2


def test_text_search_without_hits_is_no_result_and_ok(env):
  r = env.call('text_search', {'query': 'xyzzyqqq'}, [])
  assert (r.ok, r.error_kind, r.is_execution_error) == (True, 'no_result', False)


def test_image_search_call_on_blurred_landmark(env, taj):
  r = env.call('image_search', {'image': 'img_2'}, [np.zeros((8, 8, 3), np.uint8), cv2.GaussianBlur(taj, (0, 0), 2)])
  assert r.ok, r.text
  assert r.text.startswith('Best match: Taj Mahal (Wikipedia article: Taj_Mahal), score ')


def test_image_search_on_unrelated_photo_is_no_result(env):
  astronaut = np.asarray(Image.open(paths.data_dir() / 'images/photos/astronaut.png').convert('RGB'))
  r = env.call('image_search', {'image': 'img_1'}, [astronaut])
  assert (r.ok, r.error_kind) == (True, 'no_result')


def test_crop_and_sharpen_return_new_images(env, taj):
  r = env.call('crop', {'image': 'img_1', 'x': 10, 'y': 20, 'width': 100, 'height': 50}, [taj])
  assert r.ok and len(r.images) == 1 and r.images[0].shape == (50, 100, 3)
  np.testing.assert_array_equal(r.images[0], taj[20:70, 10:110])
  r = env.call('crop', {'image': 'img_1', 'x': 200, 'y': 200, 'width': 100, 'height': 100}, [taj])
  assert r.ok and r.images[0].shape == (64, 64, 3) and 'clamped' in r.text
  r = env.call('sharpen', {'image': 'img_1', 'amount': 1}, [taj])
  assert r.ok and r.images[0].shape == taj.shape and r.images[0].dtype == np.uint8


@pytest.mark.parametrize('name,arguments,kind,needle', [
    ('web_browse', {'url': 'x'}, 'unknown_tool', 'web_browse'),
    ('image_search', {'image': 'img_3'}, 'bad_arguments', 'img_3'),
    ('image_search', {'image': 'picture.png'}, 'bad_arguments', 'image'),
    ('image_search', {'image': 'img_0'}, 'bad_arguments', 'img_0'),
    ('text_search', {}, 'bad_arguments', "'query'"),
    ('text_search', {'query': ['a']}, 'bad_arguments', "'query'"),
    ('text_search', {'query': '  '}, 'bad_arguments', "'query'"),
    ('text_search', {'query': 'a', 'top_k': 0}, 'bad_arguments', "'top_k'"),
    ('text_search', {'query': 'a', 'top_k': True}, 'bad_arguments', "'top_k'"),
    ('text_search', {'query': 'a', 'hl': 'en'}, 'bad_arguments', "'hl'"),
    ('text_search', 'Taj Mahal', 'bad_arguments', 'JSON object'),
    ('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 10}, 'bad_arguments', "'height'"),
    ('crop', {'image': 'img_1', 'x': '0', 'y': 0, 'width': 10, 'height': 10}, 'bad_arguments', "'x'"),
    ('crop', {'image': 'img_1', 'x': 0.5, 'y': 0, 'width': 10, 'height': 10}, 'bad_arguments', "'x'"),
    ('crop', {'image': 'img_1', 'x': 500, 'y': 0, 'width': 10, 'height': 10}, 'bad_arguments', 'outside'),
    ('sharpen', {'image': 'img_1', 'amount': 0}, 'bad_arguments', "'amount'"),
    ('sharpen', {'image': 'img_1', 'amount': 'strong'}, 'bad_arguments', "'amount'"),
])
def test_errors_have_their_kind_and_name_the_culprit(env, taj, name, arguments, kind, needle):
  r = env.call(name, arguments, [taj, taj])
  assert (r.ok, r.error_kind) == (False, kind), r.text
  assert needle in r.text
  assert r.is_execution_error and r.images == []


def test_backend_exception_is_backend_error(env):
  schema.register(schema.ToolSpec(
      name='_explode', description='test tool', params=(),
      make=lambda cfg: (lambda: 1 / 0)))
  try:
    env2 = tools_env.ToolEnv({'enabled': ('crop', '_explode')})
    r = env2.call('_explode', {}, [])
    assert (r.ok, r.error_kind) == (False, 'backend_error')
    assert 'ZeroDivisionError' in r.text
  finally:
    del schema.TOOLS['_explode']


def test_call_accepts_gray_and_objects_with_pixels(env, taj):
  class Ref:
    pixels = taj
  r = env.call('crop', {'image': 'img_2', 'x': 0, 'y': 0, 'width': 5, 'height': 5}, [taj[..., 0], Ref()])
  assert r.ok and r.images[0].shape == (5, 5, 3)
  r = env.call('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 5, 'height': 5}, [taj[..., 0]])
  assert r.ok and r.images[0].shape == (5, 5, 3)


def test_indexes_are_shared_across_envs():
  from tools import image_search, text_search
  tools_env.ToolEnv().warmup()
  assert text_search.get_index() is text_search.get_index()
  assert image_search.get_index() is image_search.get_index()


def test_result_type_is_tool_result(env):
  assert isinstance(env.call('nope', {}, []), base.ToolResult)


def test_official_profile_schemas_use_the_release_names_and_arguments():
  env = tools_env.ToolEnv({'tool_schema': 'official', 'enabled': (
      'text_search', 'image_search', 'ocr', 'crop', 'sharpen', 'super_resolution', 'perspective_correct')})
  fns = {s['function']['name']: s['function']['parameters'] for s in env.schemas()}
  assert list(fns) == ['text_search', 'image_search', 'layout_parsing', 'crop', 'sharpen', 'super_resolution',
                       'perspective_correct']
  assert list(fns['text_search']['properties']) == ['q', 'hl', 'top_k'] and fns['text_search']['required'] == ['q']
  assert list(fns['image_search']['properties']) == ['url']
  assert list(fns['layout_parsing']['properties']) == ['image', 'use_chart_recognition',
                                                       'use_doc_orientation_classify']
  assert fns['layout_parsing']['properties']['use_chart_recognition']['type'] == 'boolean'
  assert list(fns['crop']['properties']) == ['image', 'x', 'y', 'width', 'height']
  assert list(fns['sharpen']['properties']) == ['image', 'amount']
  assert list(fns['super_resolution']['properties']) == ['image', 'scale']


def test_official_profile_calls_run_our_tools(taj):
  env = tools_env.ToolEnv({'tool_schema': 'official', 'enabled': ('text_search', 'image_search', 'crop')})
  r = env.call('text_search', {'q': 'Taj Mahal Agra mausoleum', 'hl': 'en', 'top_k': 2}, [])
  assert r.ok and r.text.startswith('[1] Taj Mahal: ') and len(r.text.split('\n')) == 2
  r = env.call('image_search', {'url': 'img_1'}, [cv2.GaussianBlur(taj, (0, 0), 2)])
  assert r.ok and r.text.startswith('Best match: Taj Mahal')
  r = env.call('text_search', {'query': 'Taj Mahal'}, [])  # Our names still work (the parser maps to them).
  assert r.ok
  r = env.call('image_search', {'url': 'https://example.org/x.jpg'}, [])
  assert r.error_kind == 'bad_arguments'  # The local backend needs pixels.


def test_unknown_profile_and_backend_are_rejected():
  with pytest.raises(ValueError, match='tool_schema'):
    tools_env.ToolEnv({'tool_schema': 'hermes'})
  with pytest.raises(NotImplementedError, match='ocr backend'):
    tools_env.ToolEnv({'enabled': ('ocr',), 'ocr': {'backend': 'cloud'}})


def test_alias_tables_are_defined_once_and_match_the_official_schemas():
  assert schema.TOOL_NAME_ALIASES == {'web_search': 'text_search', 'layout_parsing': 'ocr'}
  assert schema.ARGUMENT_ALIASES == {'q': 'query', 'url': 'image'}
  assert schema.OFFICIAL_ONLY_ARGUMENTS == ('hl', 'use_chart_recognition', 'use_doc_orientation_classify')
  assert schema.TOOLS['text_search'].official.rename == {'q': 'query'}
  assert schema.TOOLS['image_search'].official.rename == {'url': 'image'}
  assert schema.TOOLS['ocr'].official.name == 'layout_parsing'
  with pytest.raises(ValueError, match='TOOL_NAME_ALIASES'):
    schema.register(schema.ToolSpec('_bad', 'test tool', (), make=lambda cfg: None,
                                    official=schema.OfficialSchema('bad_official', ())))
  with pytest.raises(ValueError, match='ARGUMENT_ALIASES'):
    schema.register(schema.ToolSpec('_bad', 'test tool', (), make=lambda cfg: None,
                                    official=schema.OfficialSchema('_bad', (schema.Param('zzz', 'string', 'z'),))))
  assert '_bad' not in schema.TOOLS


# Numbers and references the JSON parser hands over that overflow Python's conversions (10**400 is a valid JSON
# number; int() refuses strings of more than 4300 digits): bad_arguments naming the argument, never
# backend_error. Each call goes through the real parser (osvl_jax.trajectory.parse_action) first.
_CROP = '{"image": "img_1", "x": 0, "y": 0, "width": %s, "height": 10}'


@pytest.mark.parametrize('raw, needle', [
    (_CROP % ('1' + '0' * 400), "'width'"),  # 10**400
    (_CROP % ('-1' + '0' * 400), "'width'"),  # -10**400
    (_CROP % '1e400', "'width'"),  # a float literal that parses to inf
    (_CROP % 'NaN', "'width'"),
    (_CROP % 'Infinity', "'width'"),
    (_CROP % '-Infinity', "'width'"),
    (_CROP % '9007199254740993', "'width'"),  # 2**53 + 1
    (_CROP % '1e300', "'width'"),
    (_CROP % 'true', "'width'"),  # bool where an integer is expected
    (_CROP % '10.5', "'width'"),  # non-integral float where an integer is expected
    ('{"image": "img_%s", "x": 0, "y": 0, "width": 10, "height": 10}' % ('1' * 5000), "'image'"),
    ('{"image": "img_%s", "x": 0, "y": 0, "width": 10, "height": 10}' % ('9' * 400), "'image'"),
    ('{"image": "img_0000", "x": 0, "y": 0, "width": 10, "height": 10}', "'image'"),
], ids=['1e400-int', 'neg-1e400-int', '1e400-float', 'nan', 'inf', 'neg-inf', '2p53+1', '1e300', 'bool',
        'float-10.5', 'img-5000-digits', 'img-400-digits', 'img-0000'])
def test_overflowing_arguments_are_bad_arguments(env, taj, raw, needle):
  from osvl_jax import trajectory as tj  # pylint: disable=import-outside-toplevel
  action = tj.parse_action(f'<think>\nt\n</think>\n<tool_call>\n{{"name": "crop", "arguments": {raw}}}\n'
                           '</tool_call>')
  assert action.kind == 'tool_call', action
  r = env.call(action.name, action.arguments, [taj])
  assert (r.ok, r.error_kind) == (False, 'bad_arguments'), r.text
  assert needle in r.text and len(r.text) < 400  # the 5,000 digits are not echoed


@pytest.mark.parametrize('arguments, shape', [
    ({'x': -0.0, 'y': 0, 'width': 10.0, 'height': 5}, (5, 10, 3)),  # -0.0 -> 0, 10.0 -> 10
    ({'x': 0, 'y': -0.0, 'width': 2 ** 53, 'height': 5}, None),  # at the limit: the crop body decides
])
def test_neighbours_of_the_overflow_checks(env, taj, arguments, shape):
  r = env.call('crop', {'image': 'img_0001', **arguments}, [taj])  # leading zeros: img_1
  if shape is None:
    assert r.error_kind != 'backend_error', r.text
  else:
    assert r.ok and r.images[0].shape == shape, r.text
    np.testing.assert_array_equal(r.images[0], taj[:5, :10])


def test_number_checks_directly():
  width = schema.Param('width', 'integer', 'w', minimum=1)
  amount = schema.Param('amount', 'number', 'a')
  check = lambda p, v: schema.check_arguments('t', (p,), {p.name: v}, [])[p.name]
  assert check(width, 3.0) == 3 and type(check(width, 3.0)) is int
  assert check(width, 2 ** 53) == 2 ** 53
  assert str(check(amount, -0.0)) == '0.0' and check(amount, 7) == 7.0
  for bad in (10 ** 400, -(10 ** 400), 2 ** 53 + 1, float('nan'), float('inf'), True, 1.5, '3'):
    with pytest.raises(schema.ArgumentError, match="'width'"):
      check(width, bad)
  for bad in (10 ** 400, float('nan'), float('-inf'), False, [1]):
    with pytest.raises(schema.ArgumentError, match="'amount'"):
      check(amount, bad)

"""`python -m osvl_jax.serve --tiny` with image limits: images over the pixel limits are refused from their headers
(the server process's peak RSS barely moves), eight large images at once decode within the memory bound the
server states in /server_info; max_new_tokens over --max_new_tokens_limit (default: the context), prompts that leave no
room for a new token and bodies over --max_body_bytes are refused."""

import base64
import concurrent.futures
import struct
import zlib

import httpx
import pytest

from osvl_jax import trajectory as tj
from tests.serve.conftest import MAX_LEN, healthy_server

SIDE = 2048                 # accepted images: SIDE x SIDE
FLAGS = (f'--max_image_pixels={SIDE * SIDE}', f'--max_request_pixels={2 * SIDE * SIDE}',
         '--max_concurrent_decodes=2', '--max_body_bytes=8000000')


def png(width: int, height: int, shade: int = 0) -> bytes:
  """A valid RGB PNG, written row by row (the test never holds the decoded image): a horizontal gradient."""
  row = b'\x00' + bytes((x * 3 + c + shade) % 256 for x in range(width) for c in range(3))
  z = zlib.compressobj(6)
  data = b''.join(z.compress(row) for _ in range(height)) + z.flush()

  def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack('>I', len(payload)) + kind + payload + struct.pack('>I', zlib.crc32(kind + payload))
  return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0))
          + chunk(b'IDAT', data) + chunk(b'IEND', b''))


def rss_field(pid: int, key: str) -> int:
  """VmRSS / VmHWM (peak) of a process, bytes."""
  with open(f'/proc/{pid}/status') as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ':'))


def image_body(items, max_new=1):
  ids = [1]
  for _ in items:
    ids += [tj.VISION_START_ID, tj.IMAGE_PAD_ID, tj.VISION_END_ID]
  return {'input_ids': ids, 'image_data': [base64.b64encode(i).decode() for i in items],
          'sampling_params': {'max_new_tokens': max_new, 'temperature': 0}}


@pytest.fixture(scope='module')
def server(tmp_path_factory):
  log = tmp_path_factory.mktemp('limits') / 'w.log'
  with healthy_server(log, *FLAGS) as url:
    yield url


def post_all(url, bodies):
  with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
    return list(pool.map(lambda b: httpx.post(url + '/generate', json=b, timeout=300), bodies))


def test_image_limits_and_the_decode_memory_bound(server):
  limits = httpx.get(server + '/server_info', timeout=30).json()['request_limits']
  assert limits['max_image_pixels'] == SIDE * SIDE and limits['max_concurrent_decodes'] == 2
  bound = limits['decode_memory_bytes']
  assert bound == 2 * (SIDE * SIDE * limits['decode_bytes_per_pixel'] + 2 * SIDE * SIDE * 3)
  proc = _server_pid(server)
  huge = png(8192, 8192)
  assert len(huge) < 1 << 20
  # A served SIDE^2 image (the programs compile here, outside the measurements).
  assert post_all(server, [image_body([png(SIDE, SIDE)])])[0].status_code == 200
  with open(f'/proc/{proc}/clear_refs', 'w') as f:   # resets the peak RSS (VmHWM) to the current RSS
    f.write('5')
  base = rss_field(proc, 'VmRSS')
  replies = post_all(server, [image_body([huge])] * 8)
  assert [r.status_code for r in replies] == [400] * 8
  assert all(f'is 8192x8192 = 67108864 pixels, above the server limit --max_image_pixels={SIDE * SIDE}'
             in r.json()['error']['message'] for r in replies)
  assert rss_field(proc, 'VmHWM') - base < 64 << 20   # nothing decoded: bodies and bookkeeping only
  # Eight SIDE^2 images at once, each decoded and processed, then refused for their pad count (so the model
  # never runs and only the decodes are measured): at most 2 decode together, within the stated bound.
  bodies = [{**image_body([png(SIDE, SIDE, shade=k)]), 'input_ids': [1, tj.VISION_START_ID, tj.IMAGE_PAD_ID,
                                                                      tj.IMAGE_PAD_ID, tj.VISION_END_ID]}
            for k in range(8)]
  with open(f'/proc/{proc}/clear_refs', 'w') as f:
    f.write('5')
  base = rss_field(proc, 'VmRSS')
  replies = post_all(server, bodies)
  assert all(r.status_code == 400 and 'input_ids hold 2 <|image_pad|> but 1 image(s)' in r.json()['error']['message']
             for r in replies), [r.text for r in replies]
  growth = rss_field(proc, 'VmHWM') - base
  print(f'peak RSS growth {growth / 2**20:.0f} MiB, stated bound {bound / 2**20:.0f} MiB')
  assert growth < bound, (growth, bound)
  info = httpx.get(server + '/server_info', timeout=30).json()['request_limits']
  assert 1 <= info['peak_decodes'] <= 2
  # The request's images together over --max_request_pixels: refused before any decode.
  reply = post_all(server, [image_body([png(SIDE, SIDE)] * 3)])[0]
  assert reply.status_code == 400
  assert f'above the server limit --max_request_pixels={2 * SIDE * SIDE}' in reply.json()['error']['message']


def _server_pid(url: str) -> int:
  """The pid of the process listening on url's port (from /proc/net/tcp and the fds of our children)."""
  import os  # pylint: disable=g-import-not-at-top
  import psutil  # pylint: disable=g-import-not-at-top
  port = int(url.rsplit(':', 1)[1])
  for child in psutil.Process(os.getpid()).children(recursive=True):
    if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in child.net_connections()):
      return child.pid
  raise RuntimeError(f'no child process listens on {port}')


def test_token_limits_and_body_size(server):
  ids = list(range(100, 110))
  reply = httpx.post(server + '/generate', json={'input_ids': ids, 'sampling_params': {'max_new_tokens': 10**9}},
                     timeout=60)
  assert reply.status_code == 400   # the default --max_new_tokens_limit is the context (--max_len)
  assert f'max_new_tokens=1000000000 is above the server limit --max_new_tokens_limit={MAX_LEN}' in reply.text
  reply = httpx.post(server + '/generate', json={'input_ids': list(range(100, 9100))}, timeout=60)
  assert reply.status_code == 400
  assert (f'the prompt has 9000 tokens; with at least 1 new token it needs 9001, more than the context length of '
          f'{MAX_LEN} tokens') in reply.json()['error']['message']
  reply = httpx.post(server + '/generate', content=b'{"input_ids": [' + b'100, ' * 7_000_000 + b'1]}', timeout=60)
  assert reply.status_code == 413 and '--max_body_bytes=8000000' in reply.json()['error']['message']
  ok = httpx.post(server + '/generate', json={'input_ids': ids, 'sampling_params': {'max_new_tokens': 2}},
                  timeout=120)
  assert ok.status_code == 200 and len(ok.json()['output_ids']) == 2

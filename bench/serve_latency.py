"""Latency isolation of `python -m osvl_jax.serve`: a short text request beside a cache flush and beside an image
flood, against the same request alone.

  .venv/bin/python bench/serve_latency.py [--new-tokens 8] [--long-tokens 1500] [--images 150]
      [--image-side 1024] [--probes 5] [--flood-nice 19] [--url http://HOST:PORT]

Starts `python -m osvl_jax.serve --tiny --compile_ahead` on a free 127.0.0.1 port (or uses `--url`), runs every
case once to warm its shapes up (the compile is not timed), then times a greedy `--new-tokens` text request:
  alone: the median of 3;
  flush: sent right after a `/flush_cache`, itself sent while a `--long-tokens` request generates;
  image flood: sent 0.2 s after `--images` one-image requests (random `--image-side` PNGs, so decoding costs
    what a real screenshot does) were sent at once from another process (as from other clients: the flood's
    bodies are JSON-encoded before the clock starts and hold neither the timed client's GIL nor its CPU time;
    the process runs at nice `--flood-nice`, so that on one machine its CPU stands for other machines': 0 lets
    it take the server's cores), then up to `--probes` - 1 more, 0.3 s apart, while the flood lasts.
Prints the latencies, then last `flush_ratio=<flush / alone> image_flood_ratio=<the first flood probe / alone>`
(target <= 2) `image_flood_median_ratio=<median of the probes / alone> image_flood_max_ratio=<slowest / alone>`.
Feeds BENCHMARKS.md, "Serving".
"""

import argparse
import base64
import concurrent.futures
import io
import multiprocessing
import os
import statistics
import time




def _post(url: str, content: bytes) -> float:
  """Seconds to answer a `/generate` body, JSON already encoded (raises on an error status)."""
  import httpx  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  httpx.post(url + '/generate', content=content, headers={'Content-Type': 'application/json'},
             timeout=3600).raise_for_status()
  return time.perf_counter() - t0


def _flood(url: str, body: dict, n: int, nice: int, ready, go, done) -> None:
  """A client process at nice `nice`: encodes `body` once, sets `ready`, then once `go` is set sends it `n` times
  at once; puts the slowest answer's seconds in `done`. Other clients' CPU is not the server's."""
  os.nice(nice)
  import json  # pylint: disable=g-import-not-at-top
  import httpx  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (imported before `ready`)
  content = json.dumps(body).encode()
  with concurrent.futures.ThreadPoolExecutor(n) as pool:
    ready.set()
    go.wait()
    done.put(max(pool.map(lambda _: _post(url, content), range(n))))


def main() -> None:
  parser = argparse.ArgumentParser(prog='serve_latency.py', description=__doc__.split('\n')[0])
  parser.add_argument('--new-tokens', type=int, default=8)
  parser.add_argument('--long-tokens', type=int, default=1500)
  parser.add_argument('--images', type=int, default=150)
  parser.add_argument('--image-side', type=int, default=1024)
  parser.add_argument('--probes', type=int, default=5, help='text requests timed behind the flood (>= 1)')
  parser.add_argument('--flood-nice', type=int, default=19, help="the flood client's nice value (0-19)")
  parser.add_argument('--url', default=None, help='an already running server (default: start a tiny one)')
  args = parser.parse_args()
  if args.probes < 1:
    parser.error(f'--probes must be >= 1, got {args.probes}')
  if not 0 <= args.flood_nice <= 19:
    parser.error(f'--flood-nice must be in [0, 19], got {args.flood_nice}')

  import httpx  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  from osvl_jax.serve import launch  # pylint: disable=g-import-not-at-top

  flags = ['--tiny', '--bucket=64', f'--max_len={args.long_tokens + 256}', '--max_batch=256', '--compile_ahead']
  with launch.local_server(flags, args.url) as url:

    def generate(ids, new, image=None):
      body = {'input_ids': ids, 'sampling_params': {'max_new_tokens': new, 'temperature': 0}}
      if image is not None:
        body['image_data'] = [image]
      t0 = time.perf_counter()
      r = httpx.post(url + '/generate', json=body, timeout=3600)
      r.raise_for_status()
      return time.perf_counter() - t0, r.json()['meta_info']['completion_tokens']

    rng = np.random.default_rng(0)
    text = [int(i) for i in rng.integers(100, 150000, size=32)]
    image_ids = text[:8] + [tj.VISION_START_ID, tj.IMAGE_PAD_ID, tj.VISION_END_ID] + text[8:16]
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (args.image_side, args.image_side, 3), dtype=np.uint8)).save(buf, 'PNG')
    image = 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode()
    generate(text, args.new_tokens)                                   # warm-up: the shapes timed below
    generate(image_ids, args.new_tokens, image)
    with concurrent.futures.ThreadPoolExecutor(args.images + 2) as pool:
      list(pool.map(lambda _: generate(image_ids, args.new_tokens, image), range(8)))
      alone = statistics.median(generate(text, args.new_tokens)[0] for _ in range(3))

      def beside_flush():
        long = pool.submit(generate, text[:16], args.long_tokens)
        time.sleep(1.0)                                               # the long request is generating
        flush = pool.submit(httpx.post, url + '/flush_cache', timeout=3600)
        time.sleep(0.05)
        seconds, _ = generate(text, args.new_tokens)
        assert flush.result().status_code == 200
        return seconds, long.result()

      def behind_flood():
        spawn = multiprocessing.get_context('spawn')
        ready, go, done = spawn.Event(), spawn.Event(), spawn.Queue()
        body = {'input_ids': image_ids, 'image_data': [image],
                'sampling_params': {'max_new_tokens': args.new_tokens, 'temperature': 0}}
        client = spawn.Process(target=_flood, args=(url, body, args.images, args.flood_nice, ready, go, done))
        client.start()
        ready.wait()
        go.set()
        time.sleep(0.2)                                               # the flood is being sent and decoded
        seconds = [generate(text, args.new_tokens)[0]]
        while len(seconds) < args.probes and done.empty():            # later in the flood, 0.3 s apart
          time.sleep(0.3)
          seconds.append(generate(text, args.new_tokens)[0])
        flood_s = done.get()
        client.join()
        return seconds, flood_s

      beside_flush(), behind_flood()                                  # warm-up: their batch shapes compile
      with_flush, (long_s, long_n) = beside_flush()
      floods, flood_s = behind_flood()
    with_flood, later = floods[0], floods[1:]
    print(f'alone {alone:.3f} s; beside a flush (a {long_n}-token request running {long_s:.1f} s) {with_flush:.3f} s; '
          f'behind {args.images} image requests ({args.image_side}px, all answered in {flood_s:.1f} s) '
          f'{with_flood:.3f} s, later in the flood {" ".join(f"{x:.3f}" for x in later) or "-"} s; '
          f'flood client at nice {args.flood_nice}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores')
    spread = (f' image_flood_median_ratio={statistics.median(floods) / alone:.2f} '
              f'image_flood_max_ratio={max(floods) / alone:.2f}' if later else '')
    print(f'flush_ratio={with_flush / alone:.2f} image_flood_ratio={with_flood / alone:.2f}{spread}')


if __name__ == '__main__':
  main()

"""Request batching of `python -m osvl_jax.serve`: 16 concurrent requests vs the same 16 one at a time.

  .venv/bin/python bench/serve_throughput.py [--requests 16] [--prompt-len 48] [--new-tokens 32] [--repeats 2]
      [--batch-window-ms 20] [--url http://HOST:PORT]

Starts `python -m osvl_jax.serve --tiny` on a free 127.0.0.1 port (or uses `--url`), warms both shapes up (the
compile is not timed), then times, interleaved `--repeats` times: the requests sent one after another (each waits
for the previous answer), and the same requests sent at once through `SGLangEngine` (one HTTP request each; the
server batches those waiting). Greedy decoding of exactly `--new-tokens` ids per request (no stop ids), so both
modes do the same work. The server it starts runs without a prefix cache (`--prefix_cache_slots=0`): the same
prompts are sent again and again, and this bench measures request batching alone (bench/rollout_concurrency.py
measures the cache on agent episodes). Prints the best wall time of each mode, the server's batch sizes, the machine load, and
last `batching_speedup=<sequential seconds / concurrent seconds>`. Feeds BENCHMARKS.md, "Serving".
"""

import argparse
import os
import time




def main() -> None:
  parser = argparse.ArgumentParser(prog='serve_throughput.py', description=__doc__.split('\n')[0])
  parser.add_argument('--requests', type=int, default=16)
  parser.add_argument('--prompt-len', type=int, default=48)
  parser.add_argument('--new-tokens', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--batch-window-ms', type=float, default=20.0)
  parser.add_argument('--url', default=None, help='an already running server (default: start a tiny one)')
  args = parser.parse_args()

  import numpy as np  # pylint: disable=g-import-not-at-top

  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.remote import sglang_client  # pylint: disable=g-import-not-at-top
  from osvl_jax.serve import launch  # pylint: disable=g-import-not-at-top

  flags = ['--tiny', '--bucket=64', '--max_len=512', f'--batch_window_ms={args.batch_window_ms}',
           '--prefix_cache_slots=0', f'--max_batch={max(64, args.requests)}']
  with launch.local_server(flags, args.url) as url:
    tokenizer = tj.load_tokenizer()
    engine = sglang_client.SGLangEngine(url, tokenizer, max_new_tokens=args.new_tokens, temperature=0.0,
                                        stop_token_ids=(), concurrency=args.requests)
    rng = np.random.default_rng(0)
    contexts = [(rng.integers(100, 150000, size=args.prompt_len).astype(np.int32), [])
                for _ in range(args.requests)]

    def sequential():
      return [engine.generate([c])[0] for c in contexts]

    def concurrent():
      return engine.generate(contexts)

    sequential()   # warm-up: compiles batch 1 and the batched shapes
    concurrent()
    concurrent()
    times = {'sequential': [], 'concurrent': []}
    for _ in range(args.repeats):
      for name, fn in (('sequential', sequential), ('concurrent', concurrent)):
        t0 = time.perf_counter()
        gens = fn()
        times[name].append(time.perf_counter() - t0)
        assert all(len(g.ids) == args.new_tokens for g in gens), [len(g.ids) for g in gens]
    info = engine.server_info()
    stats = info['internal_states'][0]['stats']
    seq, con = min(times['sequential']), min(times['concurrent'])
    print(f'requests={args.requests} prompt_len={args.prompt_len} new_tokens={args.new_tokens} '
          f'batch_window_ms={args.batch_window_ms} devices={info["devices"]}')
    print(f'sequential_s={seq:.3f} concurrent_s={con:.3f} server_batches={stats["batches"]} '
          f'server_rows={stats["rows"]} max_rows_per_batch={stats["max_rows_per_batch"]}')
    print(f'machine cpus={os.cpu_count()} loadavg={" ".join(f"{x:.2f}" for x in os.getloadavg())}')
    print(f'batching_speedup={seq / con:.2f}')


if __name__ == '__main__':
  main()

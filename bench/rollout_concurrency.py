"""The asyncio agent loop against `python -m osvl_jax.serve --tiny`: episodes one at a time vs all at once.

  .venv/bin/python bench/rollout_concurrency.py [--trajectories 64] [--turns 4] [--tool-latency-ms 200]
      [--concurrency 64] [--new-tokens 16] [--repeats 1] [--url http://HOST:PORT]

Starts `python -m osvl_jax.serve --tiny` on a free 127.0.0.1 port (or uses `--url`), then runs
`agent_loop.run_episodes` over `--trajectories` text-only items (G = 1) twice per repeat: with `max_concurrency=1`
(sequential: each episode runs alone, turn after turn) and with `max_concurrency=--concurrency` (and as many
tool threads). Warm-up (not timed): every context of one episode sent as one batch of each power-of-two size
(the server's compiled programs: batch size x 128-token length bucket), then one rollout of each mode.

Method. Every episode takes exactly `--turns` turns, each a tool call with `--tool-latency-ms` of latency:
  - the tool is the real `text_search` of `tools.env.ToolEnv` (local BM25 over the shared Wikispeedia text,
    top_k 1), behind a bench-local wrapper that sleeps the latency first (`LatencyEnv`; nothing is added to the
    tool registry). Text only: with image tools the server's compiled programs would also be keyed by each
    batch's image grids, and compiles, not rollouts, would be timed;
  - the policy is `ForcedCallEngine`, an `SGLangEngine` that sends every turn to the server as usual (the server
    decodes exactly `--new-tokens` ids, greedy, no stop id, so each turn costs the same real work), then replaces
    the sampled ids (a random tiny model writes no tool call) with the tokens of one fixed text_search call. So
    each episode is `--turns` steps of search + observation and ends on max_turns.
Every rollout (warm-ups included) starts with `/flush_cache`: the server's prefix cache then holds only what
the rollout itself computed, so a turn reuses its own episode's earlier turns (and the shared system prompt), never
the identical contexts of the previous rollout of the same items.
Prints the wall time of each mode (best of `--repeats`), the server's batch statistics, the machine, and last
`speedup_vs_sequential=<sequential seconds / concurrent seconds>`. Feeds BENCHMARKS.md, "Rollout concurrency".
"""

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))



def main() -> None:
  parser = argparse.ArgumentParser(prog='rollout_concurrency.py', description=__doc__.split('\n')[0])
  parser.add_argument('--trajectories', type=int, default=64)
  parser.add_argument('--turns', type=int, default=4)
  parser.add_argument('--tool-latency-ms', type=float, default=200.0)
  parser.add_argument('--concurrency', type=int, default=64)
  parser.add_argument('--new-tokens', type=int, default=16)
  parser.add_argument('--repeats', type=int, default=1)
  parser.add_argument('--url', default=None, help='an already running server (default: start a tiny one)')
  args = parser.parse_args()

  import numpy as np  # pylint: disable=g-import-not-at-top

  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout import agent_loop, engine as engine_lib  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.remote import sglang_client  # pylint: disable=g-import-not-at-top
  from osvl_jax.serve import launch  # pylint: disable=g-import-not-at-top
  from tools import env as tools_env  # pylint: disable=g-import-not-at-top

  call = tj.render_assistant_text('Search the city.', tool_call={'name': 'text_search', 'arguments': {
      'query': 'Taj Mahal city', 'top_k': 1}})

  class ForcedCallEngine(sglang_client.SGLangEngine):
    """Sends each turn to the server (real decode work), then emits the fixed search call instead (docstring)."""

    seen: list = []  # every context sent (the warm-up replays one episode's)

    async def agenerate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
      self.seen.extend(contexts)
      served = await super().agenerate(contexts, args.new_tokens, (), sampling)
      assert all(len(g.ids) == args.new_tokens for g in served), [len(g.ids) for g in served]
      ids = self.tokenizer.encode(call, add_special_tokens=False) + [tj.IM_END_ID]
      return [engine_lib.Generation(ids, np.zeros(len(ids), np.float32), call, engine_lib.FINISH_STOP)
              for _ in served]

  class LatencyEnv:
    """The real ToolEnv, each call `--tool-latency-ms` slower (a remote tool's round trip)."""

    def __init__(self, env):
      self.env = env

    def call(self, name, arguments, images=()):
      time.sleep(args.tool_latency_ms / 1000)
      return self.env.call(name, arguments, images)

  flags = ['--tiny', '--bucket=128', '--max_len=2048', '--batch_window_ms=20',
           f'--max_batch={max(64, args.concurrency)}']
  with launch.local_server(flags, args.url) as url:
    tokenizer = tj.load_tokenizer()
    processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)  # the tiny server's defaults
    env = LatencyEnv(tools_env.ToolEnv({'enabled': ('text_search',)}))
    env.env.warmup()  # loads the BM25 index
    engine = ForcedCallEngine(url, tokenizer, max_new_tokens=args.new_tokens, temperature=0.0, stop_token_ids=(),
                              concurrency=max(64, args.concurrency))
    items = [{'prompt_id': f'q{k}', 'question': f'In which city is monument {k}?', 'answers': ['Agra'],
              'image': None} for k in range(args.trajectories)]

    def rollout(concurrency, n=args.trajectories):
      engine.flush_cache()
      make_builder = lambda: tj.TrajectoryBuilder(tokenizer, processor, env.env.schemas())
      trajs = agent_loop.run_episodes(engine, env, make_builder, items[:n], max_turns=args.turns,
                                      max_concurrency=concurrency, tool_workers=concurrency)
      steps = [(t.stop_reason, len(t.steps), sum(s.result is not None and s.result.ok for s in t.steps))
               for t in trajs]
      assert steps == [('max_turns', args.turns, args.turns)] * n, steps[:4]
      return trajs

    rollout(1, n=1)
    for context in list(engine.seen):
      for size in (1 << k for k in range(max(args.concurrency, 1).bit_length())):
        engine.generate([context] * size)
    rollout(args.concurrency)
    rollout(1, n=2)
    times = {'sequential': [], 'concurrent': []}
    for _ in range(args.repeats):
      for name, concurrency in (('sequential', 1), ('concurrent', args.concurrency)):
        t0 = time.perf_counter()
        rollout(concurrency)
        times[name].append(time.perf_counter() - t0)
    info = engine.server_info()
    stats = info['internal_states'][0]['stats']
    seq, con = min(times['sequential']), min(times['concurrent'])
    print(f'trajectories={args.trajectories} turns={args.turns} tool_latency_ms={args.tool_latency_ms:g} '
          f'new_tokens={args.new_tokens} concurrency={args.concurrency} devices={info["devices"]}')
    print(f'sequential_s={seq:.2f} concurrent_s={con:.2f} tool_sleep_s_per_mode='
          f'{args.trajectories * args.turns * args.tool_latency_ms / 1000:.1f} server_batches={stats["batches"]} '
          f'server_rows={stats["rows"]} max_rows_per_batch={stats["max_rows_per_batch"]}')
    print(f'machine cpus={os.cpu_count()} loadavg={" ".join(f"{x:.2f}" for x in os.getloadavg())}')
    print(f'speedup_vs_sequential={seq / con:.2f}')


if __name__ == '__main__':
  main()

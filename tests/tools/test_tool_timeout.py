"""A tool that never returns is bounded by `tools.call_timeout_s` (tools/env.py; DESIGN.md §5): its call becomes a
`timeout` ToolResult naming the field, the episode goes on, and the process can exit with the tool still stuck.

The stuck tool is a real registered tool whose body waits forever; it runs in a child Python process, so that a
regression (a call or an interpreter exit that waits for it) shows as a child that never ends, killed by the test's
deadline, instead of a hung test session.
"""

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r'''
import json, threading
from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop, engine as engine_lib, factory
from tools import env as tools_env, schema

schema.register(schema.ToolSpec(name='wait_forever', description='Never returns.', params=(),
                                make=lambda cfg: lambda: threading.Event().wait()))
env = tools_env.ToolEnv({'enabled': ('wait_forever',), 'call_timeout_s': 0.5})
direct = env.call('wait_forever', {})
tokenizer = tj.load_tokenizer()
script = [tj.render_assistant_text('Wait.', tool_call={'name': 'wait_forever', 'arguments': {}}),
          tj.render_assistant_text('Done.', response='Agra')]
make_builder = factory.make_builder(tokenizer, tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64), env)
(traj,) = agent_loop.run_episodes(engine_lib.ScriptedEngine(script, tokenizer), env, make_builder,
                                  [{'prompt_id': 'q', 'question': 'Where?', 'answers': ['Agra']}], max_turns=3)
step = traj.steps[0].result
print(json.dumps({'direct': [direct.ok, direct.error_kind, direct.text, direct.seconds],
                  'step': [step.ok, step.error_kind, step.text], 'stop_reason': traj.stop_reason,
                  'final_response': traj.final_response}))
'''


def test_a_tool_that_never_returns_times_out_and_the_process_exits():
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, '-c', CHILD], cwd=ROOT, capture_output=True, text=True, timeout=90)
  assert out.returncode == 0, out.stderr[-3000:]
  assert time.perf_counter() - t0 < 90
  got = json.loads(out.stdout.strip().splitlines()[-1])
  ok, kind, text, seconds = got['direct']
  assert (ok, kind) == (False, 'timeout')
  assert text == 'wait_forever failed: did not return within 0.5 s (tools.call_timeout_s); the call was abandoned'
  assert 0.5 <= seconds < 5
  assert got['step'][:2] == [False, 'timeout'] and 'tools.call_timeout_s' in got['step'][2]
  assert (got['stop_reason'], got['final_response']) == ('response', 'Agra')   # the episode went on

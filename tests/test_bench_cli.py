"""The benchmark scripts answer `--help` with their usage, quickly, without running the benchmark; an unknown
flag is a usage error (exit 2), not a benchmark run."""

import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A line of each script's real output (its docstring, printed by --help, only describes them).
SCRIPTS = {'param_count.py': r'(?m)^config=\S+ flax_params=\d', 'tools_quality.py': r'(?m)^sharpen_psnr_gain_db=-?\d',
           'sft_packing.py': r'(?m)^mode=\w+ steady_step_s='}


def _run(script: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, str(ROOT / 'bench' / script), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
  return out, time.perf_counter() - t0


@pytest.mark.parametrize('script', sorted(SCRIPTS))
def test_help_prints_usage_and_exits_quickly(script):
  out, seconds = _run(script, '--help')
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith(f'usage: {script}'), out.stdout[:500]
  assert not re.search(SCRIPTS[script], out.stdout)  # No benchmark figure was printed.
  assert seconds < 10, f'{script} --help took {seconds:.1f} s'


@pytest.mark.parametrize('script', sorted(SCRIPTS))
def test_unknown_flag_is_a_usage_error(script):
  out, seconds = _run(script, '--no-such-flag')
  assert out.returncode == 2 and 'unrecognized arguments: --no-such-flag' in out.stderr, out.stderr[-2000:]
  assert not re.search(SCRIPTS[script], out.stdout) and seconds < 10

"""The import graph: nothing below the trainers imports them; one `load_policy`.

Start-up cost: the trainers, the server, the pipeline and trajectory building never import torch (it is in this
environment only for the HF reference of the tests; importing it costs a process 5-25 s). tensorboardX would
import it (`metrics._import_tensorboardx`), transformers' image processor too (`trajectory.images`)."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

CHECK = '''
import sys, tempfile, numpy as np
import osvl_jax.train.grpo, osvl_jax.train.sft, osvl_jax.evaluate, data_pipeline.build
import osvl_jax.serve.__main__, osvl_jax.serve.app
from osvl_jax import trajectory as tj
from osvl_jax.train import metrics
ref = tj.ImageProcessor(min_pixels=1024, max_pixels=65536).process(np.zeros((64, 96, 3), np.uint8))
writer = metrics.MetricWriter(tempfile.mkdtemp(), 'sft')
writer.write(1, {'loss': np.float32(1.5)})
writer.close()
print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules), ref.grid_thw.tolist())
import importlib.util  # torch still importable afterwards: no `None` left in sys.modules (find_spec would raise)
print(importlib.util.find_spec('torch') is not None)
'''


def test_no_entry_point_imports_torch():
  pytest.importorskip('torch')
  out = subprocess.run([sys.executable, '-c', CHECK], capture_output=True, text=True, timeout=300, check=True)
  assert out.stdout.split('\n')[:2] == ['[] [1, 4, 6]', 'True'], out.stdout + out.stderr[-2000:]


REPO = pathlib.Path(__file__).resolve().parents[1]
# The programs that drive the trainers (they run or compile them); every other module is below `osvl_jax.train`.
TRAIN_DRIVERS = {'osvl_jax/demo.py', 'osvl_jax/plan/compile_check.py'}


def _imported_modules(path) -> set[str]:
  """Absolute module names a file imports (`from a.b import c` gives a.b and a.b.c), by reading its syntax."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.add(node.module)
      out.update(f'{node.module}.{alias.name}' for alias in node.names)
  return out


def test_nothing_below_the_trainers_imports_them():
  """The server, export, evaluation, the pipeline and the tools take checkpoints, batching and engines from their own
  rooms (`osvl_jax.checkpoints`, ...), never from `osvl_jax.train`."""
  offenders = []
  for root in ('osvl_jax', 'data_pipeline', 'tools'):
    for path in sorted((REPO / root).rglob('*.py')):
      rel = path.relative_to(REPO).as_posix()
      if rel.startswith('osvl_jax/train/') or rel in TRAIN_DRIVERS:
        continue
      offenders += [f'{rel}: {m}' for m in sorted(_imported_modules(path))
                    if m == 'osvl_jax.train' or m.startswith('osvl_jax.train.')]
  assert offenders == []


def test_the_trainers_share_code_through_train_modules_not_through_each_other():
  """sft.py and grpo.py are entry points (absl mains): what both use lives in a `train/` module named for it
  (`policy_config`, `policy`, `data`, `batching`, ...); no `train/` module imports either trainer."""
  trainers = {'osvl_jax.train.sft', 'osvl_jax.train.grpo'}
  offenders = [f'{path.relative_to(REPO).as_posix()}: {m}'
               for path in sorted((REPO / 'osvl_jax' / 'train').glob('*.py'))
               for m in sorted(_imported_modules(path) & trainers)]
  assert offenders == []


def test_one_load_policy():
  defs = [path.relative_to(REPO).as_posix() for path in sorted((REPO / 'osvl_jax').rglob('*.py'))
          if 'def load_policy(' in path.read_text(encoding='utf-8')]
  assert defs == ['osvl_jax/checkpoints/load.py']


def test_engine_capabilities_are_declared_not_probed():
  """`Engine.weight_updates` and `Engine.reseed` say what an engine can do; no caller probes it with hasattr."""
  folders = ('osvl_jax/rollout', 'osvl_jax/serve', 'osvl_jax/train', 'osvl_jax/eval')
  probes = [f'{path.relative_to(REPO).as_posix()}:{n}' for folder in folders
            for path in sorted((REPO / folder).rglob('*.py'))
            for n, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1)
            if 'hasattr(' in line and 'engine' in line]
  assert probes == []


def _lines(folders):
  for folder in folders:
    for path in sorted((REPO / folder).rglob('*.py')):
      for n, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
        yield f'{path.relative_to(REPO).as_posix()}:{n}', line


def test_judge_capabilities_are_declared_not_probed():
  """`judges.base.Judge` declares what a judge does (process_quality, hints, describe, max_concurrency): no caller
  probes a judge with hasattr / getattr, tests its class, or reads its config."""
  probe = re.compile(r'\b(hasattr|getattr|isinstance)\(\s*(self\.)?judge\b|\bjudge\.config\b|RuleJudge\(|'
                     r'LLMJudge\(|_RULE_JUDGE')
  probes = [where for where, line in _lines(('osvl_jax', 'data_pipeline', 'bench'))
            if probe.search(line) and not where.startswith('osvl_jax/judges/')]
  assert probes == []


def test_one_openai_compatible_client():
  """Judges, pipeline stages and the API-model engine all talk to OpenAI endpoints through `osvl_jax.openai_client`:
  nothing else builds an `openai` client."""
  built = [where for where, line in _lines(('osvl_jax', 'data_pipeline', 'tools', 'bench'))
           if re.search(r'\b(Async)?OpenAI\(', line)]
  assert built and all(where.startswith('osvl_jax/openai_client.py:') for where in built), built


# Rooms that read or show what the jobs write sit below the jobs: {room: the rooms it never imports}.
BELOW = {
    'osvl_jax/data': ('osvl_jax.eval', 'osvl_jax.view', 'osvl_jax.train', 'osvl_jax.rollout', 'osvl_jax.plan'),
    'osvl_jax/view': ('osvl_jax.eval', 'osvl_jax.train', 'osvl_jax.plan'),
}


def test_readers_and_the_viewer_import_no_job_above_them():
  """The viewer reads evaluation results through `osvl_jax.data.eval_results`, not `osvl_jax.eval` (which imports
  the viewer to write its pages); the dataset readers import no job."""
  offenders = [f'{path.relative_to(REPO).as_posix()}: {m}' for room, above in BELOW.items()
               for path in sorted((REPO / room).rglob('*.py'))
               for m in sorted(_imported_modules(path)) if any(m == a or m.startswith(a + '.') for a in above)]
  assert offenders == []


def _imports_of(path, above) -> list[str]:
  return [f'{path.relative_to(REPO).as_posix()}: {m}' for m in sorted(_imported_modules(path))
          if any(m == a or m.startswith(a + '.') for a in above)]


# The rollout room: a core (engine interface, agent loop, turn queue, weight publishing, the API key) and one wing per
# kind of engine; the HTTP server (`osvl_jax.serve`) stands above them. {folder: the modules it never imports}.
ROLLOUT_WINGS = {
    'osvl_jax/rollout/embedded': ('osvl_jax.rollout.remote', 'osvl_jax.serve'),
    'osvl_jax/rollout/remote': ('osvl_jax.rollout.embedded', 'osvl_jax.serve'),
    'osvl_jax/serve': ('osvl_jax.rollout.remote',),
}
# The one module of the rollout core that builds engines, so reaches into the wings (lazily, by config).
ENGINE_BUILDER = 'osvl_jax/rollout/factory.py'


def test_the_rollout_wings_import_the_core_not_each_other_nor_the_server():
  """The embedded sampler and the HTTP clients share only the rollout core (`engine`, `api_key`, ...): neither
  imports the other or the server; the server runs the embedded sampler and is no client."""
  offenders = [hit for folder, above in ROLLOUT_WINGS.items() for path in sorted((REPO / folder).rglob('*.py'))
               for hit in _imports_of(path, above)]
  assert offenders == []


def test_the_rollout_core_reaches_the_wings_only_through_the_factory():
  """No upward arrow out of the core: only `factory.make_engine` names an engine's wing, and nothing in the core
  imports the server."""
  offenders = []
  for path in sorted((REPO / 'osvl_jax' / 'rollout').glob('*.py')):
    wings = () if path.relative_to(REPO).as_posix() == ENGINE_BUILDER else ('osvl_jax.rollout.embedded',
                                                                             'osvl_jax.rollout.remote')
    offenders += _imports_of(path, ('osvl_jax.serve', *wings))
  assert offenders == []


def test_nothing_in_the_packages_imports_the_server():
  """`osvl_jax.serve` is a top: the trainers, evaluation, the pipeline and the tools reach a server over HTTP
  (`rollout.remote`), never through its modules (the benches and the tests start one with `serve.launch`)."""
  offenders = [hit for root in ('osvl_jax', 'data_pipeline', 'tools') for path in sorted((REPO / root).rglob('*.py'))
               if not path.relative_to(REPO).as_posix().startswith('osvl_jax/serve/')
               for hit in _imports_of(path, ('osvl_jax.serve',))]
  assert offenders == []

"""Writes `sglang_schema.json`: the request field names of SGLang's HTTP API, parsed from its source.

Command (needs PyPI; the tests read the JSON, they never download):
  .venv/bin/pip download sglang==0.5.23 --no-deps -d /tmp/sgl
  .venv/bin/python tests/serve/make_sglang_schema.py /tmp/sgl/sglang-0.5.23-*.whl

Reads (never imports, never copies code) `sglang/srt/managers/io_struct.py` (GenerateReqInput,
UpdateWeightFromDiskReqInput + its base BaseReq) and `sglang/srt/sampling/sampling_params.py` (SamplingParams) from
the wheel and records each class's annotated field names, with the wheel's version.
"""

import ast
import json
import pathlib
import re
import sys
import zipfile

SOURCES = {'GenerateReqInput': 'sglang/srt/managers/io_struct.py',
           'UpdateWeightFromDiskReqInput': 'sglang/srt/managers/io_struct.py',
           'BaseReq': 'sglang/srt/managers/io_struct.py',
           'SamplingParams': 'sglang/srt/sampling/sampling_params.py'}


def class_fields(source: str, name: str) -> list[str]:
  """Names of the annotated class-level fields of class `name` in `source` (dataclass / msgspec fields)."""
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ClassDef) and node.name == name:
      return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
  raise KeyError(f'class {name} not found')


def main(wheel: str) -> None:
  version = re.search(r'sglang-([^-]+)-', pathlib.Path(wheel).name).group(1)
  out = {'sglang_version': version, 'wheel': pathlib.Path(wheel).name}
  with zipfile.ZipFile(wheel) as zf:
    for cls, path in SOURCES.items():
      out[cls] = class_fields(zf.read(path).decode(), cls)
  out['UpdateWeightFromDiskReqInput'] = out.pop('BaseReq') + out['UpdateWeightFromDiskReqInput']
  target = pathlib.Path(__file__).with_name('sglang_schema.json')
  target.write_text(json.dumps(out, indent=1) + '\n')
  print(f'wrote {target}: sglang {version}, ' + ', '.join(f'{k} {len(v)} fields' for k, v in out.items()
                                                          if isinstance(v, list)))


if __name__ == '__main__':
  main(sys.argv[1])

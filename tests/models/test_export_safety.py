"""Export folders never delete what the export did not write (`osvl_jax.export_folder`): `export_hf` refuses the
workdir, a checkpoint folder, their ancestors and foreign folders, replaces only a previous export and only with
`overwrite`; weight versions (`rollout.weight_publish`) appear complete under their final name and foreign version
folders survive the pruning; exported files honour the umask."""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax import export_folder, export_hf
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel
from osvl_jax.rollout import weight_publish

PIXELS = {'image_processor': {'min_pixels': 32 * 32, 'max_pixels': 64 * 64}}
HF_FILES = {'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja',
            'preprocessor_config.json', 'video_preprocessor_config.json', 'generation_config.json'}


@pytest.fixture(scope='module')
def model():
  return Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))


@pytest.fixture
def workdir(tmp_path, model):
  """tmp/run: data/, sft_ckpt/ (step 2), metrics; and a sibling file tmp/notes.txt."""
  w = tmp_path / 'run'
  (w / 'data').mkdir(parents=True)
  (w / 'data' / 'items.parquet').write_bytes(b'rows')
  (w / 'metrics_sft.jsonl').write_text('{"step": 1}\n')
  checkpoints.save(checkpoints.manager(w, 'sft_ckpt'), 2, model, None, {'stage': 'sft', **PIXELS})
  (tmp_path / 'notes.txt').write_text('keep me')
  return w


def snapshot(root: pathlib.Path) -> dict:
  """{relative path: (size, mtime_ns)} of every file below `root`."""
  return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in root.rglob('*') if p.is_file()}


@pytest.mark.parametrize('where, why', [
    (lambda w: w, 'it is'),                           # the workdir
    (lambda w: w / 'sft_ckpt', 'it is'),              # the checkpoint folder being exported
    (lambda w: w / 'sft_ckpt' / '2', 'inside the checkpoint folder'),
    (lambda w: w.parent, 'it contains'),              # an ancestor of the workdir
])
def test_export_refuses_the_workdir_a_checkpoint_and_their_ancestors_touching_nothing(workdir, where, why):
  before = snapshot(workdir.parent)
  out = where(workdir)
  with pytest.raises(export_folder.UnsafeTarget, match=why) as e:
    export_hf.export(workdir, out, overwrite=True)   # not even with --overwrite
  assert str(out) in str(e.value)
  assert snapshot(workdir.parent) == before
  assert not [p for p in workdir.parent.rglob('.*tmp-*')]


def test_export_refuses_through_a_symlink_to_the_workdir(workdir):
  link = workdir.parent / 'link'
  link.symlink_to(workdir)
  before = snapshot(workdir.parent)
  with pytest.raises(export_folder.UnsafeTarget, match='it is'):
    export_hf.export(workdir, link)
  assert snapshot(workdir.parent) == before


def test_export_refuses_a_non_empty_foreign_folder(workdir):
  out = workdir.parent / 'mine'
  out.mkdir()
  (out / 'thesis.tex').write_text('years of work')
  with pytest.raises(export_folder.UnsafeTarget, match='not a previous export'):
    export_hf.export(workdir, out, overwrite=True)
  assert sorted(p.name for p in out.iterdir()) == ['thesis.tex']


def test_the_cli_exits_non_zero_naming_the_path_and_touches_nothing(workdir):
  before = snapshot(workdir.parent)
  proc = subprocess.run([sys.executable, '-m', 'osvl_jax.export_hf', f'--workdir={workdir}', f'--out={workdir}'],
                        capture_output=True, text=True, timeout=300, cwd=pathlib.Path(__file__).parents[2],
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert proc.returncode != 0
  assert f'--out={workdir}: refused' in proc.stderr
  assert snapshot(workdir.parent) == before


def test_a_previous_export_needs_overwrite_and_then_only_it_is_replaced(workdir, model):
  out = workdir / 'hf'                                   # inside the workdir is fine
  export_hf.export(workdir, out)
  marker = json.loads((out / export_folder.MARKER).read_text())
  assert marker['kind'] == 'hf_export' and marker['step'] == 2 and set(marker['files']) == HF_FILES
  first = snapshot(out)
  with pytest.raises(export_folder.UnsafeTarget, match='--overwrite'):
    export_hf.export(workdir, out)
  assert snapshot(out) == first
  others = {k: v for k, v in snapshot(workdir.parent).items() if not k.startswith('run/hf/')}
  export_hf.export(workdir, out, overwrite=True)
  assert {p.name for p in out.iterdir()} == HF_FILES | {export_folder.MARKER}
  assert snapshot(out)['model.safetensors'][1] != first['model.safetensors'][1]   # rewritten
  assert {k: v for k, v in snapshot(workdir.parent).items() if not k.startswith('run/hf/')} == others
  assert (workdir.parent / 'notes.txt').read_text() == 'keep me'
  assert not [p.name for p in workdir.iterdir() if p.name.startswith('.')]   # no temporary folder left


def test_a_previous_export_holding_a_foreign_file_is_refused_even_with_overwrite(workdir):
  out = workdir.parent / 'hf'
  export_hf.export(workdir, out)
  (out / 'README.md').write_text('my notes')
  with pytest.raises(export_folder.UnsafeTarget, match='README.md'):
    export_hf.export(workdir, out, overwrite=True)
  assert (out / 'README.md').read_text() == 'my notes'


def test_an_edited_marker_or_a_symlinked_folder_cannot_make_overwrite_delete_outside(workdir):
  """A marker that lists '../x' or an absolute path, or a folder replaced by a symlink to other storage: the
  folder is not a previous export (refused even with --overwrite), and the files outside survive."""
  out = workdir.parent / 'hf'
  export_hf.export(workdir, out)
  sibling, shared = workdir.parent / 'sibling.txt', workdir.parent / 'shared'
  sibling.write_text('keep me')
  shared.mkdir()
  (shared / 'config.json').write_text('{}')
  marker = json.loads((out / export_folder.MARKER).read_text())
  for files in (marker['files'] + ['../sibling.txt'], marker['files'] + [str(sibling)]):
    (out / export_folder.MARKER).write_text(json.dumps({**marker, 'files': files}))
    with pytest.raises(export_folder.UnsafeTarget):
      export_hf.export(workdir, out, overwrite=True)
    assert sibling.read_text() == 'keep me'
  (out / export_folder.MARKER).write_text(json.dumps({**marker, 'files': marker['files'] + ['sub/config.json']}))
  (out / 'sub').symlink_to(shared, target_is_directory=True)
  with pytest.raises(export_folder.UnsafeTarget):
    export_hf.export(workdir, out, overwrite=True)
  assert (shared / 'config.json').read_text() == '{}'


def test_an_export_into_an_empty_folder_honours_the_umask(workdir):
  out = workdir.parent / 'empty'
  out.mkdir()
  old = os.umask(0o022)
  try:
    export_hf.export(workdir, out)
  finally:
    os.umask(old)
  assert stat.S_IMODE(out.stat().st_mode) == 0o755
  modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
  assert modes == {name: 0o644 for name in HF_FILES | {export_folder.MARKER}}


def test_a_weight_version_honours_the_umask(tmp_path, model):
  old = os.umask(0o027)
  try:
    out = weight_publish.export_version(model, tmp_path, 1, 1024, 4096, dtype='float32')
  finally:
    os.umask(old)
  assert stat.S_IMODE(out.stat().st_mode) == 0o750
  assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o640}


def test_a_version_folder_appears_only_complete_the_rename_being_the_last_write(tmp_path, model, monkeypatch):
  """At every rename onto `v<version>` the source holds every file and the final name does not exist yet; the
  writer finishes before the final name exists; nothing is written into the folder after the rename."""
  final = tmp_path / weight_publish.folder_name(3)
  renames, written = [], []
  for name in ('replace', 'rename'):
    real = getattr(os, name)

    def spy(src, dst, *args, _real=real, **kwargs):
      if pathlib.Path(dst) == final:
        renames.append((set(os.listdir(src)), pathlib.Path(final).exists()))
      return _real(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, name, spy)
  real_write = export_hf.write_folder

  def write(model, out, *args):
    real_write(model, out, *args)
    written.append(final.exists())
  monkeypatch.setattr(export_hf, 'write_folder', write)
  weight_publish.export_version(model, tmp_path, 3, 1024, 4096, dtype='float32')
  assert written == [False]                                     # complete before `final` exists
  assert renames == [(HF_FILES | {export_folder.MARKER}, False)]  # one rename, of the complete folder
  assert {p.name: p.stat().st_size for p in final.iterdir()} == {
      n: (final / n).stat().st_size for n in renames[0][0]}
  assert sorted(p.name for p in tmp_path.iterdir()) == [final.name]


def test_weight_versions_never_delete_foreign_folders(tmp_path, model):
  export = lambda v: weight_publish.export_version(model, tmp_path, v, 1024, 4096, dtype='float32', keep=1)
  (tmp_path / 'v00000001').mkdir()
  (tmp_path / 'v00000001' / 'mine.bin').write_bytes(b'x')     # a foreign folder under a version's name
  (tmp_path / 'notes.txt').write_text('keep me')
  with pytest.raises(export_folder.UnsafeTarget, match='not a previous export'):
    export(1)
  assert (tmp_path / 'v00000001' / 'mine.bin').read_bytes() == b'x'
  export(2)
  export(3)                                                   # keep=1 prunes v2, never the foreign v1
  assert sorted(p.name for p in tmp_path.iterdir()) == ['notes.txt', 'v00000001', 'v00000003']
  export(3)                                                   # republishing a version replaces only it
  (tmp_path / 'v00000003' / 'extra.txt').write_text('added by hand')
  export(4)                                                   # a version holding a foreign file is kept
  assert (tmp_path / 'v00000003' / 'extra.txt').is_file() and (tmp_path / 'v00000004').is_dir()

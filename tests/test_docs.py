"""The README, BENCHMARKS.md and docs/ pages a reader finds: short enough to read, every link and named file, module
and function real, the README's layout block equal to the tree, every bench naming the BENCHMARKS.md table it feeds."""

import ast
import importlib.util
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / 'README.md'
BENCHMARKS = REPO / 'BENCHMARKS.md'
PAGES = [README, BENCHMARKS, *sorted((REPO / 'docs').glob('*.md'))]
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
CODE = re.compile(r'`([^`]+)`')
PROJECT_PACKAGES = ('osvl_jax', 'data_pipeline', 'tools')
DOTTED_ROOTS = ('osvl_jax', 'data_pipeline')  # `tools.x` in the docs is a config field


def _rel(path: pathlib.Path) -> str:
  return path.relative_to(REPO).as_posix()


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped (but - and _), spaces -> '-'."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower().replace('`', '')).replace(' ', '-')


def _prose(text: str) -> str:
  """`text` without its fenced code blocks."""
  return re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)


def _anchors(path: pathlib.Path) -> set[str]:
  return {_slug(m.group(1)) for m in re.finditer(r'^#+ (.+)$', _prose(path.read_text(encoding='utf-8')), re.M)}


def _table_cells(text: str):
  for n, line in enumerate(text.splitlines(), 1):
    if line.startswith('|'):
      for cell in re.split(r'(?<!\\)\|', line.strip().strip('|')):
        yield n, cell.strip()


def test_readme_and_benchmarks_are_short_with_short_table_cells():
  assert len(README.read_bytes()) <= 8_000
  assert len(BENCHMARKS.read_bytes()) <= 25_000
  long_cells = [f'{_rel(page)}:{n}: {len(cell)} characters' for page in (README, BENCHMARKS)
                for n, cell in _table_cells(page.read_text(encoding='utf-8')) if len(cell) > 300]
  assert long_cells == [], long_cells


def test_every_relative_link_resolves_to_a_file_and_heading():
  broken = []
  for page in PAGES:
    for target in LINK.findall(_prose(page.read_text(encoding='utf-8'))):
      if re.match(r'[a-z]+:', target):
        continue  # http:, https:, mailto:
      file_part, _, anchor = target.partition('#')
      linked = (page.parent / file_part).resolve() if file_part else page
      if not linked.exists():
        broken.append(f'{_rel(page)}: {target} (no such file)')
      elif anchor and (linked.suffix != '.md' or anchor not in _anchors(linked)):
        broken.append(f'{_rel(page)}: {target} (no heading #{anchor} in {linked.name})')
  assert broken == [], broken


def _layout_block() -> list[str]:
  """The names in the README's 'What's where' block, e.g. 'bench/', 'osvl_jax/', 'osvl_jax/data/'."""
  text = README.read_text(encoding='utf-8')
  block = re.search(r"^## What's where\n+```\n(.*?)^```", text, re.S | re.M).group(1)
  names, parent = [], ''
  for line in block.splitlines():
    name, _, description = line.strip().partition(' ')
    assert description.strip(), f'README layout line without a description: {line!r}'
    if line.startswith(' '):
      names.append(parent + name)
    else:
      parent = name
      names.append(name)
  return names


def _tree() -> list[str]:
  """The top-level folders (not hidden, not build outputs) and the packages directly under osvl_jax/."""
  def folders(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(('.', '_', 'workdir', 'build'))
                  and not p.name.endswith('.egg-info'))
  names = []
  for top in folders(REPO):
    names.append(top.name + '/')
    if top.name == 'osvl_jax':
      names += [f'osvl_jax/{p.name}/' for p in folders(top) if (p / '__init__.py').is_file()]
  return names


def test_readme_layout_block_matches_the_tree():
  block, tree = _layout_block(), _tree()
  assert block == tree, f"README's What's where block: {block}; the tree: {tree}"


def test_paths_named_at_the_start_of_layout_lines_exist():
  text = (REPO / 'docs' / 'layout.md').read_text(encoding='utf-8')
  block = re.search(r'^```\n(.*?)^```', text, re.S | re.M).group(1)
  named = [line.split()[0] for line in block.splitlines() if line and not line.startswith(' ')]
  assert len(named) > 10
  assert [name for name in named if not (REPO / name).exists()] == []


def _module_file(module: str) -> pathlib.Path | None:
  base = REPO / module.replace('.', '/')
  for path in (base.with_suffix('.py'), base / '__init__.py'):
    if path.is_file():
      return path
  return None


def _defines(path: pathlib.Path, name: str) -> bool:
  """Whether a module defines (or imports) `name` at its top level."""
  for node in ast.parse(path.read_text(encoding='utf-8')).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
      return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        return True
    if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
      return True
  return False


def test_commands_modules_and_functions_named_in_the_docs_exist():
  """`python -m X`, `bench/X.py`, `bash tpu_scripts/X.sh`, repo paths and `osvl_jax.a.b.Name` in the README and the
  docs/ pages: the docstrings are the reference, and these names must lead to them."""
  missing = []
  for page in [README, *sorted((REPO / 'docs').glob('*.md'))]:
    if page.name == 'benchmarks_history.md':
      continue  # a record of past runs, with the names of the day
    text = page.read_text(encoding='utf-8')
    for module in re.findall(r'python -m ([\w.]+)', text):
      if module.split('.')[0] in PROJECT_PACKAGES and not (
          (REPO / module.replace('.', '/') / '__main__.py').is_file() or _module_file(module)):
        missing.append(f'{page.name}: python -m {module}')
    for script in re.findall(r'\b((?:bench|tpu_scripts)/\w+\.(?:py|sh))\b', text):
      if not (REPO / script).is_file():
        missing.append(f'{page.name}: {script}')
    for code in CODE.findall(text):
      token = code.split()[0] if code.split() else ''
      path = token.split(':')[0].rstrip('/')
      if '/' in path and path.split('/')[0] in {p.name for p in REPO.iterdir()} and not (REPO / path).exists():
        missing.append(f'{page.name}: {token}')
      dotted = re.match(r'((?:%s)(?:\.\w+)+)\b(?![/.])' % '|'.join(DOTTED_ROOTS), token)
      if dotted:
        parts = dotted.group(1).split('.')
        split = max((i for i in range(1, len(parts) + 1) if _module_file('.'.join(parts[:i]))), default=0)
        module_file = _module_file('.'.join(parts[:split])) if split else None
        if module_file is None or (split < len(parts) and not _defines(module_file, parts[split])):
          missing.append(f'{page.name}: {dotted.group(1)}')
  assert missing == [], missing


def test_every_bench_names_the_benchmarks_table_it_feeds():
  headings = {m.group(1).strip() for m in re.finditer(r'^## (.+)$', BENCHMARKS.read_text(encoding='utf-8'), re.M)}
  wrong = []
  for script in sorted((REPO / 'bench').glob('*.py')):
    doc = ast.get_docstring(ast.parse(script.read_text(encoding='utf-8'))) or ''
    sentence = re.search(r'Feeds BENCHMARKS\.md,? (.*?)(?:\.\s|\.$)', doc.replace('\n', ' '))
    fed = re.findall(r'"([^"]+)"', sentence.group(1)) if sentence else []
    if not fed or any(table not in headings for table in fed):
      wrong.append(f'{_rel(script)}: ' + (str(fed) if fed else 'no line Feeds BENCHMARKS.md, "<table heading>"'))
  assert wrong == [], f'known tables: {sorted(headings)}'


def _config(name: str, *arg: str):
  spec = importlib.util.spec_from_file_location(f'docs_{name}', REPO / 'configs' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*arg)


def test_the_paper_pages_name_the_paper_files_prompts_and_judge_fallback():
  """docs/tpu.md (the paper's runs) and docs/evaluation.md (configs/eval_paper.py) name exactly the judge prompts the
  paper files use and their `judge.on_error`; docs/data.md names their system prompt."""
  paper, eval_paper = _config('qwen3vl_paper', 'grpo_8b'), _config('eval_paper')
  prompt = re.compile(r'\b(?:accuracy|query_quality|agent_system)_v\d+\b')
  docs = REPO / 'docs'
  for page, config in (('tpu.md', paper), ('evaluation.md', eval_paper)):
    text = (docs / page).read_text(encoding='utf-8')
    assert set(prompt.findall(text)) == set(config.judge.prompts.values()), page
    assert f"judge.on_error='{config.judge.on_error}'" in text, page
  assert paper.system_prompt in prompt.findall((docs / 'data.md').read_text(encoding='utf-8'))

"""Versioned prompt files of the judges and the evaluated agent (DESIGN.md §9), written for this project.

A prompt is `<name>_v<k>.txt` in this folder; a new wording is a new file (an old version is never edited, so a
report can name exactly the prompt it used). Judge prompts are `str.format` templates (literal braces doubled).

  accuracy_v1        binary semantic equivalence of a response to the reference answers: Correct / Incorrect
  query_quality_v1   one overall 0-1 score of the tool calls
  query_quality_v2   four dimensions (relevance, specificity, progression, tool fit; Sec. 4.2), pre-fatal prefix,
                     `Score:` = their mean
  process_v1         four dimensions of a trajectory's process (grounding, necessity, coherence, faithfulness;
                     Sec. 3), `Score:` = their mean
  agent_system_v1    the agent's system prompt: verify, don't guess; crop / sharpen / perspective_correct;
                     abstain with 'cannot determine'
  agent_direct_v1    no-tool answering (eval mode `direct`)
  agent_rag_v1       one pass over search results given in the user turn (eval mode `rag`)
  canonical_question_v1  the pipeline's `qa` stage: one fluent question naming every path node, asking for the
                     answer node's attribute, in a <question> tag (`data_pipeline.llm_questions`)
  unique_referent_v1 Eq. 6 (ii): given only the rewritten question, does it pick out exactly one entity / answer
                     (JSON verdict yes / no + reason; `data_pipeline.llm_questions.unique_referent`)
"""

import functools
import pathlib
import re

PROMPT_DIR = pathlib.Path(__file__).resolve().parent
_FILE_RE = re.compile(r'^(?P<name>[a-z_]+)_v(?P<version>\d+)\.txt$')


def versions(name: str) -> list[int]:
  """The versions of prompt `name` present, ascending."""
  found = [_FILE_RE.match(p.name) for p in PROMPT_DIR.glob(f'{name}_v*.txt')]
  return sorted(int(m['version']) for m in found if m and m['name'] == name)


def resolve(spec: str) -> tuple[str, int]:
  """('accuracy', 1) from 'accuracy_v1'; the latest version from a bare name like 'accuracy'.

  Raises:
    ValueError: no such prompt (the message lists the prompts present).
  """
  m = re.fullmatch(r'(?P<name>[a-z_]+?)(?:_v(?P<version>\d+))?', spec)
  if m is None:
    raise ValueError(f'bad prompt name {spec!r}')
  name = m['name']
  found = versions(name)
  version = int(m['version']) if m['version'] else (found[-1] if found else None)
  if version is None or version not in found:
    present = sorted(p.stem for p in PROMPT_DIR.glob('*.txt'))
    raise ValueError(f'prompt {spec!r} not found in {PROMPT_DIR}; present: {present}')
  return name, version


@functools.lru_cache(maxsize=None)
def load(spec: str) -> str:
  """The text of prompt `spec` ('name_vK', or 'name' for the latest), without its trailing newline.

  Raises:
    ValueError: from `resolve`.
  """
  name, version = resolve(spec)
  return (PROMPT_DIR / f'{name}_v{version}.txt').read_text(encoding='utf-8').rstrip('\n')


def versioned_name(spec: str) -> str:
  """'accuracy_v1' for 'accuracy' (the latest) or 'accuracy_v1'."""
  name, version = resolve(spec)
  return f'{name}_v{version}'

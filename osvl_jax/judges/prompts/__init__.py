"""Versioned prompt files of the judges and the evaluated agent (DESIGN.md §9), written for this project.

A prompt is `<name>_v<k>.txt` in this folder; a new wording is a new file (an old version is never edited, so a
report can name exactly the prompt it used). Judge prompts are `str.format` templates (literal braces doubled);
`JUDGE_FIELDS` lists the fields the LLM judge fills for each kind (a version may use any subset of them).

  accuracy_v1        binary semantic equivalence of a response to the reference answers: Correct / Incorrect
  accuracy_v2        the paper's protocol (PAPER.md, "judge and agent protocols"; the LLM judge's default): does the
                     response contain the correct answer anywhere in it; reply `correct: yes|no` then `reasoning:
                     ...`; adds rules of its own (a hedged list of candidates, a refusal: not present)
  accuracy_v3        the paper's protocol as PAPER.md describes it (Figs. 8 / 10), without v2's added rules (the
                     paper configs')
  query_quality_v1   one overall 0-1 score of the tool calls
  query_quality_v2   four dimensions (relevance, specificity, progression, tool fit; Sec. 4.2), pre-fatal prefix,
                     `Score:` = their mean
  query_quality_v3   the paper's protocol (the default): question, reference answer, the agent's final answer and a
                     summary of the pre-fatal tool calls (`llm.summarize_trajectory`: at most 20 steps, arguments cut
                     to 200 characters, results to 400); only the search calls (`tools.base.SEARCH_TOOLS`) are
                     rated, on five criteria (image-search utility, text-search utility, query progression,
                     image-text complementarity, evidence-to-noise ratio), anchored 0.0 / 0.3 / 0.5 / 0.7 / 1.0;
                     reply `score: <float>` then `reasoning: <2-3 sentences>`; adds rules of its own (only the
                     search calls rated, the answer's correctness not deciding)
  query_quality_v4   the paper's protocol as PAPER.md describes it (Fig. 11): v3's inputs, criteria and scale, without
                     its added rules (the paper configs')
  process_v1         four dimensions of a trajectory's process (grounding, necessity, coherence, faithfulness;
                     Sec. 3), `Score:` = their mean
  agent_system_v1    the agent's system prompt: verify, don't guess; crop / sharpen / perspective_correct;
                     abstain with 'cannot determine'
  agent_system_v2    the paper's agent protocol in this project's wording, <response>\\boxed{...}</response>; adds an
                     abstention rule ('cannot determine') and leaves out some of the paper's (tool chaining, the
                     <tools> signatures, a text_search after every image_search)
  agent_system_v3    the paper's agent prompt as PAPER.md describes it (Fig. 7), no abstention rule (the paper
                     configs')
  agent_direct_v1    no-tool answering (eval mode `direct`)
  agent_rag_v1       one pass over search results given in the user turn (eval mode `rag`)
  canonical_question_v1  the pipeline's `qa` stage: one fluent question naming every path node, asking for the
                     answer node's attribute, in a <question> tag (`data_pipeline.llm_questions`)
  unique_referent_v1 Eq. 6 (ii): given only the rewritten question, does it pick out exactly one entity / answer
                     (JSON verdict yes / no + reason; `data_pipeline.llm_questions.unique_referent`)
  descriptor_proposal_v1  the `rewrite` stage's descriptor proposal: from an entity's title, class and article lead,
                     up to N descriptors more specific than its class, ending with it (a JSON list of strings;
                     `data_pipeline.llm_descriptors`)
  unique_referent_step_v1  Eq. 6 (ii) per rewrite step: given the partially rewritten question and the description
                     just introduced, does it pick out exactly one entity (JSON verdict yes / no + reason;
                     `data_pipeline.llm_descriptors`)
"""

import functools
import pathlib
import re
import string

PROMPT_DIR = pathlib.Path(__file__).resolve().parent
_FILE_RE = re.compile(r'^(?P<name>[a-z_]+)_v(?P<version>\d+)\.txt$')

# judge kind -> the `str.format` fields `osvl_jax.judges.llm.LLMJudge` fills (a prompt may leave any of them out):
#   question       the user question;  answers   the reference answer and its aliases, joined by ' | '
#   response       the agent's response (accuracy);  final_answer  the same for the query judge ('(none ...)' if none)
#   calls          the tool calls as `llm.format_calls` lists them (query_quality_v1 / v2)
#   trajectory     the summary `llm.summarize_trajectory` writes (query_quality_v3);  search_tools  their names
#   transcript     the whole trajectory as `llm.format_transcript` writes it (process)
JUDGE_FIELDS = {
    'accuracy': ('question', 'answers', 'response'),
    'query_quality': ('question', 'answers', 'final_answer', 'calls', 'trajectory', 'search_tools'),
    'process': ('question', 'answers', 'transcript'),
}


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


def load(spec: str) -> str:
  """The text of prompt `spec` ('name_vK', or 'name' for the latest), without its trailing newline, as the file is
  now (a file edited under its name reads anew: the cache is keyed by its modification time and size).

  Raises:
    ValueError: from `resolve`.
  """
  name, version = resolve(spec)
  path = PROMPT_DIR / f'{name}_v{version}.txt'
  stat = path.stat()
  return _read(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read(path, mtime_ns: int, size: int) -> str:
  del mtime_ns, size   # the cache key: the file as it is now
  return path.read_text(encoding='utf-8').rstrip('\n')


def versioned_name(spec: str) -> str:
  """'accuracy_v1' for 'accuracy' (the latest) or 'accuracy_v1'."""
  name, version = resolve(spec)
  return f'{name}_v{version}'


def fields(spec: str) -> set[str]:
  """The `str.format` field names prompt `spec` uses ({'question', 'answers', 'response'} for 'accuracy_v2').

  Raises:
    ValueError: from `resolve`, or a template `str.format` cannot read (an unmatched brace), naming the prompt.
  """
  try:
    return {name for _, name, _, _ in string.Formatter().parse(load(spec)) if name is not None}
  except ValueError as e:
    raise ValueError(f'prompt {spec!r} is not a str.format template ({e}); double literal braces') from e


def check_judge_prompt(kind: str, spec: str) -> str:
  """Checks that `spec` names a prompt that the LLM judge can fill for judgement `kind`; returns its versioned name.

  Args:
    kind: a `JUDGE_FIELDS` key ('accuracy', 'query_quality', 'process').
    spec: a prompt name ('accuracy_v2', or 'accuracy' for the latest).
  Raises:
    ValueError: an unknown kind, a prompt not found, or one using a field outside `JUDGE_FIELDS[kind]` (naming the
      fields it may use).
  """
  if kind not in JUDGE_FIELDS:
    raise ValueError(f'judge prompt kind {kind!r} is not one of {sorted(JUDGE_FIELDS)}')
  unknown = sorted(fields(spec) - set(JUDGE_FIELDS[kind]))
  if unknown:
    raise ValueError(f'prompt {spec!r} ({kind}) uses fields {unknown} that the judge does not fill; it may use '
                     f'{list(JUDGE_FIELDS[kind])}')
  return versioned_name(spec)

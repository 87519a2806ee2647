"""Qwen3-VL configuration: plain dataclasses that parse and emit Hugging Face `config.json` dicts.

`Qwen3VLConfig.from_hf_dict` reads both the hub layout (`rope_scaling` + `rope_theta` in `text_config`, as in
`Qwen/Qwen3-VL-8B-Instruct/config.json`) and the transformers>=5 layout (`rope_parameters`).
`Qwen3VLConfig.to_hf_dict` writes a dict that `transformers.Qwen3VLConfig(**d)` accepts, so the same config builds
the PyTorch reference model in the parity tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from osvl_jax.trajectory import tokens as tokens_lib


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """Qwen3 text decoder (mirrors `transformers.Qwen3VLTextConfig`)."""
  vocab_size: int = 151936
  hidden_size: int = 4096
  intermediate_size: int = 12288
  num_hidden_layers: int = 36
  num_attention_heads: int = 32
  num_key_value_heads: int = 8
  head_dim: int = 128
  rms_norm_eps: float = 1e-6
  rope_theta: float = 5_000_000.0
  mrope_section: tuple[int, int, int] = (24, 20, 20)
  mrope_interleaved: bool = True
  attention_bias: bool = False
  max_position_embeddings: int = 262144
  hidden_act: str = 'silu'
  bos_token_id: int | None = tokens_lib.ENDOFTEXT_ID
  eos_token_id: int | None = tokens_lib.IM_END_ID
  # Mixture of experts (HF `Qwen3VLMoeTextConfig`); num_experts == 0 means dense.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  norm_topk_prob: bool = True
  # Compact vocabulary (tiny experiments): the sorted unique Qwen ids the embedding and output projection have rows
  # for, in this order; None = every id of [0, vocab_size). Ids stay Qwen ids outside the model
  # (`model.Qwen3VLModel.ids_to_rows`); written to the HF dict as `text_config.osvl_vocab_ids`.
  vocab_ids: tuple[int, ...] | None = None

  def __post_init__(self):
    if self.vocab_ids is not None:
      ids = np.asarray(self.vocab_ids)
      if (not len(ids) or ids.dtype.kind not in 'iu' or np.any(np.diff(ids) <= 0) or ids[0] < 0
          or ids[-1] >= self.vocab_size):
        raise ValueError(f'vocab_ids must be sorted unique integer ids in [0, vocab_size={self.vocab_size}), got '
                         f'{len(ids)} values starting {list(self.vocab_ids[:8])}')
    if sum(self.mrope_section) != self.head_dim // 2:
      raise ValueError(f'mrope_section {self.mrope_section} must sum to head_dim/2 = {self.head_dim // 2}')
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError('num_attention_heads must be a multiple of num_key_value_heads')
    if self.hidden_act != 'silu':
      raise ValueError(f'only silu is supported, got {self.hidden_act}')
    if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
      raise ValueError('num_experts_per_tok must be in [1, num_experts]')

  @property
  def table_rows(self) -> int:
    """Rows of the embedding and of the output projection: len(vocab_ids), else vocab_size."""
    return self.vocab_size if self.vocab_ids is None else len(self.vocab_ids)

  def is_sparse_layer(self, layer: int) -> bool:
    """Whether decoder layer `layer` uses the MoE block (HF `Qwen3VLMoeTextDecoderLayer.__init__`)."""
    return (self.num_experts > 0 and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0)


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """Qwen3-VL vision tower (mirrors `transformers.Qwen3VLVisionConfig`)."""
  depth: int = 27
  hidden_size: int = 1152
  intermediate_size: int = 4304
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 16
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  out_hidden_size: int = 4096
  num_position_embeddings: int = 2304
  deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
  hidden_act: str = 'gelu_pytorch_tanh'
  rope_theta: float = 10000.0

  def __post_init__(self):
    side = int(self.num_position_embeddings ** 0.5)
    if side * side != self.num_position_embeddings:
      raise ValueError('num_position_embeddings must be a perfect square')
    if self.hidden_act != 'gelu_pytorch_tanh':
      raise ValueError(f'only gelu_pytorch_tanh is supported, got {self.hidden_act}')

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Length of one flattened patch in `pixel_values`: C * temporal_patch * patch * patch."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
  """Whole model: text decoder + vision tower + the special token ids the forward pass needs."""
  text: TextConfig = dataclasses.field(default_factory=TextConfig)
  vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
  image_token_id: int = tokens_lib.IMAGE_PAD_ID
  video_token_id: int = tokens_lib.VIDEO_PAD_ID
  vision_start_token_id: int = tokens_lib.VISION_START_ID
  vision_end_token_id: int = tokens_lib.VISION_END_ID
  tie_word_embeddings: bool = False

  @property
  def is_moe(self) -> bool:
    """True for the mixture-of-experts family (HF `Qwen3VLMoeForConditionalGeneration`)."""
    return self.text.num_experts > 0

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any]) -> Qwen3VLConfig:
    """Parses a HF Qwen3-VL or Qwen3-VL-MoE `config.json` dict (hub or transformers>=5 layout)."""
    t = dict(d.get('text_config') or {})
    if 'num_local_experts' in t and 'num_experts' not in t:     # transformers>=5 writes the attribute_map alias
      t['num_experts'] = t['num_local_experts']
    t['mlp_only_layers'] = tuple(t.get('mlp_only_layers') or ())
    rope = dict(t.get('rope_parameters') or t.get('rope_scaling') or {})
    theta = rope.get('rope_theta', t.get('rope_theta', 5_000_000.0))
    if rope.get('rope_type', rope.get('type', 'default')) != 'default':
      raise ValueError(f'unsupported text rope type {rope}')
    text_fields = {f.name for f in dataclasses.fields(TextConfig)} - {'vocab_ids'}
    text = TextConfig(**{
        **{k: v for k, v in t.items() if k in text_fields and v is not None},
        'vocab_ids': None if t.get('osvl_vocab_ids') is None else tuple(int(i) for i in t['osvl_vocab_ids']),
        'rope_theta': float(theta),
        'mrope_section': tuple(rope.get('mrope_section', (24, 20, 20))),
        'mrope_interleaved': bool(rope.get('mrope_interleaved', True)),
    })
    v = dict(d.get('vision_config') or {})
    vrope = dict(v.get('rope_parameters') or {})
    vision_fields = {f.name for f in dataclasses.fields(VisionConfig)}
    vision = VisionConfig(**{
        **{k: val for k, val in v.items() if k in vision_fields and val is not None},
        'deepstack_visual_indexes': tuple(v.get('deepstack_visual_indexes', (8, 16, 24))),
        'rope_theta': float(vrope.get('rope_theta', 10000.0)),
    })
    top = {k: d[k] for k in ('image_token_id', 'video_token_id', 'vision_start_token_id', 'vision_end_token_id',
                             'tie_word_embeddings') if k in d}
    return cls(text=text, vision=vision, **top)

  def to_hf_dict(self) -> dict[str, Any]:
    """A dict that `transformers.Qwen3VLConfig(**d)` accepts (transformers>=5 `rope_parameters` layout)."""
    t = self.text
    text = {
        'model_type': 'qwen3_vl_text',
        'vocab_size': t.vocab_size, 'hidden_size': t.hidden_size, 'intermediate_size': t.intermediate_size,
        'num_hidden_layers': t.num_hidden_layers, 'num_attention_heads': t.num_attention_heads,
        'num_key_value_heads': t.num_key_value_heads, 'head_dim': t.head_dim, 'hidden_act': t.hidden_act,
        'max_position_embeddings': t.max_position_embeddings, 'rms_norm_eps': t.rms_norm_eps,
        'attention_bias': t.attention_bias, 'attention_dropout': 0.0,
        'bos_token_id': t.bos_token_id, 'eos_token_id': t.eos_token_id,
        'rope_parameters': {'rope_type': 'default', 'rope_theta': t.rope_theta,
                            'mrope_section': list(t.mrope_section), 'mrope_interleaved': t.mrope_interleaved},
    }
    if t.vocab_ids is not None:   # not a transformers field: `weights.to_hf_state_dict` refuses such a model
      text['osvl_vocab_ids'] = list(t.vocab_ids)
    v = self.vision
    vision = {
        'model_type': 'qwen3_vl_vision',
        'depth': v.depth, 'hidden_size': v.hidden_size, 'intermediate_size': v.intermediate_size,
        'num_heads': v.num_heads, 'in_channels': v.in_channels, 'patch_size': v.patch_size,
        'temporal_patch_size': v.temporal_patch_size, 'spatial_merge_size': v.spatial_merge_size,
        'out_hidden_size': v.out_hidden_size, 'num_position_embeddings': v.num_position_embeddings,
        'deepstack_visual_indexes': list(v.deepstack_visual_indexes), 'hidden_act': v.hidden_act,
        'rope_parameters': {'rope_type': 'axial', 'rope_theta': v.rope_theta},
    }
    if self.is_moe:
      if not t.norm_topk_prob:
        raise ValueError('transformers Qwen3VLMoe always renormalises the top-k weights (norm_topk_prob=True)')
      text.update(model_type='qwen3_vl_moe_text', num_experts=t.num_experts,
                  num_experts_per_tok=t.num_experts_per_tok, moe_intermediate_size=t.moe_intermediate_size,
                  decoder_sparse_step=t.decoder_sparse_step, mlp_only_layers=list(t.mlp_only_layers))
      vision['model_type'] = 'qwen3_vl_moe_vision'
    arch, model_type = (('Qwen3VLMoeForConditionalGeneration', 'qwen3_vl_moe') if self.is_moe
                        else ('Qwen3VLForConditionalGeneration', 'qwen3_vl'))
    return {
        'architectures': [arch], 'model_type': model_type,
        'text_config': text, 'vision_config': vision,
        'image_token_id': self.image_token_id, 'video_token_id': self.video_token_id,
        'vision_start_token_id': self.vision_start_token_id, 'vision_end_token_id': self.vision_end_token_id,
        'tie_word_embeddings': self.tie_word_embeddings,
    }

  @classmethod
  def tiny(cls, **overrides) -> Qwen3VLConfig:
    """Random-init config for tests and the CPU demo: real vocabulary, 2 text layers of width 64, 2 vision blocks.

    Keyword overrides replace top-level fields (e.g. `tie_word_embeddings=False`).
    """
    text = TextConfig(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=5_000_000.0, mrope_section=(4, 2, 2),
        mrope_interleaved=True, max_position_embeddings=32768)
    vision = VisionConfig(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, temporal_patch_size=2,
        spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=(0,))
    return cls(**{'text': text, 'vision': vision, 'tie_word_embeddings': True, **overrides})

  @classmethod
  def tiny_moe(cls, **overrides) -> Qwen3VLConfig:
    """`tiny()` with a mixture-of-experts text decoder: 4 experts of width 32, top-2, both layers sparse."""
    base = cls.tiny()
    text = dataclasses.replace(base.text, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    return dataclasses.replace(base, **{'text': text, **overrides})


def check_ids(model_config: Qwen3VLConfig, ids, what: str) -> None:
  """Host check that every id of `ids` has a row in the model's vocabulary (where Qwen ids enter a compact model).

  Args:
    model_config: the model's `Qwen3VLConfig`.
    ids: int array-like of Qwen token ids, any shape.
    what: what the ids are, for the message (e.g. "trajectory 'q17'", 'input_ids[3]').
  Raises:
    ValueError: naming `what`, the first id outside [0, vocab_size) or (compact vocabulary) outside
      `vocab_ids`, its position in the flattened `ids` and its text when the Qwen tokenizer is at hand.
  """
  t = model_config.text
  ids = np.asarray(ids).reshape(-1)
  if t.vocab_ids is None:
    bad = (ids < 0) | (ids >= t.vocab_size)
    vocabulary = f'the vocabulary [0, {t.vocab_size})'
  else:
    bad = ~np.isin(ids, np.asarray(t.vocab_ids))
    vocabulary = f'the compact vocabulary of {len(t.vocab_ids)} ids (model.vocab)'
  if not bad.any():
    return
  k = int(np.argmax(bad))
  raise ValueError(f'{what}: token id {int(ids[k])}{_id_text(int(ids[k]))} at position {k} is outside {vocabulary}')


def read_unknown_as_endoftext(model_config: Qwen3VLConfig, ids) -> np.ndarray:
  """`ids` (int array-like, any shape) with every id outside a compact vocabulary (`TextConfig.vocab_ids`) replaced
  by `<|endoftext|>`, the vocabulary's unknown-token stand-in for context ids (a tool's text); unchanged (as an
  array) with the full vocabulary. The embedded sampler and the GRPO update read contexts through this."""
  ids = np.asarray(ids)
  vocab = model_config.text.vocab_ids
  if vocab is None:
    return ids
  return np.where(np.isin(ids, np.asarray(vocab)), ids, tokens_lib.ENDOFTEXT_ID).astype(ids.dtype)


def _id_text(token_id: int) -> str:
  """' (<text>)' of a Qwen id when the tokenizer is at hand (`tokens.load_tokenizer`, cached), else ''."""
  if not 0 <= token_id < tokens_lib.VOCAB_SIZE:
    return ''
  try:
    return f' ({tokens_lib.load_tokenizer().decode([token_id], skip_special_tokens=False)!r})'
  except (OSError, ValueError):   # no tokenizer files here
    return ''


def assembled_hf_dict(assembled: dict[str, Any], name: str) -> dict[str, Any]:
  """A HF-style config dict for `name` from `qwen/configs/qwen3_vl_family_hparams.assembled.json` (its `common`
  values plus the model's `text` / `vision` overrides), parseable by `Qwen3VLConfig.from_hf_dict`.

  A non-boolean `tie_word_embeddings` (e.g. "unknown (likely false)") is read as False.
  """
  common, entry = assembled['common'], assembled[name]
  text = {k: common[k] for k in ('vocab_size', 'head_dim', 'rms_norm_eps', 'rope_theta', 'rope_scaling',
                                 'max_position_embeddings', 'bos_token_id', 'eos_token_id')}
  text.update(entry['text'])
  vision = {**common['vision_common'], **entry['vision']}
  tie = entry.get('tie_word_embeddings')
  top = {k: common[k] for k in ('image_token_id', 'video_token_id', 'vision_start_token_id', 'vision_end_token_id')}
  return {'architectures': entry['architectures'], 'text_config': text, 'vision_config': vision,
          'tie_word_embeddings': tie if isinstance(tie, bool) else False, **top}

"""Qwen3-VL (dense and MoE) in Flax NNX with HF weight conversion; see model.py for usage."""

from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig, TextConfig, VisionConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel, cache_rows, set_cache_rows
from osvl_jax.models.qwen3_vl.rope import get_rope_index, text_position_ids

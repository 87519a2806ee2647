"""Shared fixtures of the agent-loop tests: the real tokenizer, a ToolEnv with image tools, a small builder, the tiny
random model (`Qwen3VLConfig.tiny()` at nnx.Rngs(0))."""

import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from tools import env as tools_env


@pytest.fixture(scope='module')
def tokenizer():
  return tj.load_tokenizer()


@pytest.fixture(scope='module')
def env():
  return tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})


@pytest.fixture(scope='module')
def make_builder(tokenizer, env):
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  return lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas())


@pytest.fixture(scope='module')
def model():
  return model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))

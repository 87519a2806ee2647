"""Qwen3-VL-MoE: top-k routing with HF's renormalisation, both expert-weight layouts, export back to transformers,
the router losses (HF's load-balancing loss, the ST-MoE z-loss) over a padded batch."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from osvl_jax.models.qwen3_vl import parity  # noqa: E402
from osvl_jax.models.qwen3_vl import moe  # noqa: E402
from osvl_jax.models.qwen3_vl import rope  # noqa: E402
from osvl_jax.models.qwen3_vl import weights  # noqa: E402
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # noqa: E402
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel  # noqa: E402

EXPERTS = 'model.language_model.layers.0.mlp.experts.'


@pytest.fixture(scope='module')
def moe_hf():
  return parity.hf_model(Qwen3VLConfig.tiny_moe(), seed=3)


def test_moe_config_round_trips_through_transformers():
  config = Qwen3VLConfig.tiny_moe()
  hf_dict = transformers.Qwen3VLMoeConfig(**config.to_hf_dict()).to_dict()   # writes num_local_experts
  assert Qwen3VLConfig.from_hf_dict(hf_dict) == config
  assert config.is_moe and not Qwen3VLConfig.tiny().is_moe
  sparse = dataclasses.replace(config.text, decoder_sparse_step=2, mlp_only_layers=(1,))
  assert [sparse.is_sparse_layer(i) for i in range(4)] == [False, False, False, True]


def test_sparse_moe_block_matches_transformers_with_sharp_routing(moe_hf):
  """Unit-scale router and expert weights (so routing is far from uniform and top-k choices matter)."""
  hf_block = moe_hf.model.language_model.layers[0].mlp
  torch.manual_seed(0)
  with torch.no_grad():
    for p in hf_block.parameters():
      p.normal_(0.0, 1.0)
  config = Qwen3VLConfig.tiny_moe()
  block = moe.SparseMoeBlock(config.text, rngs=nnx.Rngs(0), dtype=jnp.float32, param_dtype=jnp.float32)
  block.gate.kernel[...] = jnp.asarray(hf_block.gate.weight.detach().numpy().T)
  block.experts.gate_up_proj[...] = jnp.asarray(hf_block.experts.gate_up_proj.detach().numpy().transpose(0, 2, 1))
  block.experts.down_proj[...] = jnp.asarray(hf_block.experts.down_proj.detach().numpy().transpose(0, 2, 1))
  x = np.random.default_rng(0).standard_normal((2, 9, 64)).astype(np.float32)
  with torch.no_grad():
    ref = hf_block(torch.tensor(x)).numpy()
  got = np.asarray(block(jnp.asarray(x)))
  scale = np.abs(ref).max()
  assert scale > 10
  assert np.abs(got - ref).max() <= 1e-5 * scale          # float32 rounding relative to the output scale


def test_expert_weights_load_from_hub_and_transformers_layouts(moe_hf):
  config = Qwen3VLConfig.tiny_moe()
  state = {k: v.numpy() for k, v in moe_hf.state_dict().items() if k != 'lm_head.weight'}   # tied
  assert state[EXPERTS + 'gate_up_proj'].shape == (4, 64, 64)          # transformers>=5: [E, 2I, H]
  assert state[EXPERTS + 'down_proj'].shape == (4, 64, 32)             # [E, H, I]
  hub = {k: (v.transpose(0, 2, 1) if '.experts.' in k else v) for k, v in state.items()}
  with pytest.raises(ValueError, match='square expert'):                 # H == 2I: shapes cannot tell
    weights.load_hf_state_dict(config, state)
  from_tf = weights.load_hf_state_dict(config, state, expert_layout='transformers')
  from_hub = weights.load_hf_state_dict(config, hub, expert_layout='hub')
  a, b = weights.to_hf_state_dict(from_tf), weights.to_hf_state_dict(from_hub, expert_layout='transformers')
  for name, value in state.items():
    np.testing.assert_array_equal(a[name], value, err_msg=name)
    np.testing.assert_array_equal(b[name], value, err_msg=name)
  np.testing.assert_array_equal(weights.to_hf_state_dict(from_tf, expert_layout='hub')[EXPERTS + 'down_proj'],
                                hub[EXPERTS + 'down_proj'])
  # Non-square experts: the layout is read from the shapes alone.
  wide = dataclasses.replace(config, text=dataclasses.replace(config.text, moe_intermediate_size=16))
  model = Qwen3VLModel(wide, nnx.Rngs(0))
  tf_state = weights.to_hf_state_dict(model)
  hub_state = weights.to_hf_state_dict(model, expert_layout='hub')
  assert tf_state[EXPERTS + 'gate_up_proj'].shape == (4, 32, 64)
  assert hub_state[EXPERTS + 'gate_up_proj'].shape == (4, 64, 32)
  for state_dict in (tf_state, hub_state):
    again = weights.to_hf_state_dict(weights.load_hf_state_dict(wide, state_dict))
    for name, value in tf_state.items():
      np.testing.assert_array_equal(again[name], value, err_msg=name)


def test_moe_save_hf_folder_loads_in_transformers_with_same_logits(tmp_path):
  config = Qwen3VLConfig.tiny_moe()
  model = Qwen3VLModel(config, nnx.Rngs(5))
  weights.save_hf_folder(model, tmp_path)
  hf = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
  ids = np.random.RandomState(1).randint(0, 151000, size=(1, 7))
  assert np.abs(parity.hf_logits(hf, ids) - parity.flax_logits(model, ids)).max() <= parity.TOL
  again, _ = weights.load_hf_folder(tmp_path)
  np.testing.assert_array_equal(np.asarray(again.language_model.layers[1].mlp.experts.gate_up_proj[...]),
                                np.asarray(model.language_model.layers[1].mlp.experts.gate_up_proj[...]))


def test_router_losses_match_transformers_on_a_padded_batch(moe_hf):
  """HF's aux loss (`load_balancing_loss_func` with the attention mask, `output_router_logits=True`) within 1e-5 of
  `moe.load_balancing_loss` in its 'pooled' form, and the z-loss within 1e-5 (relative) of a float64 computation from HF's router
  logits, on a batch with right and left padding; the stacked (scan_layers) model gives the same. The routers are
  sharpened (x50) so that routing is far from uniform (aux loss > k = 2)."""
  with torch.no_grad():
    for name, p in moe_hf.named_parameters():
      if name.endswith('mlp.gate.weight'):
        p.copy_(50.0 * torch.nn.init.normal_(torch.empty_like(p), std=0.02, generator=torch.Generator().manual_seed(1)))
  config = Qwen3VLConfig.tiny_moe()
  state = {k: v.numpy() for k, v in moe_hf.state_dict().items()}
  rng = np.random.RandomState(0)
  ids, mask = parity._pad([list(rng.randint(0, 151000, n)) for n in (7, 4, 5)], ['right', 'left', 'right'])
  with torch.no_grad():
    kw = dict(input_ids=torch.tensor(ids), output_router_logits=True)
    out = moe_hf(**kw, attention_mask=torch.tensor(mask.astype(np.int64)))
    unmasked = float(moe_hf(**kw).aux_loss)
  ref_aux = float(out.aux_loss)
  logits = np.stack([g.numpy().astype(np.float64) for g in out.router_logits])              # [L, B*T, E]
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  on = mask.reshape(-1)
  ref_z = float(np.mean(lse[:, on] ** 2))
  pos, _ = rope.get_rope_index(ids, None, mask)
  forward = nnx.jit(lambda m, ids, pos, mask: m(ids, pos, mask, router_stats=True)[2])   # one compile, not op by op
  for scan_layers in (False, True):
    model = weights.load_hf_state_dict(config, state, expert_layout='transformers', scan_layers=scan_layers)
    stats = forward(model, ids, pos, mask)
    aux, z = float(moe.load_balancing_loss(stats, 'pooled')), float(moe.z_loss(stats, 'pooled'))
    assert stats['tokens'].shape == (2, 4) and stats['rows'].tolist() == [16, 16]   # per layer: 16 real tokens
    assert stats['tokens'].sum(-1).tolist() == [32, 32]                 # k = 2 assignments per counted token
    assert abs(aux - ref_aux) <= 1e-5, (scan_layers, aux, ref_aux)
    assert abs(z - ref_z) <= 1e-5 * ref_z, (scan_layers, z, ref_z)
  assert ref_aux > 2.05 and abs(unmasked - ref_aux) > 1e-2             # unbalanced; the padding counts in HF
  assert ref_z > 1.0


def test_router_runs_in_float32_under_bfloat16_compute():
  """bfloat16 compute over float32 parameters (the paper configs): the router's logits are the float32 product of
  the bf16 activations and the float32 kernel (the paper's "router in float32"), so the layer's router sums match
  a float64 computation to float32 rounding (1e-5; a bf16 router is off by ~5e-4 in the z sum)."""
  config = Qwen3VLConfig.tiny_moe()
  block = moe.SparseMoeBlock(config.text, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.float32)
  block.gate.kernel[...] = block.gate.kernel[...] * 50.0
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 64)), jnp.bfloat16)
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.float32)
  out, stats = block(x, jnp.asarray(mask))
  assert out.dtype == jnp.bfloat16
  logits = np.asarray(x, np.float64) @ np.asarray(block.gate.kernel[...], np.float64)           # [B, T, E]
  lse = np.log(np.exp(logits).sum(-1))
  probs = np.exp(logits - lse[..., None])
  np.testing.assert_allclose(float(stats['z']), (lse ** 2 * mask).sum(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(stats['probs']), (probs * mask[..., None]).sum((0, 1)), rtol=1e-5)
  assert float(stats['rows']) == 8 and float(stats['tokens'].sum()) == 16

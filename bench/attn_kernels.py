"""Scratch: kernel-level timing of attention variants (B=4, T=3072, Hkv=2, G=2, D=16)."""
import sys, time
import jax, jax.numpy as jnp, numpy as np
from osvl_jax.models.qwen3_vl import attention as A

B, T, KV, G, D = 4, 3072, 2, 2, 16
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((B, T, KV, G, D)), jnp.float32)
k = jnp.asarray(rng.standard_normal((B, T, KV, D)), jnp.float32)
v = jnp.asarray(rng.standard_normal((B, T, KV, D)), jnp.float32)
km = jnp.asarray(np.arange(T)[None] < np.array([T, T - 100, 2000, 1500])[:, None])

def dense(q, k, v, km):
  m = jnp.tril(jnp.ones((T, T), bool))[None] & km[:, None, :]
  return A.dense_attention(q, k, v, m)

variants = {'dense': dense}
for spec in sys.argv[1:]:
  blk, remat = spec.split(':') if ':' in spec else (spec, '0')
  variants[spec] = (lambda blk, remat: lambda q, k, v, km: A.causal_attention(q, k, v, km, int(blk), remat == '1'))(blk, remat)

def timeit(f, *a, n=3):
  jax.block_until_ready(f(*a))
  ts = []
  for _ in range(n):
    t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
  return min(ts)

for name, fn in variants.items():
  fwd = jax.jit(fn)
  bwd = jax.jit(jax.grad(lambda q, k, v, km: jnp.sum(fn(q, k, v, km) ** 2), argnums=(0, 1, 2)))
  print(f'{name:10s} fwd {timeit(fwd, q, k, v, km):.3f}s  fwd+bwd {timeit(bwd, q, k, v, km):.3f}s', flush=True)

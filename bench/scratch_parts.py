import time, jax, jax.numpy as jnp, numpy as np
B, T, KV, G, D = 4, 3072, 2, 2, 16
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((B, T, KV, G, D)), jnp.float32)
k = jnp.asarray(rng.standard_normal((B, T, KV, D)), jnp.float32)
s = jnp.asarray(rng.standard_normal((B, KV, G, T, T)), jnp.float32)
qt = jnp.asarray(rng.standard_normal((B, KV, G*T, D)), jnp.float32)
kt = jnp.asarray(rng.standard_normal((B, KV, T, D)), jnp.float32)
def timeit(f, *a, n=3):
  jax.block_until_ready(f(*a)); ts = []
  for _ in range(n):
    t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
  return min(ts)
print('qk einsum', timeit(jax.jit(lambda q, k: jnp.einsum('btkgd,bskd->bkgts', q, k)), q, k))
print('qk bmm   ', timeit(jax.jit(lambda q, k: jnp.einsum('bkmd,bksd->bkms', q, k)), qt, kt))
print('softmax  ', timeit(jax.jit(lambda s: jax.nn.softmax(s, -1)), s))
print('exp      ', timeit(jax.jit(lambda s: jnp.exp(s)), s))
print('max      ', timeit(jax.jit(lambda s: jnp.max(s, -1)), s))
print('pv einsum', timeit(jax.jit(lambda p, v: jnp.einsum('bkgts,bskd->btkgd', p, v)), s, k))

"""The embedded engine: the JAX sampler over the policy in this process (jax_sampler), its decode batch,
prefill inputs, prefix cache and sampling."""

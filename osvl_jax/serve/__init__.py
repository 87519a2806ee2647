"""The HTTP server: SGLang's native API (and OpenAI's chat) over the embedded JAX sampler, `python -m osvl_jax.serve`
(`__main__`: flags). launch (build_service, local_server), service (SamplerService, the worker), scheduler
(continuous batching), app (the FastAPI app), requests / request_fields / request_limits (parsing and checking a
request), auth (API key, weights roots), weight_receive (checks and loads a weight update)."""

"""Engines over HTTP: sglang_client (SGLang's native API, token-exact; its wire format in sglang_protocol) and
openai_engine (an OpenAI-compatible chat endpoint, text in and out)."""

"""Serving the trained draft: SGLang's and vLLM's commands and server checks."""

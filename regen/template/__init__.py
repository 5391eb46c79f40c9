"""Kimi-format rendering and tokenization, and the tiny test tokenizer.

- ``regen.template.render.Renderer``: renders a turn's prompt with the target tokenizer's own
  chat template and tokenizes prompt and response separately.
- ``regen.devkit.tokenizers.tiny.build_tiny_tokenizer``: the tiny Kimi-format tokenizer for tests
and the
  demo (committed under ``manifests/demo/tokenizer/``).
- ``regen.devkit.tokenizers.demo_native``: the demo's pre-tokenized rows
  (``manifests/demo/kimi_native.jsonl``).
"""

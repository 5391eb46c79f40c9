"""Tiny per-family tokenizers and the demo's native rows."""

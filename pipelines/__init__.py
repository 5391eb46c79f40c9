"""Thin `ray job submit` entrypoints: they parse arguments and call the regen library."""

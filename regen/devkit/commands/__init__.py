"""`regen demo` and `regen simulate` (entry points regen.commands)."""

"""A turn as the target renders and tokenizes it, for every family of regen.targets.

- :mod:`.render`: ``Renderer`` renders a turn's prompt with the target's own chat template (or
  the server's ``--chat-template``, or the family's encoder where its engines encode prompts
  in Python) and tokenizes prompt and response apart: the row's text, ids and loss mask.
- :mod:`.prepare`: the messages and tools as the engine that answered hands them to the
  template (one preparation per engine).
- :mod:`.extend`: a conversation's successive prompts, each encoded only where it differs.
- :mod:`.codec`: many texts encoded or decoded in one call (``TokenCodec``).
- :mod:`.tokenizer`: the one tokenizer loader (``load_tokenizer``, ``class_spec``).

What a family decides (end tokens, reasoning markers, tool-call syntax) is regen.targets'; the
tiny per-family tokenizers of the tests and the demo are regen.devkit.tokenizers'.
"""

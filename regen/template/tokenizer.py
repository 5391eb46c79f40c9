"""Loading a target's tokenizer directory, once resolved by ``AutoTokenizer``, then by its class.

Owns no files (the classes it remembers: :mod:`regen.template.tokenizer_classes`).
:func:`load_tokenizer` is regen's one way to load a tokenizer directory:
``AutoTokenizer.from_pretrained`` (remote code only when allowed). ``AutoTokenizer`` picks the
class from the directory's files and its model config: transformers then loads ``AutoConfig``,
and with it torch (1 to 2 CPU-s more per process, by the machine, and a peak RSS of 249 MB
instead of 63 MB for the demo's tokenizer, for a tokenizer that never touches a tensor).

:func:`class_spec` names the class ``AutoTokenizer`` picked, as a string that another process
can load again (``module:Class`` for a class of transformers, ``remote:file.Class`` for the
directory's own code). Given that spec, :func:`load_tokenizer` calls the class's
``from_pretrained`` with what ``AutoTokenizer`` passes it, skipping the resolution: the same
tokenizer, without torch. The engine resolves once per run directory (its configuration check,
recorded in checks.json with the key of the tokenizer's files and the transformers version)
and its actors load by the spec; a process given no spec loads by the one remembered for the
directory as it is now (:mod:`regen.template.tokenizer_classes`), once any process resolved
it. A spec that no longer loads falls back to ``AutoTokenizer``.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING

from regen.core.errors import TemplateError
from regen.template.tokenizer_classes import class_entry, remember, remembered

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

#: the prefix of a spec naming a class of the tokenizer directory's own code
REMOTE = "remote:"
#: the package of transformers' dynamic modules (a directory's own code, copied there)
DYNAMIC_PACKAGE = "transformers_modules."


def load_tokenizer(
    path: str | os.PathLike[str], trust_remote_code: bool = False, spec: str | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer directory at ``path``: by the class ``spec`` names (:func:`class_spec`)
    when given and loadable, else by the class remembered for the directory
    (:mod:`regen.template.tokenizer_classes`), else resolved by ``AutoTokenizer`` (and its
    class remembered). Raises TemplateError when it does not load."""
    entry = None if spec else class_entry(path, trust_remote_code)
    spec = spec or remembered(entry)
    if spec:
        try:
            return _load_by_class(str(path), spec, trust_remote_code)
        except (ImportError, AttributeError, OSError, ValueError) as e:  # resolved again below
            log.info("tokenizer class %s did not load (%s): resolving it again", spec, e)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        hint = "" if trust_remote_code else " (does it need target.trust_remote_code: true?)"
        raise TemplateError(f"cannot load tokenizer from {str(path)!r}: {e}{hint}") from e
    picked = class_spec(tok)
    if picked is not None:
        remember(entry if entry is not None else class_entry(path, trust_remote_code), picked)
    return tok


def class_spec(tokenizer: object) -> str | None:
    """The spec of ``tokenizer``'s class (loaded by ``AutoTokenizer``), or None when its class
    is neither transformers' nor the directory's own code."""
    cls = type(tokenizer)
    module = cls.__module__
    if module.startswith(DYNAMIC_PACKAGE):
        return f"{REMOTE}{module.rsplit('.', 1)[-1]}.{cls.__qualname__}"
    if module == "transformers" or module.startswith("transformers."):
        return f"{module}:{cls.__qualname__}"
    return None


def _load_by_class(path: str, spec: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """What ``AutoTokenizer.from_pretrained`` does once it has picked the class."""
    from transformers import PreTrainedTokenizerBase

    if spec.startswith(REMOTE):
        if not trust_remote_code:
            raise ValueError("the class is the directory's own code: remote code is not allowed")
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        cls = get_class_from_dynamic_module(spec.removeprefix(REMOTE), path)
        remote = True
    else:
        module, _, name = spec.partition(":")
        if not module.startswith("transformers") or not name:
            raise ValueError(f"not a transformers tokenizer class: {spec!r}")
        cls = getattr(importlib.import_module(module), name)
        remote = False
    if not (isinstance(cls, type) and issubclass(cls, PreTrainedTokenizerBase)):
        raise ValueError(f"not a tokenizer class: {spec!r}")
    if remote:
        return cls.from_pretrained(path, trust_remote_code=True, _from_auto=True)
    return cls.from_pretrained(path, _from_auto=True)

"""What reading a manifest's sources takes, typed: :class:`SourceSet`, cut once from the
manifest by :func:`source_set`. Owns no files.

The readers (:mod:`regen.sources.reader`, :mod:`regen.sources.adapters`,
:mod:`regen.sources.stream`), planning and the plan index (:mod:`regen.plan`,
:mod:`regen.store.planned`) take a :class:`SourceSet`, never the manifest: the sources in the
manifest's order with their local files resolved, the dedup settings, the folder the manifest's
relative paths resolve against, and the target tokenizer native rows are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from regen.manifest import Dedup, Manifest, Source
from regen.targets import Family
from regen.targets.decide import decide_family


@dataclass(frozen=True, slots=True)
class NativeTarget:
    """What native rows are checked against (:mod:`regen.sources.native`): the target's
    tokenizer folder, the family the manifest names (``target.family``), and whether the
    tokenizer's own code may run."""

    tokenizer: Path
    named: str | None = None
    trust_remote_code: bool = False

    def family(self) -> Family | None:
        """The target's family, decided as :meth:`regen.manifest.Manifest.family` decides it
        (:func:`regen.targets.decide.decide_family`; read only when native rows are checked)."""
        return decide_family(self.named, self.tokenizer)


@dataclass(frozen=True, slots=True)
class SourceSet:
    """A manifest's sources as they are read (see the module docstring)."""

    sources: tuple[Source, ...]  #: in the manifest's order
    paths: tuple[Path | None, ...]  #: each source's local file, resolved (None: a hub dataset)
    #: the folder the manifest's relative paths resolve against (plan.json's ``manifest_dir``)
    base_dir: Path
    dedup: Dedup  #: the duplicate drop's settings
    #: the native check's target (None: no source is native)
    native: NativeTarget | None = None

    def index(self, name: str) -> int:
        """The position of the source ``name`` (KeyError: none has it)."""
        for i, s in enumerate(self.sources):
            if s.name == name:
                return i
        raise KeyError(name)

    def source(self, name: str) -> Source:
        return self.sources[self.index(name)]

    def local_file(self, source: Source) -> Path | None:
        """``source``'s local file, resolved (None: a hub dataset)."""
        return self.paths[self.index(source.name)]

    def field(self, source: Source) -> str:
        """The dotted manifest field that says where ``source`` lives (for error messages)."""
        return f"sources.{self.index(source.name)}.{'path' if source.path is not None else 'hub'}"


def source_set(manifest: Manifest) -> SourceSet:
    """The :class:`SourceSet` of ``manifest``."""
    native = None
    if any(s.mode == "native" for s in manifest.sources):
        tok = manifest.target
        native = NativeTarget(manifest.resolve(tok.tokenizer), tok.family, tok.trust_remote_code)
    return SourceSet(
        sources=tuple(manifest.sources),
        paths=tuple(None if s.path is None else manifest.resolve(s.path) for s in manifest.sources),
        base_dir=manifest.resolve("."),
        dedup=manifest.dedup,
        native=native,
    )

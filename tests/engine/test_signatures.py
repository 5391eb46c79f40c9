"""The manifest enters no module below the driver: no function, method or constructor of the
actors, the pool, the workers, the router, the row builder, the chat client or the renderer takes
a :class:`regen.manifest.Manifest` (an annotation that is or holds one, or a parameter named
``manifest``). They take the typed records the driver cuts from it once
(:mod:`regen.engine.inputs`). Read from the live signatures (``inspect.signature`` and
``typing.get_type_hints``)."""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from collections.abc import Callable, Iterator

import pytest

from regen.manifest import Manifest

#: the modules below the driver that must never see the manifest
BELOW_THE_DRIVER = (
    "regen.engine.actor",
    "regen.engine.pool",
    "regen.engine.worker",
    "regen.engine.lanes",
    "regen.engine.pages",
    "regen.engine.router",
    "regen.engine.rows",
    "regen.engine.turns",
    "regen.engine.stall",
    "regen.engine.wire",
    "regen.client.chat",
    "regen.client.resolved",
    "regen.client.retry",
    "regen.client.transport",
    "regen.template.render",
)


def holds_manifest(annotation: object) -> bool:
    """Whether ``annotation`` is :class:`Manifest` or a type built of it (``Manifest | None``,
    ``list[Manifest]``, ...); a string annotation (unresolved) that names it counts too."""
    if annotation is Manifest:
        return True
    if isinstance(annotation, str):
        return "Manifest" in annotation.replace("ManifestError", "")
    if isinstance(annotation, typing.ForwardRef):
        return holds_manifest(annotation.__forward_arg__)
    return any(holds_manifest(a) for a in typing.get_args(annotation))


def callables(module: types.ModuleType) -> Iterator[tuple[str, Callable[..., object]]]:
    """Every function and class defined in ``module``, and every method (constructors,
    class and static methods, properties' getters) of those classes, by qualified name."""
    for name, obj in vars(module).items():
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if isinstance(member, classmethod | staticmethod):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    yield f"{name}.{attr}", member


def manifest_parameters(fn: Callable[..., object]) -> list[str]:
    """The parameters of ``fn`` that take a manifest (see the module docstring)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation only a type checker resolves: read it as written
        hints = dict(getattr(fn, "__annotations__", {}))
    found = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "manifest" or holds_manifest(hints.get(p.name, p.annotation)):
            found.append(p.name)
    return found


def offenders(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    return [
        f"{module_name}.{qual}({', '.join(params)})"
        for qual, fn in callables(module)
        if (params := manifest_parameters(fn))
    ]


@pytest.mark.parametrize("module_name", BELOW_THE_DRIVER)
def test_nothing_below_the_driver_takes_a_manifest(module_name: str) -> None:
    assert offenders(module_name) == []


def test_the_check_sees_a_manifest_taken_back() -> None:
    """The check fails on each way a manifest could come back: an annotation, one inside a
    union or a container, a string annotation, a parameter named ``manifest``, a method."""
    module = types.ModuleType("regen.engine.fake_worker")

    def annotated(config: object, m: Manifest) -> None: ...

    def optional(m: Manifest | None = None) -> None: ...

    def listed(ms: list[Manifest]) -> None: ...

    def written(m: Manifest) -> None: ...

    written.__annotations__["m"] = "Manifest"

    def named(manifest: object) -> None: ...

    class Worker:
        def __init__(self, manifest: Manifest) -> None: ...

        @classmethod
        def from_manifest(cls, m: Manifest) -> None: ...

    def clean(config: object, endpoints: list[str]) -> None: ...

    for fn in (annotated, optional, listed, written, named, clean, Worker):
        fn.__module__ = module.__name__
        setattr(module, fn.__name__, fn)
    found = {qual: manifest_parameters(fn) for qual, fn in callables(module)}
    assert found == {
        "annotated": ["m"],
        "optional": ["m"],
        "listed": ["ms"],
        "written": ["m"],
        "named": ["manifest"],
        "clean": [],
        "Worker.__init__": ["manifest"],
        "Worker.from_manifest": ["m"],
    }

"""A static trace of where the manifest goes from ``run_job`` (read from the source, ast only).

Starting at ``regen.engine.driver.run_job``'s parameter ``manifest``, it follows every call
that passes the manifest on as an argument into the function that receives it, resolving the
called name through the module's own definitions and imports (re-exports followed), and binds
the argument to the parameter it lands in; then it goes on from that parameter. Within a
function the manifest is held by:

- the parameter, and local names assigned from a held value (``m = manifest``,
  ``rd, m = self.rd, self.m``) or from a call that returns a ``Manifest`` (its annotation) and
  is given a held value (``manifest = session_manifest(manifest, opts).with_family()``);
- ``self.NAME`` once a method stored a held value there (``self.m = manifest``): then every
  method of that class that reads ``self.NAME`` is traced too (the object holds it).

Calls through an executor (``ex.submit(f, m)``, ``asyncio.to_thread(f, m)``), a thread
(``Thread(target=f, args=(m,))``) and constructors (``__init__``, a dataclass's fields) are
followed. Only regen's production modules are traced (not the devkit).

It counts the modules the manifest passes through, the calls that go back up to a module of
a caller on the current chain ("back-ups"), and the calls into a module already visited
("revisits"; a back-up is one too). Run it on any checkout: ``python
tests/engine/_manifest_trace.py [ROOT]`` prints the counts and the modules.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: calls whose first positional argument is the function called with the rest
EXECUTOR_CALLS = {"submit": 1, "to_thread": 1, "run_in_executor": 2}


@dataclass(slots=True)
class Module:
    name: str
    tree: ast.Module
    #: local name -> (module, symbol or None for a module)
    imports: dict[str, tuple[str, str | None]]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]  #: qualname -> def
    classes: dict[str, ast.ClassDef]


@dataclass(slots=True)
class Trace:
    modules: list[str] = field(default_factory=list)  #: in the order first visited
    backups: int = 0
    revisits: int = 0
    #: (caller module.qualname, callee module.qualname, parameter)
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    #: "module.qualname -> module.qualname" of every back-up
    backup_edges: list[str] = field(default_factory=list)


class Tracer:
    def __init__(self, root: Path, package: str = "regen", skip: str = "regen.devkit") -> None:
        self.root = root
        self.package = package
        self.skip = skip
        self._mods: dict[str, Module | None] = {}
        self.trace = Trace()
        self._done: set[tuple[str, str, str]] = set()
        #: (module, class) -> attributes of ``self`` that hold the manifest
        self._attrs: dict[tuple[str, str], set[str]] = {}
        #: (module, class) -> attributes of ``self`` holding a tuple with the manifest at an index
        self._packs: dict[tuple[str, str], dict[str, int]] = {}

    # -- reading modules -----------------------------------------------------------------
    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.is_file():
                return p
        return None

    def module(self, name: str) -> Module | None:
        if name in self._mods:
            return self._mods[name]
        path = self.path(name)
        mod = None
        if path is not None:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            mod = Module(name, tree, {}, {}, {})
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        if a.asname:
                            mod.imports[a.asname] = (a.name, None)
                        else:
                            top = a.name.split(".")[0]
                            mod.imports[top] = (top, None)
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        up = package.split(".")[: len(package.split(".")) - node.level + 1]
                        base = ".".join([*up, base] if base else up)
                    for a in node.names:
                        sub = f"{base}.{a.name}"
                        target = (sub, None) if self.path(sub) else (base, a.name)
                        mod.imports[a.asname or a.name] = target
            for node in tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    mod.functions[node.name] = node
                elif isinstance(node, ast.ClassDef):
                    mod.classes[node.name] = node
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            mod.functions[f"{node.name}.{item.name}"] = item
        self._mods[name] = mod
        return mod

    def symbol(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """Where ``name`` of ``module`` is defined: (module, top-level name); re-exports
        followed."""
        mod = self.module(module)
        if mod is None or depth > 10:
            return None
        if name in mod.functions or name in mod.classes:
            return module, name
        if name in mod.imports:
            target, sym = mod.imports[name]
            if sym is None:
                return None  # a module, not a symbol
            return self.symbol(target, sym, depth + 1)
        return None

    def ours(self, module: str) -> bool:
        return (module == self.package or module.startswith(self.package + ".")) and not (
            module == self.skip or module.startswith(self.skip + ".")
        )

    # -- resolving calls ----------------------------------------------------------------
    def callee(self, mod: Module, cls: str | None, func: ast.expr) -> tuple[str, str, bool] | None:
        """(module, qualname, whether the first parameter is bound: self/cls) of a call."""
        if isinstance(func, ast.Name):
            found = self.symbol(mod.name, func.id)
            return None if found is None else self._entry(*found)
        if not isinstance(func, ast.Attribute):
            return None
        base, attr = func.value, func.attr
        if isinstance(base, ast.Name) and base.id in ("self", "cls") and cls is not None:
            return self._method(mod.name, cls, attr)
        if isinstance(base, ast.Name):
            if base.id in mod.imports and mod.imports[base.id][1] is None:
                target = mod.imports[base.id][0]
                found = self.symbol(target, attr)
                return None if found is None else self._entry(*found)
            found = self.symbol(mod.name, base.id)
            if found is not None:
                m = self.module(found[0])
                if m is not None and found[1] in m.classes:
                    return self._method(found[0], found[1], attr)
        return None

    def _entry(self, module: str, name: str) -> tuple[str, str, bool] | None:
        mod = self.module(module)
        assert mod is not None
        if name in mod.classes:
            if f"{name}.__init__" in mod.functions:
                return module, f"{name}.__init__", True
            return module, name, False  # a dataclass: its fields
        return module, name, False

    def _method(self, module: str, cls: str, name: str) -> tuple[str, str, bool] | None:
        mod = self.module(module)
        if mod is None or f"{cls}.{name}" not in mod.functions:
            return None
        fn = mod.functions[f"{cls}.{name}"]
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
        return module, f"{cls}.{name}", not static

    def params(self, module: str, qualname: str, bound: bool) -> list[str]:
        mod = self.module(module)
        assert mod is not None
        if qualname in mod.classes:  # dataclass fields, in order
            return [
                n.target.id
                for n in mod.classes[qualname].body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            ]
        args = mod.functions[qualname].args
        names = [a.arg for a in (*args.posonlyargs, *args.args)]
        return names[1:] if bound else names

    def kwonly(self, module: str, qualname: str) -> list[str]:
        mod = self.module(module)
        assert mod is not None
        if qualname in mod.classes:
            return self.params(module, qualname, False)
        return [a.arg for a in mod.functions[qualname].args.kwonlyargs]

    # -- following the manifest ---------------------------------------------------------
    def run(self, module: str, qualname: str, param: str) -> Trace:
        self._visit(module, qualname, param, [])
        return self.trace

    def _visit(self, module: str, qualname: str, param: str, stack: list[str]) -> None:
        key = (module, qualname, param)
        if key in self._done:
            return
        self._done.add(key)
        if module not in self.trace.modules:
            self.trace.modules.append(module)
        mod = self.module(module)
        assert mod is not None
        cls = qualname.split(".")[0] if "." in qualname else None
        if qualname in mod.classes:  # a dataclass field: the object holds it
            self._hold(mod, qualname, param, [*stack, module])
            return
        fn = mod.functions[qualname]
        self._body(mod, cls, qualname, fn, {param}, [*stack, module])

    def _hold(self, mod: Module, cls: str, attr: str, stack: list[str], pack: int = -1) -> None:
        """``self.attr`` holds the manifest (``pack`` >= 0: a tuple holding it at that index):
        every method of the class that reads it is traced."""
        if pack >= 0:
            packs = self._packs.setdefault((mod.name, cls), {})
            if attr in packs:
                return
            packs[attr] = pack
        else:
            attrs = self._attrs.setdefault((mod.name, cls), set())
            if attr in attrs:
                return
            attrs.add(attr)
        for qual, fn in mod.functions.items():
            if not qual.startswith(cls + "."):
                continue
            reads = any(
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
                and n.attr == attr
                and isinstance(n.ctx, ast.Load)
                for n in ast.walk(fn)
            )
            key = (mod.name, qual, f"self.{attr}")
            if reads and key not in self._done:
                self._done.add(key)
                self._body(mod, cls, qual, fn, set(), stack)

    def _held(self, mod: Module, cls: str | None, e: ast.expr, held: set[str]) -> bool:
        if isinstance(e, ast.Name):
            return e.id in held
        if (
            isinstance(e, ast.Attribute)
            and isinstance(e.value, ast.Name)
            and e.value.id == "self"
            and cls is not None
        ):
            return e.attr in self._attrs.get((mod.name, cls), set())
        if isinstance(e, ast.Call):
            return self._returns_manifest(mod, cls, e, held)
        return False

    def _returns_manifest(
        self, mod: Module, cls: str | None, call: ast.Call, held: set[str]
    ) -> bool:
        f = call.func
        if isinstance(f, ast.Attribute) and self._held(mod, cls, f.value, held):
            return f.attr in ("with_family", "model_copy")  # Manifest -> Manifest
        given = [*call.args, *(k.value for k in call.keywords)]
        if not any(self._held(mod, cls, a, held) for a in given):
            return False
        target = self.callee(mod, cls, f)
        if target is None:
            return False
        m = self.module(target[0])
        fn = m.functions.get(target[1]) if m is not None else None
        ret = fn.returns if fn is not None else None
        return ret is not None and "Manifest" in ast.unparse(ret)

    def _pack(self, mod: Module, cls: str | None, e: ast.expr, held: set[str]) -> int:
        """The index of the manifest in a tuple expression (-1: none)."""
        if isinstance(e, ast.Tuple):
            for i, x in enumerate(e.elts):
                if self._held(mod, cls, x, held):
                    return i
        return -1

    def _body(
        self,
        mod: Module,
        cls: str | None,
        qualname: str,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        held: set[str],
        stack: list[str],
    ) -> None:
        packs: dict[str, int] = {}
        changed = True
        while changed:  # names that come to hold it (flow-insensitive)
            changed = False
            for n in ast.walk(fn):
                if not isinstance(n, ast.Assign):
                    continue
                pairs: list[tuple[ast.expr, ast.expr]] = []
                for t in n.targets:
                    if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple):
                        pairs += list(zip(t.elts, n.value.elts, strict=False))
                    else:
                        pairs.append((t, n.value))
                for t, v in pairs:
                    pack = self._pack(mod, cls, v, held)
                    if not self._held(mod, cls, v, held) and pack < 0:
                        continue
                    own = (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                        and cls is not None
                    )
                    if isinstance(t, ast.Name) and pack >= 0 and t.id not in packs:
                        packs[t.id] = pack
                        changed = True
                    elif isinstance(t, ast.Name) and pack < 0 and t.id not in held:
                        held.add(t.id)
                        changed = True
                    elif own and pack >= 0:
                        assert isinstance(t, ast.Attribute) and cls is not None
                        if t.attr not in self._packs.get((mod.name, cls), {}):
                            self._hold(mod, cls, t.attr, stack, pack)
                            changed = True
                    elif own:
                        assert isinstance(t, ast.Attribute) and cls is not None
                        if t.attr not in self._attrs.get((mod.name, cls), set()):
                            self._hold(mod, cls, t.attr, stack)
                            changed = True
        if cls is not None:
            packs.update({f"self.{k}": v for k, v in self._packs.get((mod.name, cls), {}).items()})
        for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            self._call(mod, cls, qualname, call, held, packs, stack)

    def _positions(
        self,
        mod: Module,
        cls: str | None,
        args: list[ast.expr],
        held: set[str],
        packs: dict[str, int],
    ) -> list[int]:
        """The positions the manifest takes among ``args`` (a ``*pack`` expanded)."""
        out = []
        for offset, a in enumerate(args):
            if isinstance(a, ast.Starred):
                name = ast.unparse(a.value)
                if name in packs:
                    out.append(offset + packs[name])
                return out  # what follows a star has no known position
            if self._held(mod, cls, a, held):
                out.append(offset)
        return out

    def _ray_actor(self, mod: Module) -> tuple[str, str, bool] | None:
        """The actor class a module's ``.remote(...)`` calls construct: the ``X`` of
        ``return ray.remote(...)(X)`` in a function it imports."""
        for target, sym in mod.imports.values():
            found = self.symbol(target, sym) if sym is not None else None
            m = self.module(found[0]) if found is not None else None
            fn = m.functions.get(found[1]) if m is not None and found is not None else None
            for n in ast.walk(fn) if fn is not None else ():
                if (
                    isinstance(n, ast.Return)
                    and isinstance(n.value, ast.Call)
                    and isinstance(n.value.func, ast.Call)
                    and "remote" in ast.unparse(n.value.func.func)
                    and n.value.args
                    and isinstance(n.value.args[0], ast.Name)
                ):
                    assert m is not None
                    cls = self.symbol(m.name, n.value.args[0].id)
                    return None if cls is None else self._entry(*cls)
        return None

    def _call(
        self,
        mod: Module,
        cls: str | None,
        qualname: str,
        call: ast.Call,
        held: set[str],
        packs: dict[str, int],
        stack: list[str],
    ) -> None:
        func, args, keywords = call.func, list(call.args), list(call.keywords)
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in EXECUTOR_CALLS and len(args) > EXECUTOR_CALLS[name]:
            skip = EXECUTOR_CALLS[name]
            func, args, keywords = args[skip - 1], args[skip:], []
        elif name == "Thread":
            kw = {k.arg: k.value for k in keywords}
            targs = kw.get("args")
            if "target" in kw and isinstance(targs, ast.Tuple):
                func, args, keywords = kw["target"], list(targs.elts), []
        hits = self._positions(mod, cls, args, held, packs)
        kw_hits = [k.arg for k in keywords if k.arg and self._held(mod, cls, k.value, held)]
        if not hits and not kw_hits:
            return
        target = self._ray_actor(mod) if name == "remote" else self.callee(mod, cls, func)
        if target is None or not self.ours(target[0]):
            return
        t_mod, t_qual, bound = target
        params = self.params(t_mod, t_qual, bound)
        bind = [params[i] for i in hits if i < len(params)]
        bind += [k for k in kw_hits if k in params or k in self.kwonly(t_mod, t_qual)]
        for p in bind:
            self.trace.edges.append((f"{mod.name}.{qualname}", f"{t_mod}.{t_qual}", p))
            if t_mod != mod.name:
                if t_mod in self.trace.modules:
                    self.trace.revisits += 1
                if t_mod in stack:
                    self.trace.backups += 1
                    self.trace.backup_edges.append(f"{mod.name}.{qualname} -> {t_mod}.{t_qual}")
            self._visit(t_mod, t_qual, p, stack)


def trace_run_job(root: Path) -> Trace:
    """The trace of ``manifest`` from ``regen.engine.driver.run_job`` in the checkout ``root``."""
    return Tracer(root).run("regen.engine.driver", "run_job", "manifest")


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    t = trace_run_job(root)
    print(f"{root}: {len(t.modules)} modules, {t.backups} back-ups, {t.revisits} revisits")
    for m in t.modules:
        print("  ", m)
    for b in t.backup_edges:
        print("  back-up:", b)

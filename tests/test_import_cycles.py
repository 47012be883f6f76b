"""No import cycle among clairvoyant's modules, counting imports inside functions and under
TYPE_CHECKING, and the package ``__init__`` that importing a submodule runs (issue 31). The check
reads the sources (nothing is imported); its control is a small package with a cycle made through
an import inside a function."""

from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def modules(root: str, top: str) -> dict[str, str]:
    """Dotted module name -> file, for the package ``top`` under ``root``."""
    out = {}
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(d, f), root)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(d, f)
    return out


def graph(mods: dict[str, str]) -> dict[str, set[str]]:
    """Each module's imports of the others (anywhere in its file), with the packages they run."""
    g: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                parts = t.split(".")
                for i in range(1, len(parts) + 1):   # importing a.b.c runs a, a.b and a.b.c
                    name = ".".join(parts[:i])
                    if name in mods and name != m and not m.startswith(name + "."):
                        g[m].add(name)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in g:
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycle_among_clairvoyants_modules():
    found = cycles(graph(modules(ROOT, "clairvoyant")))
    assert not found, f"import cycles: {found}"


def test_the_check_finds_a_cycle_made_inside_a_function(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")   # imports into the cycle, not part of it
    assert cycles(graph(modules(str(tmp_path), "p"))) == [["p.a", "p.sub.b"]]

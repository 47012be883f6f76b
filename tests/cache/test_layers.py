"""The package's layers, checked on the source text: policy (plan/, tune/'s pure modules) imports
no mechanism, and sources know nothing of the cache."""

from __future__ import annotations

import ast
import os

import clairvoyant

PKG = os.path.dirname(clairvoyant.__file__)

# package -> subpackages of clairvoyant it must not import
FORBIDDEN = {
    "plan": {"cache", "load", "stage", "source", "cluster", "cli", "testing"},
    "source": {"cache", "load", "stage", "plan", "cluster", "cli"},
}


def imported_subpackages(text: str) -> set[str]:
    """The clairvoyant subpackages a module (inside a subpackage) imports, relative or absolute."""
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 2 and node.module:             # from ..cache.x import y
                out.add(node.module.split(".")[0])
            elif node.level == 2:                            # from .. import cache
                out.update(a.name for a in node.names)
            elif node.level == 0 and (node.module or "").startswith("clairvoyant."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("clairvoyant."))
    return out


def violations(package: str) -> list[str]:
    bad = []
    root = os.path.join(PKG, package)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name)) as f:
                hits = imported_subpackages(f.read()) & FORBIDDEN[package]
            bad += [f"{package}/{name} imports {h}/" for h in sorted(hits)]
    return bad


def test_policy_and_sources_import_no_mechanism():
    assert violations("plan") == []
    assert violations("source") == []


def test_the_check_sees_a_forbidden_import():
    """Negative control: the checker finds each spelling of an import of cache/."""
    for text in ("from ..cache.publish import c_read_meta", "from .. import cache",
                 "import clairvoyant.cache.local", "from clairvoyant.cache import tiers"):
        assert "cache" in imported_subpackages(text), text
    assert imported_subpackages("from .order import epoch_order\nimport numpy") == set()

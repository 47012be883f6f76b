"""The repository holds source, not build products: no wheel, archive, shared object or executable
binary is tracked (a 5.4 MB third-party wheel once was). The check reads `git ls-files` and each file's
first bytes; its negative controls feed it such files."""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFUSED_SUFFIXES = (".whl", ".egg", ".tar.gz", ".tgz", ".zip", ".so", ".a", ".o", ".pyc", ".dll", ".dylib", ".exe")
MAGIC = {b"\x7fELF": "an ELF binary", b"PK\x03\x04": "a zip archive (a wheel?)", b"\x1f\x8b": "a gzip archive"}
MAX_BYTES = 1 << 20   # the largest tracked file today is a 0.2 MB figure


def refused(paths: list[str], root: str) -> list[str]:
    """Each tracked path that is a build product or a third-party binary, with why."""
    out = []
    for rel in paths:
        path = os.path.join(root, rel)
        if rel.lower().endswith(REFUSED_SUFFIXES):
            out.append(f"{rel}: a build product or package by its name")
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(4)
            size = os.path.getsize(path)
        except OSError:
            continue   # deleted in the work tree, not yet in the index
        kind = next((what for magic, what in MAGIC.items() if head.startswith(magic)), None)
        if kind:
            out.append(f"{rel}: {kind}")
        elif size > MAX_BYTES:
            out.append(f"{rel}: {size} bytes (over {MAX_BYTES})")
    return out


def tracked() -> list[str]:
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout: nothing is tracked")
    return [p for p in r.stdout.decode().split("\0") if p]


def test_no_binary_or_package_is_tracked():
    bad = refused(tracked(), ROOT)
    assert not bad, "remove these from git (build them, or install them from PyPI): " + "; ".join(bad)


def test_the_check_refuses_a_wheel_a_binary_and_a_large_file(tmp_path):
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04rest")
    (tmp_path / "daemon").write_bytes(b"\x7fELF" + b"\0" * 60)
    (tmp_path / "blob.bin").write_bytes(b"\0" * (MAX_BYTES + 1))
    (tmp_path / "ok.py").write_text("print('fine')\n")
    bad = refused(["x-1.0-py3-none-any.whl", "daemon", "blob.bin", "ok.py"], str(tmp_path))
    assert [b.split(":")[0] for b in bad] == ["x-1.0-py3-none-any.whl", "daemon", "blob.bin"]

"""The local tier's format is written down once for C (cache/tier_format.h, included by the
stager and the mount's daemon) and once for Python (cache/entry.py, cache/extents.py): these
tests read the header and check that the two agree, with a tampered header as the negative
control."""

from __future__ import annotations

import os
import re

from clairvoyant.cache import entry, extents
from clairvoyant.cache.local import LocalStore

HEADER = os.path.join(os.path.dirname(entry.__file__), "tier_format.h")


def mismatches(text: str) -> list[str]:
    """Where the header's format differs from Python's (empty: they agree)."""
    defines = dict(re.findall(r"#define\s+(\w+)\s+(\S+)", text))
    out = []
    want = {"ENTRY_MAGIC": f'"{entry.MAGIC.decode()}"', "TRAILER": str(entry.TRAILER.size),
            "INDEX_MAGIC": f'"{extents._MAGIC.decode()}"', "INDEX_HEADER": str(extents._HEADER_BYTES)}
    for name, value in want.items():
        if defines.get(name) != value:
            out.append(f"{name}: header {defines.get(name)}, Python {value}")
    sizes = {"uint64_t": "Q", "int64_t": "q", "uint32_t": "I", "char magic[8]": "8s"}

    def layout(struct_name: str) -> str:
        body = re.search(r"struct %s \{(.*?)\};" % struct_name, text, re.S)
        if body is None:
            return ""
        codes = []
        for decl in body.group(1).split(";"):
            decl = decl.strip()
            if not decl:
                continue
            if decl.startswith("char magic[8]"):
                codes.append("8s")
                continue
            ctype, names = decl.split(None, 1)
            codes += [sizes[ctype]] * len(names.split(","))
        return "<" + "".join(codes)

    if layout("entry_trailer") != entry.TRAILER.format:
        out.append(f"trailer: header {layout('entry_trailer')}, Python {entry.TRAILER.format}")
    if layout("slot") != extents._SLOT.format:
        out.append(f"slot: header {layout('slot')}, Python {extents._SLOT.format}")
    if "(off_t)(digest >> 32)" not in text:
        out.append("the key's lock is not digest >> 32")
    return out


def test_the_header_and_python_describe_the_same_format():
    with open(HEADER) as f:
        text = f.read()
    assert mismatches(text) == []
    # negative controls: each kind of drift is caught
    assert mismatches(text.replace("#define TRAILER 32", "#define TRAILER 40"))
    assert mismatches(text.replace("uint32_t seq, extent;", "uint64_t seq, extent;"))
    assert mismatches(text.replace("int64_t mtime_ns; uint64_t length;", "uint64_t length; int64_t mtime_ns;"))
    assert mismatches(text.replace('"CVENTRY1"', '"CVENTRY2"'))
    assert mismatches(text.replace("digest >> 32", "digest >> 31"))


def test_both_c_files_take_the_format_from_the_header():
    root = os.path.dirname(os.path.dirname(entry.__file__))
    for path, include in (("cache/_stager.c", '"tier_format.h"'), ("mount/mountfs.c", '"cache/tier_format.h"')):
        with open(os.path.join(root, path)) as f:
            text = f.read()
        assert f"#include {include}" in text, path
        for name in ("ENTRY_MAGIC", "TRAILER", "INDEX_MAGIC", "INDEX_HEADER"):
            assert not re.search(rf"#define\s+{name}\b", text), f"{path} defines {name} again"
        assert "struct slot {" not in text and '"CVENTRY1"' not in text, path


def test_the_lock_offset_is_the_digest_s_top_half(tmp_path):
    store = LocalStore.__new__(LocalStore)   # lock_offset reads nothing of the store
    for key in ("a", "class0/img001.jpg", "é/ü.png"):
        assert store.lock_offset(key) == extents.key_digest(key) >> 32
    assert store.lock_offset("a") != store.lock_offset("b")   # control: keys differ

"""The mount daemon's counters are written down once for C (mount/mount_stats.h, included by
mountfs.c) and once for Python (mount/fs.py's _FIELDS and _LAYOUT), as the tier's format is
(tests/cache/test_tier_format.py): these tests read the header and check that the two agree, with
tampered headers as negative controls (issue 31)."""

from __future__ import annotations

import os
import re

from clairvoyant.mount import fs

HEADER = os.path.join(os.path.dirname(fs.__file__), "mount_stats.h")
CODES = {"uint64_t": "Q", "int64_t": "q", "uint32_t": "I"}


def fields(text: str) -> list[tuple[str, str]]:
    """(name, struct code) of each field of struct mountfs_stats, in order."""
    body = re.search(r"struct mountfs_stats \{(.*?)\};", text, re.S)
    if body is None:
        return []
    out = []
    for decl in re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        if decl == "char magic[8]":
            out.append(("magic", "8s"))
            continue
        ctype, names = decl.split(None, 1)
        out += [(n.strip(), CODES[ctype]) for n in names.split(",")]
    return out


def mismatches(text: str) -> list[str]:
    """Where the header and Python differ (empty: they agree)."""
    out = []
    got = fields(text)
    if [n for n, _ in got] != list(fs._FIELDS):
        out.append(f"fields: header {[n for n, _ in got]}, Python {list(fs._FIELDS)}")
    if "<" + "".join(c for _, c in got) != fs._LAYOUT.format:
        out.append(f"layout: header {''.join(c for _, c in got)}, Python {fs._LAYOUT.format}")
    defines = dict(re.findall(r"#define\s+(\w+)\s+(\S+)", text))
    if defines.get("STATS_MAGIC") != '"' + fs._MAGIC.rstrip(b"\0").decode() + '"':
        out.append(f"magic: header {defines.get('STATS_MAGIC')}, Python {fs._MAGIC!r}")
    if defines.get("STATS_VERSION") != str(fs._VERSION):
        out.append(f"version: header {defines.get('STATS_VERSION')}, Python {fs._VERSION}")
    return out


def test_the_header_and_python_describe_the_same_counters():
    with open(HEADER) as f:
        text = f.read()
    assert mismatches(text) == []
    # negative controls: each kind of drift is caught
    assert mismatches(text.replace("uint64_t asks, ask_timeouts;", "uint64_t ask_timeouts, asks;"))
    assert mismatches(text.replace("uint64_t opens_peer, bytes_peer;", "uint64_t opens_peer, bytes_peer, more;"))
    assert mismatches(text.replace("uint32_t size;", "uint64_t size;"))
    assert mismatches(text.replace("#define STATS_VERSION 7", "#define STATS_VERSION 8"))


def test_the_daemon_takes_its_counters_from_the_header():
    with open(os.path.join(os.path.dirname(fs.__file__), "mountfs.c")) as f:
        text = f.read()
    assert '#include "mount_stats.h"' in text
    assert "struct mountfs_stats {" not in text and not re.search(r"#define\s+STATS_(MAGIC|VERSION)\b", text)

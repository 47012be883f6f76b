"""The index of a source: every sample's key, size and label, listed once and persisted.

A later run over the same source loads the persisted manifest instead of walking the (slow,
shared) file system again. ``record.py``: the manifest in memory (keys, sizes, labels, the
fingerprint and digest index); ``fileformat.py``: its file (version 2, binary and mapped;
version 1, JSON), written atomically and never unpickled; ``obtain.py``: where the file lives,
and a manifest that is current for a source (loaded, checked, or listed anew).
"""

from .fileformat import ALIGN, MAGIC, VERSION, load, save
from .obtain import build, current, default_manifest_path, existing, legacy_manifest_path, obtain
from .record import FORMAT, Keys, Manifest

__all__ = ["ALIGN", "FORMAT", "MAGIC", "VERSION", "Keys", "Manifest", "build", "current",
           "default_manifest_path", "existing", "legacy_manifest_path", "load", "obtain", "save"]

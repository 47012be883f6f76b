"""Default per-user locations: the manifest cache and the node-local staging directory."""

from __future__ import annotations

import getpass
import os
import tempfile


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return str(os.getuid())


def cache_home() -> str:
    """``$CLAIRVOYANT_CACHE``, else ``$XDG_CACHE_HOME/clairvoyant``, else ``~/.cache/clairvoyant``."""
    if os.environ.get("CLAIRVOYANT_CACHE"):
        return os.environ["CLAIRVOYANT_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "clairvoyant")


def default_local_dir() -> str:
    """A per-user directory under ``$TMPDIR`` (or /tmp); created with mode 0700 on first use."""
    return os.path.join(tempfile.gettempdir(), f"clairvoyant-{_user()}")


def default_ram_dir() -> str:
    """The RAM tier: ``$CLAIRVOYANT_RAM_DIR``, else a per-user directory in /dev/shm (shared memory)."""
    if os.environ.get("CLAIRVOYANT_RAM_DIR"):
        return os.environ["CLAIRVOYANT_RAM_DIR"]
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"clairvoyant-{_user()}")

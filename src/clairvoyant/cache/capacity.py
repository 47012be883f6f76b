"""How many bytes each tier may hold: parsed from what the user wrote, or chosen for the machine.

``"400GiB"``, ``4e11`` and ``"50%"`` (of the data set's bytes as cached) are
accepted. Defaults: 90% of the free space of the local device (plus what the
cache already holds there), and for RAM a quarter of the memory available now,
at most 90% of the free space of the RAM file system.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigError
from ..units import format_bytes, parse_bytes


@dataclass(frozen=True)
class Capacity:
    nbytes: int
    how: str          # how the value was chosen, for the report

    def __str__(self) -> str:
        return f"{format_bytes(self.nbytes)} ({self.how})"


def is_percentage(value: object) -> bool:
    return isinstance(value, str) and value.strip().endswith("%")


def parse_fraction(value: str, *, what: str) -> float:
    """``"50%"`` -> 0.5; ConfigError unless a positive percentage."""
    try:
        pct = float(value.strip()[:-1]) if is_percentage(value) else float("nan")
    except ValueError:
        pct = float("nan")
    if pct != pct:
        raise ConfigError(f"{what}={value!r} is not a percentage: write e.g. '50%'")
    if not 0 < pct:
        raise ConfigError(f"{what}={value!r} must be a positive percentage")
    return pct / 100


def parse_capacity(value: int | float | str, *, what: str, dataset_bytes: int) -> Capacity:
    if is_percentage(value):
        return Capacity(int(dataset_bytes * parse_fraction(value, what=what)), f"{value.strip()} of the data set")
    return Capacity(parse_bytes(value, what=what), "as given")


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def default_local(path: str, already_used: int) -> Capacity:
    return Capacity(int(0.9 * _free(path)) + already_used, "default: 90% of the free space of the local device")


def default_ram(path: str, already_used: int) -> Capacity:
    n = min(_mem_available() // 4, int(0.9 * _free(path)) + already_used)
    return Capacity(n, "default: a quarter of available memory")


def resolve(value, *, what: str, dataset_bytes: int, largest_entry: int, default) -> Capacity:
    """The capacity to use; ConfigError if it cannot hold the largest sample. A capacity given as 0
    bytes is a tier that holds nothing (every sample read where it lives)."""
    cap = default() if value is None else parse_capacity(value, what=what, dataset_bytes=dataset_bytes)
    if cap.nbytes < largest_entry and not (cap.nbytes == 0 and cap.how == "as given"):
        raise ConfigError(
            f"{what}={format_bytes(cap.nbytes)} ({cap.how}) is smaller than the largest sample "
            f"({format_bytes(largest_entry)} with its checksum): give the tier more room")
    return cap

"""The glibc heap of the processes that load: what the readers keep, what the training process gives back.

Both are glibc-only and do nothing elsewhere. clairvoyant changes no allocator setting of the
training process (its tensors are the user's); it only hands back, once per pass, the freed memory
that planning the pass left in the heap.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_heap(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Serve large allocations from a heap that is kept between batches (glibc only).

    A decoded 256x256 image is 196 KB, above glibc's default threshold for a private ``mmap``,
    so every decode would map fresh pages and fault them in, and every free unmap them: about
    60-130 us of kernel time per image here, a sixth of the decode itself. With the thresholds
    raised, a reader reuses the same pages batch after batch. True if glibc took the settings.
    """
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):   # not glibc
        return False


def trim_heap() -> bool:
    """Give the freed pages of every malloc arena back to the system (glibc's ``malloc_trim``).

    Planning a pass of ImageNet size makes dozens of temporary arrays of 4-19 MB (1.28 M samples
    at 8 bytes); once glibc has seen such a block freed it serves the next ones from the heap
    rather than from fresh maps, and the heap keeps their pages after they are freed: about
    70 MB of a rank's resident memory at 1.28 M samples (docs/benchmarks.md). Called once per
    pass, after the plan is made; a few milliseconds. True if glibc did it."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(ctypes.c_size_t(0))
        return True
    except (OSError, AttributeError):   # not glibc
        return False

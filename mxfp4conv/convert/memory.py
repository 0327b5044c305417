"""Keep freed buffers in the process instead of returning them to the kernel.

The converter allocates and frees buffers of the same few sizes for every chunk. glibc
serves large blocks with mmap and trims its heap on free, so every chunk would fault its
buffers in again (and zero them) page by page; on virtual machines that costs as much as
the copy itself. Raising the mmap and trim thresholds makes those buffers reused instead.
Peak RSS stays bounded by the largest working set (a few chunks).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit
_done = False


def keep_freed_memory() -> bool:
    """Best effort (glibc only); returns whether it took effect."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
        ok = libc.mallopt(M_TRIM_THRESHOLD, 512 << 20) == 1 and ok
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok

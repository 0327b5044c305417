"""Start writing dirty pages to the disk as soon as they are complete.

Without this the kernel keeps a whole shard in the page cache (up to ``vm.dirty_ratio`` of
RAM, tens of GB on a large host) and writes most of it only at the final ``fsync``: reading
and writing then happen one after the other instead of together. ``sync_file_range`` with
``SYNC_FILE_RANGE_WRITE`` queues the range for writing and returns; it neither waits for the
disk nor makes any durability promise (the shard is still fsynced before its rename).
Best effort: where the call does not exist (non-Linux, some sandboxes) nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

SYNC_FILE_RANGE_WRITE = 2
_fn = None
_enabled = sys.platform.startswith("linux")


def _load():
    global _fn, _enabled
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        _enabled = False
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    _fn = fn
    return fn


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    global _enabled
    if not _enabled or nbytes <= 0:
        return
    fn = _fn or _load()
    if fn is None:
        return
    if fn(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) != 0:
        _enabled = False  # ENOSYS / EINVAL / ESPIPE: the file system or sandbox does not support it

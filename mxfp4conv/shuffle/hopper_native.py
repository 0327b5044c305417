"""The hopper_mma weight transforms, compiled when the optional extension is built.

``weight_forward`` returns the bytes of ``hopper_np.weight_forward`` (either bit order) for any
input. The numpy path costs about 1.2 GB/s a core; the extension (``_hopper_native.c``, built by
``setup.py`` when a C compiler and Python's headers are there) runs several times faster and
releases the GIL, so convert's workers transform in parallel. Input it is not written for (not uint8, not
3-D, N not a multiple of 16, K/2 not a multiple of 32, no experts) goes to the numpy path,
which accepts or refuses it as before. ``MXFP4CONV_NO_NATIVE=1`` switches the extension off
(read at every call). The scale transform stays numpy: it moves 1/16 of the bytes, at 3.4 GB/s.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from mxfp4conv.shuffle import hopper_np as HN

try:
    from mxfp4conv.shuffle import _hopper_native as _native
except ImportError:  # not built: no compiler or headers at install time
    _native = None

ENV_OFF = "MXFP4CONV_NO_NATIVE"


def built() -> bool:
    return _native is not None


def enabled() -> bool:
    """Built, on a little-endian machine (the word order the numpy path writes), not switched off."""
    return _native is not None and sys.byteorder == "little" and os.environ.get(ENV_OFF, "") in ("", "0")


def weight_forward(x: np.ndarray, order: str = "plain") -> np.ndarray:
    """``[E, N, K/2]`` uint8 -> the stored bytes, same shape (``hopper_np.weight_forward``)."""
    if (enabled() and isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 3 and x.size
            and x.shape[1] % 16 == 0 and x.shape[2] % 32 == 0):
        x = np.ascontiguousarray(x)
        out = np.empty(x.shape, dtype=np.uint8)
        _native.weight_forward(x, out, x.shape[2], HN.ORDERS.index(HN.check_order(order)))
        return out
    return HN.weight_forward(x, order)

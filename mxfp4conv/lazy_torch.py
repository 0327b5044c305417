"""``torch``, imported on its first use.

Importing torch costs 1-5 s (more from a cold page cache, or with a CUDA build), longer than
converting a few GB. The modules ``convert`` runs through name torch via this proxy instead
of importing it, so a conversion whose every step has a numpy path (per-expert checkpoints
in the AITER and hopper_mma layouts) never loads it; any other use loads it on first touch,
with the same results.
"""

from __future__ import annotations

import importlib
import sys


class _LazyTorch:
    """Attribute access imports torch and returns its attribute (then cached here)."""

    def __getattr__(self, name: str):
        value = getattr(importlib.import_module("torch"), name)
        if not name.startswith("__"):
            setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return "<torch, imported on first use>"


torch = _LazyTorch()


def loaded():
    """The torch module if something imported it already, else None."""
    return sys.modules.get("torch")

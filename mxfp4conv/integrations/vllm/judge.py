"""The live vLLM engine judges the kernel-ready bytes it is handed.

A checkpoint's ``kernel_ready`` layers hold the bytes mxfp4conv believes vLLM's weight converter
would produce. Whatever release wrote the manifest and whatever converter function the running
release calls, the engine decides:

- **Canary.** The first layer of each kind (quant method, backend, activation) is loaded the slow
  way: its stored bytes are brought back to the checkpoint's canonical bytes (the layouts' exact
  inverses), put into vLLM's parameters as vLLM's weight loader leaves them, and converted by
  vLLM's own ``process_weights_after_loading``. The converted parameters are compared with the
  stored bytes. Meanwhile every ``convert_*mxfp4*kernel_format`` function of the quant method's
  module is watched, so that the fast path below is known to reach the converter this release
  calls.
- **Fast path** (canary equal, converter seen): the other layers of that kind skip vLLM's
  conversion; the converter answers with the stored bytes.
- **Live check**: after vLLM's ``process_weights_after_loading`` on every fast-path layer, each
  converted parameter must hold exactly the stored bytes (an equality on the device). A release
  that converts anyway (a second shuffle) is refused, never served.
- **Mismatch**: the canary's bytes differ from the stored ones. Strict (``MXFP4CONV_STRICT=1``,
  or ``{"strict": true}`` in ``--model-loader-extra-config``) refuses to load; by default every
  layer of that kind gets its canonical bytes and vLLM converts them itself (correct; only the
  start-up saving is lost), with one warning naming the tensor, the first differing byte and the
  releases.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mxfp4conv.errors import RuntimeInputError

log = logging.getLogger(__name__)

STRICT_ENV = "MXFP4CONV_STRICT"
CONVERTER_NAME = re.compile(r"^convert_\w*mxfp4\w*kernel_format$")
READY, CONVERT = "ready", "convert"  # verdicts: the fast path, or vLLM converts canonical bytes


def strict_from(extra_config: dict | None) -> bool:
    """Strict mode: ``MXFP4CONV_STRICT=1`` or ``{"strict": true}`` in the loader's extra config."""
    if str(os.environ.get(STRICT_ENV, "")).strip().lower() in ("1", "true", "yes", "on"):
        return True
    return bool((extra_config or {}).get("strict", False))


@dataclass
class Verdict:
    outcome: str  # READY | CONVERT
    reason: str
    canary_layer: str
    canary_seconds: float


@dataclass
class Judge:
    """One model load's verdicts, shared by the wrapped ``process_weights_after_loading`` of every
    kernel-ready layer."""

    where: str
    manifest_release: str | None
    engine_release: str
    strict: bool = False
    verdicts: dict[tuple, Verdict] = field(default_factory=dict)
    checked: int = 0  # fast-path layers whose converted parameters were checked equal
    pre_processed: int = 0  # fast-path layers loaded through vLLM's weights_already_processed path

    def verdict(self, kind: tuple) -> Verdict | None:
        return self.verdicts.get(kind)


def converter_functions(qm) -> tuple[Any, dict[str, Callable]]:
    """The quant method's module and its weight-converter functions (the names it can call)."""
    module = importlib.import_module(type(qm).__module__)
    found = {name: getattr(module, name) for name in dir(module)
             if CONVERTER_NAME.match(name) and callable(getattr(module, name))}
    return module, found


@contextlib.contextmanager
def converters_replaced(module, functions: dict[str, Callable], make: Callable[[str, Callable], Callable]):
    """Every function of ``functions`` in ``module`` replaced by ``make(name, original)`` while active."""
    for name, original in functions.items():
        setattr(module, name, make(name, original))
    try:
        yield
    finally:
        for name, original in functions.items():
            setattr(module, name, original)


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when the two tensors hold the same bytes, else where they first differ (in words)."""
    a = got.detach().contiguous().reshape(-1).view(torch.uint8)
    b = want.detach().to(got.device).contiguous().reshape(-1).view(torch.uint8)
    if a.numel() != b.numel():
        return f"{a.numel()} bytes against {b.numel()} stored (shape {list(got.shape)} against {list(want.shape)})"
    if torch.equal(a, b):
        return None
    at = int((a != b).nonzero()[0, 0])
    return f"byte offset {at} (0x{int(a[at]):02x} there, 0x{int(b[at]):02x} stored)"


def compare(layer, ready: dict[str, torch.Tensor]) -> tuple[str, str] | None:
    """The first (parameter, difference) where the layer's converted parameters differ from
    ``ready`` (the stored bytes in the forms vLLM keeps), or None when all are equal."""
    for name, want in ready.items():
        got = getattr(layer, name, None)
        if not isinstance(got, torch.Tensor):
            return name, "vLLM's layer has no such tensor after its conversion"
        diff = first_difference(got, want)
        if diff is not None:
            return name, diff
    return None

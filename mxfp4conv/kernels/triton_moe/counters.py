"""Arrival counters that the fused kernels leave as they found them: zero.

A kernel that sums K-split or top-k partials in its last program counts arrivals on int32 counters. Zeroing fresh
counters every call is one more launch before the kernels (a fill node in a CUDA graph). The per-pair Gluon kernels
instead reset each counter in the program that arrives last on it, so one buffer per device, zeroed once, serves
every call. Calls on one device that overlap in time (kernels of two calls running at once on two streams) must not
share it: such callers pass reuse=False.
"""

from __future__ import annotations

import torch

_BUFFERS: dict[tuple[str, int | None], torch.Tensor] = {}


def zeroed_counters(device: torch.device, n: int, reuse: bool = True) -> torch.Tensor:
    """n int32 counters, all zero, for kernels that reset every counter they count to zero (reuse), or a fresh
    zeroed tensor. The shared buffer grows outside CUDA-graph capture only (a buffer made during capture is zero only
    once the graph replays); a capture that needs more takes a fresh one, its fill part of the graph."""
    if not reuse:
        return torch.zeros(n, dtype=torch.int32, device=device)
    device = torch.device(device)
    cuda = device.type == "cuda"
    key = (device.type, (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < n:
        if cuda and torch.cuda.is_current_stream_capturing():
            return torch.zeros(n, dtype=torch.int32, device=device)
        buf = torch.zeros(max(n, 4096, 2 * (buf.numel() if buf is not None else 0)), dtype=torch.int32, device=device)
        _BUFFERS[key] = buf
    return buf[:n]

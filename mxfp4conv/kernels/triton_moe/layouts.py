"""The weight layouts the kernels read, by the name fused_moe_triton's ``layout`` argument takes.
"""

from __future__ import annotations

from typing import Mapping


LAYOUTS = ("identity", "hopper_mma_w", "hopper_mma_w_rot", "hopper_mma_w_xor", "hopper_mma_s")  # per tensor


# layout argument of fused_moe_triton -> (weights, scales) layouts it means; hopper_mma_rot and hopper_mma_xor differ
# from hopper_mma only in the bit order within the weight words (shuffle.hopper)
LAYOUT_SETS = {"identity": ("identity", "identity"), "hopper_mma": ("hopper_mma_w", "hopper_mma_s"),
               "hopper_mma_rot": ("hopper_mma_w_rot", "hopper_mma_s"),
               "hopper_mma_xor": ("hopper_mma_w_xor", "hopper_mma_s")}


# the hopper_mma sets -> their words' bit order (hopper_np.ORDERS); the Gluon kernels decode the last two
HOPPER_ORDERS = {"hopper_mma": "plain", "hopper_mma_rot": "rot", "hopper_mma_xor": "xor"}


HOPPER_SETS = tuple(HOPPER_ORDERS)


GLUON_SETS = ("hopper_mma_rot", "hopper_mma_xor")


def layout_of(layout: Mapping[str, str]) -> str | None:
    """The ``layout`` argument of fused_moe_triton for per-kind stored layouts (w13, w13_scale,
    w2, w2_scale), or None when the kernels cannot read that combination."""
    for name, (w, s) in LAYOUT_SETS.items():
        if all(layout.get(k, "identity") == (s if k.endswith("scale") else w)
               for k in ("w13", "w13_scale", "w2", "w2_scale")):
            return name
    return None

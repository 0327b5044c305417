"""Serve-time runtime: load a converted checkpoint's experts and run the fused MoE forward."""

from mxfp4conv.runtime.dispatch import fused_moe
from mxfp4conv.runtime.experts import MoEExperts
from mxfp4conv.runtime.loader import load_moe_layers

__all__ = ["MoEExperts", "fused_moe", "load_moe_layers"]

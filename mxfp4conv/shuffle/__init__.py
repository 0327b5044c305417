"""Byte layouts of MXFP4 expert tensors: AITER's shuffles (``aiter``) and named layouts (``layouts``)."""

from mxfp4conv.shuffle.layouts import LAYOUTS, Layout, get_layout, register_layout

__all__ = ["LAYOUTS", "Layout", "get_layout", "register_layout"]

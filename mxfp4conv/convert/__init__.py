"""Streaming conversion into the kernel-ready format, and its verification.

``convert(source, out, target, ...)`` writes the format of docs/kernel-ready-format.md;
``mxfp4conv.convert.verify.verify(out, source=None)`` proves it lossless.
"""

from mxfp4conv.convert.run import ConvertResult, convert

__all__ = ["ConvertResult", "convert"]

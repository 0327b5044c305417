"""mxfp4conv: offline conversion of MXFP4 MoE checkpoints into kernel-ready layouts."""

__version__ = "0.1.0"

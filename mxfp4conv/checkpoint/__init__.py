"""Reading MXFP4 MoE checkpoints: sources, headers, family adapters, expert bytes."""

from mxfp4conv.checkpoint.source import Source, TensorInfo, open_source

__all__ = ["Source", "TensorInfo", "open_source", "load_model"]


def __getattr__(name):  # load_model pulls in every family adapter; import it on first use
    if name == "load_model":
        from mxfp4conv.checkpoint.detect import load_model

        return load_model
    raise AttributeError(name)

"""The backend oracle: vLLM's MXFP4 MoE backend decision, made offline and explained."""

from mxfp4conv.oracle.arch import resolve_arch
from mxfp4conv.oracle.backends import Server
from mxfp4conv.oracle.decision import Candidate, Decision, LayoutRecipe, Target
from mxfp4conv.oracle.select import decide

__all__ = ["decide", "resolve_arch", "Target", "Decision", "Candidate", "LayoutRecipe", "Server"]

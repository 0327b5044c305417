"""Test-session setup shared by every test module.

Triton decides at import time whether kernels run in its CPU interpreter, so the switch has
to be set before any test module imports triton. On machines without a CUDA GPU the
kernels can only run interpreted.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

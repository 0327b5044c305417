"""Build of the optional compiled part; the project's metadata is in pyproject.toml.

The extension is optional: without a C compiler or Python's headers the install still succeeds
and mxfp4conv runs its numpy path (mxfp4conv/shuffle/hopper_native.py)."""

import os

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "mxfp4conv.shuffle._hopper_native",
    ["mxfp4conv/shuffle/_hopper_native.c"],
    extra_compile_args=[] if os.name == "nt" else ["-O3"],
    optional=True,
)])

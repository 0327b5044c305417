"""Glue between mxfp4conv's converted checkpoints and serving engines.

Each engine has its own subpackage, and only that subpackage imports the engine (lazily, inside
functions), so ``import mxfp4conv`` never needs an engine installed.
"""

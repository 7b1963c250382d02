"""Build hook for the optional C extension ``msprobe._native.fused_stats``.

All metadata lives in pyproject.toml. The extension is optional: without a C compiler (or
if compiling fails) ``pip install`` still succeeds and msprobe computes the statistics with
torch/numpy instead (``msprobe.pytorch.stats.NATIVE`` is then None).
"""
import sys

from setuptools import Extension, setup

# No -ffast-math (NaN semantics) and no -march=native (builds may be shared across machines):
# the AVX2 kernels are selected at run time (see fused_stats.c).
_ARGS = [] if sys.platform == "win32" else ["-O3", "-fno-strict-aliasing"]

setup(ext_modules=[Extension("msprobe._native.fused_stats", ["msprobe/_native/fused_stats.c"],
                             extra_compile_args=_ARGS, optional=True)])

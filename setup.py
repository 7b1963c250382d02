"""Build hook for the optional C extensions ``msprobe._native.fused_stats`` and
``store._record_text`` (dump.json text).

All metadata lives in pyproject.toml. The extensions are optional: without a C compiler (or
if compiling fails) ``pip install`` still succeeds and msprobe computes the statistics with
torch/numpy instead (``msprobe.pytorch.stats.NATIVE`` is then None), and dump.json is
encoded by the Python code of ``store.record_text`` (``store.record_text._native`` is then
None; same bytes, slower).
"""
import sys

from setuptools import Extension, setup

# No -ffast-math (NaN semantics) and no -march=native (builds may be shared across machines):
# the AVX2 kernels are selected at run time (see fused_stats.c).
_ARGS = [] if sys.platform == "win32" else ["-O3", "-fno-strict-aliasing"]

setup(ext_modules=[Extension("msprobe._native.fused_stats", ["msprobe/_native/fused_stats.c"],
                             extra_compile_args=_ARGS, optional=True),
                   Extension("store._record_text", ["store/_record_text.c"],
                             extra_compile_args=_ARGS, optional=True)])

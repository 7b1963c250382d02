"""Fixtures shared by all test directories, and the test session's private TorchInductor
cache.

TorchInductor keeps compiled kernels in one cache directory per user (``/tmp/torchinductor_$USER``
by default) whose keys do not cover every setting that shapes the generated code: a kernel
generated for one vector width (``ATEN_CPU_CAPABILITY=avx2``) and reloaded by a run that
compiles its header for another (AVX-512) stores past the end of its buffers and corrupts the
heap. The test session therefore compiles into a directory of its own, removed at exit,
unless ``TORCHINDUCTOR_CACHE_DIR`` is set."""
import atexit
import os
import shutil
import tempfile

import pytest

# stop() and step() return once the step's files are written, as the tests read them right
# after (the writer process writes them while training goes on; docs/pytorch.md, "When the
# files are written"); tests of that behaviour unset it
os.environ.setdefault("MSPROBE_WAIT_FILES", "1")

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="msprobe-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
    atexit.register(shutil.rmtree, _INDUCTOR_CACHE, ignore_errors=True)


def _read_json_files(root) -> dict:
    """``{path relative to root: bytes}`` of every ``.json`` file below ``root``."""
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".json"):
                path = os.path.join(directory, name)
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, root)] = handle.read()
    return out


@pytest.fixture
def json_files():
    """``json_files(root)``: the bytes of every ``.json`` file below ``root`` by relative
    path (two exports of the same rows compared byte for byte)."""
    return _read_json_files

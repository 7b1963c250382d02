"""Share the native statistics pass of large tensors with PyTorch's own OpenMP threads.

PyTorch runs its CPU operators on an OpenMP thread team (``torch.get_num_threads()``
threads); between two operators its worker threads wait for the next one. The native pass
(:mod:`msprobe._native`) over a tensor of at least 65,536 elements can hand half of it (a
share per thread) to those same threads: the team starts at once, and each core reads the
part of the output that it has just written, still in its cache. Encoder benchmark, a
1M-element float32 output of a two-thread matmul: 145 us with one thread, 75 us shared.

The result does not depend on it: the pass reduces fixed chunks of 16,384 elements and adds
their results in chunk order however many threads share them (``fused_stats.c``).

GNU OpenMP's threads do not survive ``fork()``: a child forked after its parent ran a team
hangs in its first multi-threaded operator (PyTorch's DataLoader workers set one thread and
are safe). So msprobe starts no team of its own accord: :func:`share_once`, at the first
recording ``PrecisionDebugger.start()``, only hands over the runtime, and the first team
starts when a CPU tensor of 65,536 elements or more is reduced; a CPU training process has
by then run PyTorch's own teams anyway. A program that records no such tensor (a GPU
training step) never runs one because of msprobe. From then on only the thread that called
:func:`share_once` shares
(another thread would start a team, and threads, of its own), never a forked child. With a
CRC-32 (summary_mode md5) each chunk's CRC is computed from 0 and the chunks' CRCs are
combined in order (zlib's ``crc32_combine`` identity): the same value as one pass.
``MSPROBE_NO_NATIVE_THREADS=1`` keeps the pass on one thread. Linux only (the runtime is found in ``/proc/self/maps``);
elsewhere the pass stays on one thread.
"""
from __future__ import annotations

import ctypes
import os
import threading
from types import ModuleType
from typing import Optional

import torch

#: file-name prefixes of OpenMP runtimes that export libgomp's ``GOMP_parallel`` entry point
_RUNTIMES = ("libgomp", "libiomp5", "libomp")
_FUNCTIONS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads",
              "omp_in_parallel")
#: whether :func:`share_once` ran in this process, and what it gave (process-wide: the
#: runtime and the compiled module are process-wide too)
_ONCE = {"pid": None, "shared": False}
_ONCE_LOCK = threading.Lock()


def openmp_runtime(maps: str = "/proc/self/maps") -> Optional[str]:
    """The path of the OpenMP runtime PyTorch's operators run on, or None.

    Args:
        maps: the process's memory map (``/proc/self/maps`` format; a parameter for tests).
    Returns:
        The one runtime among the mapped files named ``libgomp*``/``libiomp5*``/``libomp*``,
        preferring one inside the ``torch`` package; None when PyTorch was built without
        OpenMP, the map is unreadable, or the choice is ambiguous (two runtimes outside torch).
    """
    if not getattr(torch._C, "has_openmp", False):
        return None
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.startswith("/") and os.path.basename(path).startswith(_RUNTIMES) and path not in found:
            found.append(path)
    torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
    inside = [p for p in found if os.path.realpath(p).startswith(torch_dir)]
    if len(inside) == 1:
        return inside[0]
    return found[0] if len(found) == 1 and not inside else None


def runtime_addresses() -> Optional[list]:
    """The addresses of ``GOMP_parallel``, ``omp_get_thread_num``, ``omp_get_num_threads``,
    ``omp_get_max_threads`` and ``omp_in_parallel`` in :func:`openmp_runtime` (the arguments
    of ``fused_stats.set_parallel``), or None when there is no runtime or it lacks one."""
    path = openmp_runtime()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)  # the loaded library: dlopen returns its handle
        return [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _FUNCTIONS]
    except (OSError, AttributeError):
        return None


def workers_sleep(environ: Optional[dict] = None) -> bool:
    """True when the OpenMP runtime is told to put its idle workers to sleep at once
    (``OMP_WAIT_POLICY=PASSIVE``, or ``GOMP_SPINCOUNT=0`` for GNU OpenMP): every team would
    first have to wake them. Encoder benchmark, L1, 20 alternating pairs with
    ``OMP_WAIT_POLICY=PASSIVE``: a shared pass made the step 8 ms slower (median).

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    return (env.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
            or env.get("GOMP_SPINCOUNT", "").strip() == "0")


def share_with_torch_threads(native: Optional[ModuleType]) -> bool:
    """Hand ``native`` (the ``fused_stats`` module) PyTorch's OpenMP runtime; True if done.

    Nothing happens (False) without the module or its ``set_parallel`` (an older build),
    without a runtime (:func:`openmp_runtime`), with ``MSPROBE_NO_NATIVE_THREADS`` set to
    anything but ``""``/``"0"``, or when the OpenMP workers do not spin between operators
    (:func:`workers_sleep`); the pass then stays on one thread. No team starts here: the
    first starts when a tensor of 65,536 elements or more is reduced (a process that records
    no such CPU tensor never runs an OpenMP team because of msprobe, see the module docstring).
    """
    if native is None or not hasattr(native, "set_parallel"):
        return False
    if os.environ.get("MSPROBE_NO_NATIVE_THREADS", "") not in ("", "0") or workers_sleep():
        return False
    addresses = runtime_addresses()
    if addresses is None:
        return False
    native.set_parallel(*addresses)
    return True


def share_once(native: Optional[ModuleType]) -> bool:
    """:func:`share_with_torch_threads` the first time it is called in this process (by
    ``PrecisionDebugger.start()``, on the thread that trains); later calls return the first
    call's result. True when the pass shares."""
    with _ONCE_LOCK:
        if _ONCE["pid"] != os.getpid():
            _ONCE["pid"] = os.getpid()
            _ONCE["shared"] = share_with_torch_threads(native)
        return _ONCE["shared"]


def sharing() -> bool:
    """True when :func:`share_once` has handed PyTorch's runtime to the pass in this process."""
    return _ONCE["pid"] == os.getpid() and _ONCE["shared"]

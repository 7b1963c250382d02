"""Arrow's memory pool for a recording process: the system allocator.

The recorder's Arrow use is small (batches of event rows, under 1 MB at a time), but
pyarrow's default pool, mimalloc, commits its arenas eagerly: in one process recording
four L1 steps of the benchmark encoder it raised peak RSS by ~13 MB (500 → 485 MB with the
system allocator, glibc malloc, which returns freed memory). In benchmarks/overhead.py's
fresh-process peak RSS the difference was within the run-to-run spread.

:func:`prefer_system_pool` makes the system allocator pyarrow's default pool of this
process, when the choice is still open: pyarrow not yet imported and
``ARROW_DEFAULT_MEMORY_POOL`` not set by the user (Arrow reads that variable once, at
the first use of its default pool). The variable is set only for that first use and
removed again, so child processes do not inherit it. A script that imports pyarrow
before msprobe, or sets the variable, keeps its own choice. The session calls it before
it writes its log in the training process (task ``tensor``, ``MSPROBE_WRITER=inprocess``);
a training process that hands its records to a writer process loads no pyarrow, and the
writer process chooses the system allocator itself (store.writer_process).
"""
from __future__ import annotations

import os
import sys

_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def prefer_system_pool() -> bool:
    """Make the system allocator pyarrow's default memory pool if the choice is still open.

    Returns:
        True if this call made the choice, False if pyarrow was already imported or
        ``ARROW_DEFAULT_MEMORY_POOL`` is set (nothing changed then).
    Raises:
        nothing: a pyarrow that cannot be imported here is reported by the first real use.
    """
    if "pyarrow" in sys.modules or _VARIABLE in os.environ:
        return False
    os.environ[_VARIABLE] = "system"
    try:
        import pyarrow

        pyarrow.default_memory_pool()  # Arrow reads the variable here, once per process
    except ImportError:
        return False
    finally:
        os.environ.pop(_VARIABLE, None)
    return True

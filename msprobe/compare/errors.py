"""Named exceptions of ``msprobe compare``.

:class:`CompareInputError` is bad input (exit status 2 on the command line): the message
names the path, the field, the value found and what is allowed.
"""
from __future__ import annotations


class CompareError(Exception):
    """Base class of every error raised by :mod:`msprobe.compare`."""


class CompareInputError(CompareError, ValueError):
    """A compare input or option is unusable (missing path, empty dump, malformed
    dump.json, bad option value). The message names path/field, value and what is allowed."""

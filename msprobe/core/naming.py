"""dump.json entry names and their per-step call counters (spec section 2.1).

Names (separator always ``.``):

* API forward / backward: ``{Family}.{api}.{n}.forward`` / ``.backward`` (same ``n``);
* module forward / backward: ``{Module|Cell}.{path}.{Class}.forward.{n}`` / ``.backward.{n}``
  (backward ``n`` pairs with forward ``n``: spec section 9, fix 5);
* parameter gradients: ``{Module|Cell}.{path}.{Class}.parameters_grad``;
* debug save: ``{name}.{k}`` and ``{name}_grad.{k}``.
"""
from __future__ import annotations

import re
from typing import Callable


class CallCounter:
    """Counts calls per key within one step; :meth:`reset` starts the next step.

    >>> c = CallCounter(); c.next("Functional.linear"), c.next("Functional.linear")
    (0, 1)
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def next(self, key: str) -> int:
        """Return the 0-based number of this call of ``key`` in the step and count it."""
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        return n

    def peek(self, key: str) -> int:
        """The number the next call of ``key`` in the step will get (not counted)."""
        return self._counts.get(key, 0)

    def reset(self) -> None:
        self._counts.clear()


def to_backward(name: str | None) -> str | None:
    """The backward twin of a forward entry name, or None.

    ``"Module.a.A.forward.2"`` → ``"Module.a.A.backward.2"``;
    ``"Functional.relu.0.forward"`` → ``"Functional.relu.0.backward"``.
    """
    if name is None:
        return None
    if name.endswith(".forward"):
        return name[: -len("forward")] + "backward"
    head, sep, tail = name.rpartition(".forward.")
    if sep and tail.isdigit():
        return f"{head}.backward.{tail}"
    return None


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def safe_component(text: str, limit: int = 200) -> str:
    """Sanitise a user-supplied name for use inside a file name: characters outside
    ``[A-Za-z0-9_.-]`` become ``_`` and ``..`` becomes ``__``; truncated to ``limit``."""
    cleaned = _UNSAFE.sub("_", text).replace("..", "__")
    return cleaned[:limit] or "_"


def distinct(texts: list[str], variant: Callable[[str, int], str]) -> list[str]:
    """``texts`` made distinct, in order: a text that an earlier one already is becomes
    ``variant(text, n)`` with the smallest ``n >= 2`` that is none of ``texts`` and no
    variant given before. Distinct texts come back unchanged (the same list).

    Dict keys of different types with one text (``1``, ``"1"``:
    :func:`msprobe.core.values.object_keys`) and tensor file names that sanitise alike
    (:func:`unique_file_names`) are made distinct this way."""
    if len(set(texts)) == len(texts):
        return texts
    taken = set(texts)  # a variant must not take a later text's own value either
    seen: set = set()
    out: list[str] = []
    for text in texts:
        if text in seen:
            n = 2
            while variant(text, n) in taken:
                n += 1
            text = variant(text, n)
            taken.add(text)
        seen.add(text)
        out.append(text)
    return out


def numbered_file_name(name: str, n: int) -> str:
    """``name`` with ``-{n}`` before its extension (``x.a_b.pt``, 2 -> ``x.a_b-2.pt``;
    ``noext``, 2 -> ``noext-2``)."""
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    return f"{stem}-{n}{dot}{ext}"


def unique_file_names(names: list[str]) -> list[str]:
    """``names`` (tensor file names of one entry, in leaf order) made distinct: sanitising
    can give two leaves the same name (dict keys ``"a/b"`` and ``"a_b"`` both become
    ``a_b``), and then one file would hold the other leaf's tensor. A name that an
    earlier leaf already has gets ``-{n}`` before its extension, with the smallest
    ``n >= 2`` that no other name of the entry has (``x.a_b.pt``, ``x.a_b-2.pt``).
    Distinct names come back unchanged."""
    return distinct(names, numbered_file_name)


def free_file_name(name: str, taken: Callable[[str], bool]) -> str:
    """``name`` with ``-{n}`` before its extension, the smallest ``n >= 2`` for which
    ``taken`` is False (``x.a_b.pt`` -> ``x.a_b-2.pt``; ``noext`` -> ``noext-2``)."""
    n = 2
    while taken(numbered_file_name(name, n)):
        n += 1
    return numbered_file_name(name, n)


#: dump.json top-level key → file-name category (spec 2.2).
_CATEGORY = {"input_args": "input", "input_kwargs": "kwargs", "output": "output",
             "parameters": "parameters", "input": "input"}
def tensor_file_name(entry: str, kind: str, io: str, path: tuple, ext: str) -> str:
    """The tensor file name of one leaf (spec 2.2, section 9 fix 15), sanitised, any
    length (see :mod:`store.tensor_names` for names over 255 bytes).

    Args:
        entry: the dump.json entry name.
        kind: the call kind (``store.schema`` ``CALL_KINDS`` value).
        io: the leaf's top-level key (``input_args``, ``input_kwargs``, ``output``,
            ``parameters``, ``input``; a parameter name for ``parameters_grad``; ``""``
            for a debug save).
        path: the leaf's index path below ``io``.
        ext: ``"pt"`` or ``"npy"``.

    Examples::

        tensor_file_name("Torch.cat.0.forward", "api_forward", "input_args", (0, 1), "pt")
            == "Torch.cat.0.forward.input.0.1.pt"
        tensor_file_name("Torch.add.0.forward", "api_forward", "input_kwargs", ("other",), "pt")
            == "Torch.add.0.forward.kwargs.other.pt"
        tensor_file_name("M.fc.Linear.parameters_grad", "parameters_grad", "bias", (0,), "pt")
            == "M.fc.Linear.parameters_grad.bias.pt"
        tensor_file_name("y.0", "debug_save", "", (), "pt") == "y.0.tensor.pt"
        tensor_file_name("nested.0", "debug_save", "", ("k2", 0), "pt") == "nested.0.tensor.k2.0.pt"
    """
    if kind == "parameters_grad":
        parts = [entry, io]
    elif kind == "debug_save":
        parts = [entry, "tensor", *(str(p) for p in path)]
    else:
        parts = [entry, _CATEGORY.get(io, io), *(str(p) for p in path)]
    stem = ".".join(p for p in parts if p != "")
    # not shortened: a name over the file-name limit is mapped to a short file name at
    # export time (store.tensor_names, mapping.csv); dump.json keeps this full name.
    # The stem is sanitised alone: a stem ending in "." (a dict key "v.", a long key cut
    # to "...") would otherwise meet the extension's dot and "..pt" become "__pt"
    cleaned = safe_component(stem, limit=len(stem))
    if cleaned.endswith("."):
        cleaned = cleaned[:-1] + "_"
    return cleaned + "." + ext

"""Call-stack capture with interning: each distinct user stack is formatted once.

stack.json frames are strings ``"File {path}, line {n}, in {func}, \\n {source line}"``,
innermost first (spec section 4.1). Per spec section 9 (fix 17) only user frames are
kept: frames of msprobe itself, of ``store`` and of the framework packages given at
construction are dropped.
"""
from __future__ import annotations

import hashlib
import linecache
import os
import sys
from types import CodeType
from typing import Iterable, Sequence

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../msprobe
_STORE_ROOT = os.path.join(os.path.dirname(_PACKAGE_ROOT), "store")


def _stack_id(frames: tuple[str, ...]) -> int:
    digest = hashlib.blake2b("\n".join(frames).encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class StackInterner:
    """Captures the current call stack and returns a stable int64 id for it.

    Args:
        exclude_dirs: directories whose files are not user code (framework packages);
            msprobe's own package and ``store`` are always excluded.
        max_depth: at most this many user frames are kept.

    ``capture()`` walks ``sys._getframe`` (no ``inspect.stack()``: it reads source for every
    frame) and keys the walk by its user frames' ``(id(code), f_lasti)`` pairs; strings are
    formatted and the id computed only the first time a key is seen, so identical stacks
    share one id and one row. The key holds each frame's instruction offset (``f_lasti``)
    rather than its line: two offsets on one line give two keys with the same text, id and
    row. Whether a code object is user code is decided once per code
    object. Code objects are keyed by ``id``: hashing one hashes its constants (nested code
    included) every time, and an id stays unique because every code object met is kept.
    New stacks are queued in :attr:`new_stacks` for the writer.
    """

    def __init__(self, exclude_dirs: Iterable[str] = (), max_depth: int = 64) -> None:
        dirs = [_PACKAGE_ROOT, _STORE_ROOT, *exclude_dirs]
        self._exclude = tuple(os.path.join(os.path.abspath(d), "") for d in dirs)
        self._max_depth = max_depth
        self._by_key: dict[tuple, int] = {}  # (id(code), f_lasti, id(code), f_lasti...) -> stack id
        self._seen: set[int] = set()  # stack ids registered (several keys may give one)
        self._code_user: dict[int, bool] = {}  # id(code) -> is user code
        self._codes: list[CodeType] = []  # the code objects of _code_user, kept alive
        self.new_stacks: list[tuple[int, tuple[str, ...]]] = []

    def _is_user(self, code: CodeType) -> bool:
        known = self._code_user.get(id(code))
        if known is None:
            known = self.is_user_file(code.co_filename)
            self._code_user[id(code)] = known
            self._codes.append(code)
        return known

    def is_user_file(self, filename: str) -> bool:
        """Whether a frame of the file ``filename`` is user code (not msprobe, ``store``
        or an excluded framework package)."""
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        return not path.startswith(self._exclude)

    def capture(self) -> int:
        """Return the id of the current user stack (registering it if new)."""
        frame = sys._getframe(1)
        code_user = self._code_user
        key = []  # flat: id(code), f_lasti, id(code), f_lasti... (no tuple per frame)
        frames = []  # the user frames, to format a new stack
        depth, max_depth = 0, self._max_depth
        while frame is not None and depth < max_depth:
            code = frame.f_code
            user = code_user.get(id(code))
            if user is None:
                user = self._is_user(code)
            if user:
                # the instruction offset, not f_lineno: reading a line number scans the
                # code's line table; offsets of one line give the same stack (and id)
                key += (id(code), frame.f_lasti)
                frames.append(frame)
                depth += 1
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._by_key.get(tkey)
        if sid is None:
            text = tuple(_format(f.f_code, f.f_lineno) for f in frames)
            sid = self._by_key[tkey] = _stack_id(text)
            if sid not in self._seen:
                self._seen.add(sid)
                self.new_stacks.append((sid, text))
        return sid

    def capture_around(self, inner: tuple[str, ...]) -> int:
        """The id of the stack ``inner`` (formatted user frames, innermost first: where a
        call sits in code that torch.compile traced) followed by the current user stack
        outside the compiled code: frames of generated code (file ``<...>``) are left out,
        and, when ``inner`` is not empty, the first user frame too (the compiled function,
        which ``inner`` ends with at the traced line)."""
        frame = sys._getframe(1)
        code_user = self._code_user
        key: list = [id(inner)]
        frames = []
        skip = bool(inner)
        while frame is not None and len(frames) < self._max_depth:
            code = frame.f_code
            user = code_user.get(id(code))
            if user is None:
                user = self._is_user(code)
            if user and not code.co_filename.startswith("<"):
                if skip:
                    skip = False
                else:
                    key += (id(code), frame.f_lasti)
                    frames.append(frame)
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._by_key.get(tkey)
        if sid is None:
            text = tuple(inner) + tuple(_format(f.f_code, f.f_lineno) for f in frames)
            sid = self._by_key[tkey] = _stack_id(text)
            if sid not in self._seen:
                self._seen.add(sid)
                self.new_stacks.append((sid, text))
        return sid

    def drain(self) -> Sequence[tuple[int, tuple[str, ...]]]:
        """Return and forget the stacks registered since the last drain (an empty tuple,
        and no new list, when there are none: the session drains once per recorded entry)."""
        out = self.new_stacks
        if not out:
            return ()
        self.new_stacks = []
        return out


def _format(code: CodeType, line: int) -> str:
    source = linecache.getline(code.co_filename, line).strip()
    return f"File {code.co_filename}, line {line}, in {code.co_name}, \n {source}"

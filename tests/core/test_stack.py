"""StackInterner: user frames only, one id per distinct stack, frames formatted per spec 4.1."""
from __future__ import annotations

import linecache
import sys

from msprobe.core.stack import StackInterner


def _frame_text(path: str, line: int, func: str) -> str:
    return f"File {path}, line {line}, in {func}, \n {linecache.getline(path, line).strip()}"


def _capture_here(interner: StackInterner) -> tuple[int, int]:
    """(stack id, line of the capture call)"""
    line = sys._getframe().f_lineno + 1
    return interner.capture(), line


def test_identical_stacks_share_one_id_and_one_queued_stack():
    interner = StackInterner()
    ids, caller_lines = [], []
    for _ in range(3):
        sid, line = _capture_here(interner)
        caller_lines.append(sys._getframe().f_lineno - 1)
        ids.append(sid)
    assert ids[0] == ids[1] == ids[2]
    new = interner.drain()
    assert len(new) == 1 and new[0][0] == ids[0]
    frames = new[0][1]
    this = "test_identical_stacks_share_one_id_and_one_queued_stack"
    assert frames[0] == _frame_text(__file__, line, "_capture_here")
    assert frames[1] == _frame_text(__file__, caller_lines[0], this)
    other, _ = _capture_here(interner)  # called from another line: another stack
    other_line = sys._getframe().f_lineno - 1
    assert other != ids[0]
    assert interner.drain()[0][1][1] == _frame_text(__file__, other_line, this)
    assert len(interner.drain()) == 0  # nothing new since


def test_equal_code_objects_of_two_files_are_two_stacks(tmp_path):
    # code objects compare (and hash) equal by content, whatever their file: the interner
    # must still tell the files apart
    source = "def where(interner):\n    return interner.capture()\n"
    paths = [str(tmp_path / "a.py"), str(tmp_path / "b.py")]
    funcs = []
    for path in paths:
        with open(path, "w") as f:
            f.write(source)
        namespace: dict = {}
        exec(compile(source, path, "exec"), namespace)
        funcs.append(namespace["where"])
    assert funcs[0].__code__ == funcs[1].__code__
    interner = StackInterner()
    first, second = funcs[0](interner), funcs[1](interner)
    assert first != second
    new = dict(interner.drain())
    assert new[first][0] == _frame_text(paths[0], 2, "where")
    assert new[second][0] == _frame_text(paths[1], 2, "where")


def test_calls_on_one_line_share_one_stack_and_row():
    """Two captures from one source line at different instruction offsets give one id and
    one registered stack; a capture from another line gives another."""
    interner = StackInterner()

    def cap():
        return interner.capture()

    pair = (cap(), cap())  # one line, two call instructions
    other = cap()
    assert pair[0] == pair[1] != other
    registered = interner.drain()
    assert [sid for sid, _ in registered] == [pair[0], other]
    line_of = {sid: frames[1] for sid, frames in registered}  # frames[0]: inside cap()
    assert "pair = (cap(), cap())" in line_of[pair[0]] and "other = cap()" in line_of[other]

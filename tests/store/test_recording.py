"""store.recording.clear_recording: removes exactly a recording (the .msprobe store, step{N}
and rank{R} directories) and refuses, removing nothing, whenever anything else is there."""
from __future__ import annotations

import os

import pytest

from store.recording import clear_recording


def _recording(path):
    (path / ".msprobe" / "log").mkdir(parents=True)
    (path / ".msprobe" / "log" / "rank0.1.2.arrows").write_bytes(b"x")
    for d in ("step0/rank", "step12/rank3", "rank", "rank1"):
        (path / d).mkdir(parents=True)
        (path / d / "dump.json").write_text("{}")


def test_removes_the_recording_keeps_the_directory(tmp_path):
    dump = tmp_path / "dump"
    _recording(dump)
    assert clear_recording(dump) is True
    assert dump.is_dir() and list(dump.iterdir()) == []
    assert clear_recording(dump) is False            # empty now
    assert clear_recording(tmp_path / "absent") is False


@pytest.mark.parametrize("extra", ["notes.txt", "mydata", "link", None])
def test_refuses_and_removes_nothing(tmp_path, extra):
    dump = tmp_path / "dump"
    if extra is None:   # a directory of the user's: no .msprobe store
        dump.mkdir()
        (dump / "step0").mkdir()
        message = "holds no msprobe recording"
    else:
        _recording(dump)
        if extra == "notes.txt":
            (dump / extra).write_text("keep")
        elif extra == "mydata":
            (dump / extra).mkdir()
        else:
            os.symlink(tmp_path, dump / "step9")  # a link named like a step directory
            extra = "step9"
        message = f"holds a msprobe recording and other files ({extra})"
    before = sorted(str(p.relative_to(dump)) for p in dump.rglob("*"))
    with pytest.raises(FileExistsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        clear_recording(dump)
    assert sorted(str(p.relative_to(dump)) for p in dump.rglob("*")) == before


def test_a_file_is_refused(tmp_path):
    f = tmp_path / "dump"
    f.write_text("keep")
    with pytest.raises(FileExistsError, match="is not a directory"):
        clear_recording(f)
    assert f.read_text() == "keep"


def test_removes_a_mindspore_kernel_dump(tmp_path):
    """GRAPH_MODE level L2: MindSpore's rank_{id} directories and the kernel dump
    configuration msprobe wrote are part of the recording."""
    dump = tmp_path / "dump"
    _recording(dump)
    (dump / "rank_0" / "Net" / "0" / "0").mkdir(parents=True)
    (dump / "rank_0" / "Net" / "0" / "0" / "MatMul.a.0.0.1.output.0.DefaultFormat.Float32.npy").write_bytes(b"x")
    (dump / "kernel_dump_config.json").write_text("{}")
    assert clear_recording(dump) is True
    assert list(dump.iterdir()) == []


@pytest.mark.parametrize("name", ["rank_0", "kernel_dump_config.json"])
def test_kernel_dump_names_of_the_wrong_kind_are_refused(tmp_path, name):
    dump = tmp_path / "dump"
    _recording(dump)
    if name == "rank_0":
        (dump / name).write_text("a file named like MindSpore's rank directory")
    else:
        (dump / name).mkdir()
    with pytest.raises(FileExistsError, match=f"other files \\({name}\\)"):
        clear_recording(dump)
    assert (dump / name).exists()

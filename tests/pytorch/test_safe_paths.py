"""Safe paths: names that come from user code (module attribute names,
class names) containing ``/``, ``..`` or thousands of characters never create files outside
dump_path; created files are not world-accessible; a dump_path that is a symbolic link is
refused at construction, and a symbolic link planted in place of one of msprobe's own
directories (``step{N}``, ``rank``, ``.msprobe/log``) is refused at write time."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat

import pytest
import torch
import torch.nn as nn

from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.payload import write_pt
from store.export import export_log
from store.tensor_names import read_mapping, tensor_file_path

EVIL = "../../escaped"
LONG = "N" * 5000


def evil_model() -> nn.Module:
    """Submodules whose names and classes hold path separators, ``..`` and 5000 chars."""
    slash_class = type("Evil/../../Class", (nn.Linear,), {})
    long_class = type("C" * 5000, (nn.ReLU,), {})
    model = nn.Module()
    # add_module refuses ".", user code can still put any name into _modules
    model._modules["a/../../b"] = slash_class(3, 3)
    model._modules[LONG] = long_class()
    model._modules["/etc/passwd"] = nn.Linear(3, 1)
    children = list(model.children())
    model.forward = lambda x: children[2](children[1](children[0](x)))
    return model


def every_path(root):
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            yield os.path.join(base, name)


def test_hostile_module_names_stay_inside_dump_path(tmp_path):
    sandbox = tmp_path / "sandbox"
    dump = sandbox / "dump"
    sandbox.mkdir()
    torch.manual_seed(0)
    model = evil_model()
    x = torch.randn(2, 3)
    dbg = PrecisionDebugger(dump_path=str(dump), level="mix")
    for _ in range(2):
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    export_log(dump, sandbox / "offline")
    # nothing outside the two output directories
    assert sorted(os.listdir(sandbox)) == ["dump", "offline"]
    assert sorted(os.listdir(tmp_path)) == ["sandbox"]
    for path in every_path(sandbox):
        name = os.path.basename(path)
        assert len(name.encode()) <= 255, name[:50]
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert not mode & 0o007, (path, oct(mode))  # not world-readable/writable
        assert not os.path.islink(path)
        assert os.path.realpath(path).startswith(str(sandbox) + os.sep)
    # the hostile names are recorded verbatim as JSON keys (they are data, not paths)
    data = json.loads((dump / "step1" / "rank" / "dump.json").read_text())["data"]
    assert "Module.a/../../b.Evil/../../Class.forward.0" in data
    assert f"Module.{LONG}.{'C' * 5000}.forward.0" in data
    assert "Module./etc/passwd.Linear.parameters_grad" in data
    assert json.loads((sandbox / "offline" / "step1" / "rank" / "dump.json").read_text())["data"] == data


def test_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
        dbg.start()
        torch.add(torch.ones(2), 1)
        dbg.stop()
        dbg.step()
        dbg.close()
    finally:
        os.umask(old)
    modes = {os.path.relpath(p, tmp_path): stat.S_IMODE(os.lstat(p).st_mode) for p in every_path(tmp_path)}
    assert modes["d/step0/rank/dump.json"] == 0o640
    assert modes["d/step0"] == 0o750
    assert all(m in (0o640, 0o750) for m in modes.values()), modes


def test_symlinked_dump_path_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"config field `dump_path`: .*is a symbolic link"):
        PrecisionDebugger(dump_path=str(tmp_path / "link"), level="L1")
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        PrecisionDebugger(dump_path=str(tmp_path / "link" / "sub"), level="L1")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("planted", ["step1", "step1/rank", ".msprobe"])
def test_planted_symlink_inside_dump_path_is_not_followed(tmp_path, caplog, planted):
    caplog.set_level(logging.ERROR, logger="msprobe")
    dump, elsewhere = tmp_path / "dump", tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(record):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        dbg = PrecisionDebugger(dump_path=str(dump), level="mix") if record else None
        losses = []
        for step in range(3):
            if record and step == 1 and planted != ".msprobe":
                target = dump / planted
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(elsewhere, target_is_directory=True)
            if dbg:
                dbg.start(model)
            loss = model(torch.randn(2, 3)).sum()
            loss.backward()
            losses.append(loss.detach())
            if dbg:
                dbg.stop()
                dbg.step()
        if dbg:
            dbg.close()
        return losses

    if planted == ".msprobe":  # planted before the log is created
        dump.mkdir()
        (dump / ".msprobe").symlink_to(elsewhere, target_is_directory=True)
    ref = run(False)
    got = run(True)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert os.listdir(elsewhere) == []
    errors = [r.getMessage() for r in caplog.records if r.name == "msprobe"]
    assert len(errors) == 1 and "is a symbolic link" in errors[0], errors


def _tensor_run(tmp_path, name_of_child: str):
    slash_class = type("Evil/../../Class", (nn.Linear,), {})
    model = nn.Module()
    model._modules["a/../../b"] = slash_class(3, 3)
    model._modules[name_of_child] = nn.ReLU()
    children = list(model.children())
    model.forward = lambda x: children[1](children[0](x))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")
    dbg.start(model)
    model(torch.randn(2, 3)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    rank = tmp_path / "d" / "step0" / "rank"
    data = json.loads((rank / "dump.json").read_text())["data"]
    names = []

    def walk(value):
        if isinstance(value, dict):
            if "data_name" in value:
                names.append(value["data_name"])
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(data)
    return rank / "dump_tensor_data", names


def test_tensor_files_of_hostile_names_stay_inside(tmp_path):
    tensor_dir, names = _tensor_run(tmp_path, "relu")
    assert names and all("/" not in n and not n.startswith(".") and ".." not in n for n in names)
    assert sorted(os.listdir(tensor_dir)) == sorted(set(names))
    assert sorted(os.listdir(tmp_path)) == ["d"]
    for path in every_path(tmp_path):
        assert os.path.realpath(path).startswith(str(tmp_path) + os.sep)


def _expected_disk_name(data_name: str) -> str:
    """Hand-written rule of the mapped name: first bytes of the name, 16 hex digits of
    sha256, the extension; 255 bytes in all (ASCII names here)."""
    stem, ext = data_name.rsplit(".", 1)
    tail = "." + hashlib.sha256(data_name.encode()).hexdigest()[:16] + "." + ext
    return data_name[: 255 - len(tail)] + tail


def test_very_long_tensor_file_names_are_mapped(tmp_path):
    tensor_dir, names = _tensor_run(tmp_path, "N" * 300)
    files = os.listdir(tensor_dir)
    assert all(len(n.encode()) <= 255 for n in files)
    long_names = sorted({n for n in names if len(n.encode()) > 255})
    # dump.json keeps the full names: ReLU forward input/output and backward input/output
    prefix = "Module." + "N" * 300 + ".ReLU."
    assert long_names == sorted(prefix + s for s in (
        "forward.0.input.0.pt", "forward.0.output.0.pt", "backward.0.input.0.pt", "backward.0.output.0.pt"))
    expected_csv = "file_name,data_name\n" + "".join(f"{_expected_disk_name(n)},{n}\n" for n in long_names)
    assert (tensor_dir / "mapping.csv").read_text() == expected_csv
    assert stat.S_IMODE(os.lstat(tensor_dir / "mapping.csv").st_mode) == 0o640
    short = sorted({n for n in names if len(n.encode()) <= 255})
    assert sorted(files) == sorted(short + [_expected_disk_name(n) for n in long_names] + ["mapping.csv"])
    assert read_mapping(tensor_dir) == {n: _expected_disk_name(n) for n in long_names}
    # read-back through the mapping: ReLU's input is the Linear's output, its output relu of that
    lin_out = torch.load(tensor_file_path(tensor_dir, "Module.a_______b.Evil_______Class.forward.0.output.0.pt"),
                         weights_only=True)
    relu_in = torch.load(tensor_file_path(tensor_dir, prefix + "forward.0.input.0.pt"), weights_only=True)
    relu_out = torch.load(tensor_file_path(tensor_dir, prefix + "forward.0.output.0.pt"), weights_only=True)
    assert torch.equal(relu_in, lin_out)
    assert torch.equal(relu_out, torch.clamp(lin_out, min=0))
    # backward of sum(): ReLU's output gradient is all ones, its input gradient the 0/1 mask
    g_out = torch.load(tensor_file_path(tensor_dir, prefix + "backward.0.input.0.pt"), weights_only=True)
    g_in = torch.load(tensor_file_path(tensor_dir, prefix + "backward.0.output.0.pt"), weights_only=True)
    assert torch.equal(g_out, torch.ones(2, 3))
    assert torch.equal(g_in, (lin_out > 0).to(g_in.dtype))
    # offline export writes the same names, the same mapping and the same tensors
    dump = tmp_path / "d"
    export_log(dump, tmp_path / "offline", tensor_writers={"pytorch": write_pt})
    offline = tmp_path / "offline" / "step0" / "rank" / "dump_tensor_data"
    assert sorted(os.listdir(offline)) == sorted(files)
    assert (offline / "mapping.csv").read_text() == expected_csv
    for name in files:
        if name != "mapping.csv":
            assert torch.equal(torch.load(offline / name, weights_only=True),
                               torch.load(tensor_dir / name, weights_only=True)), name[:80]
    assert (tmp_path / "offline" / "step0" / "rank" / "dump.json").read_bytes() == \
        (dump / "step0" / "rank" / "dump.json").read_bytes()


def test_tensor_file_path_refuses_path_names(tmp_path):
    with pytest.raises(ValueError, match="not a file name"):
        tensor_file_path(tmp_path, "../x.pt")
    assert tensor_file_path(tmp_path, "a.pt") == tmp_path / "a.pt"  # no mapping.csv: the name itself


@pytest.mark.parametrize("name, entry_start", [
    ("a/../../escaped", "a_______escaped.0.tensor"),
    ("../../../etc/passwd", "_________etc_passwd.0.tensor"),
    ("..", "__.0.tensor"),
    ("S" * 5000, "S" * 5000 + ".0.tensor"),
])
def test_debug_save_hostile_names_stay_inside(tmp_path, name, entry_start):
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    dump = sandbox / "dump"
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(dump), level="debug", task="tensor")
    y = x * 2
    PrecisionDebugger.save(y, name)
    y.sum().backward()
    dbg.close()
    assert sorted(os.listdir(tmp_path)) == ["sandbox"] and os.listdir(sandbox) == ["dump"]
    for path in every_path(dump):
        assert len(os.path.basename(path).encode()) <= 255
        assert not os.path.islink(path)
        assert os.path.realpath(path).startswith(str(dump) + os.sep)
    doc = json.loads((dump / "rank" / "debug.json").read_text())
    assert sorted(doc["data"]) == sorted([f"{name}.0", f"{name}_grad.0"])  # names kept verbatim as keys
    tdir = dump / "rank" / "dump_tensor_data"
    data_name = doc["data"][f"{name}.0"]["data_name"]
    grad_name = doc["data"][f"{name}_grad.0"]["data_name"]
    assert data_name == entry_start + ".pt"
    assert torch.equal(torch.load(tensor_file_path(tdir, data_name), weights_only=True),
                       torch.tensor([2.0, -4.0, 6.0]))
    assert torch.equal(torch.load(tensor_file_path(tdir, grad_name), weights_only=True), torch.ones(3))
    if len(data_name) > 255:
        assert read_mapping(tdir) == {n: _expected_disk_name(n) for n in (data_name, grad_name)}
    else:
        assert not (tdir / "mapping.csv").exists()

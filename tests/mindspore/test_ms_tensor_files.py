"""MindSpore task tensor through the payload store: .npy values, long names, offline export."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import load_dump, tensor_records  # noqa: E402
from msprobe.cli import main  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from store.tensor_names import MAPPING_FILE, tensor_file_path  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

TDIR = Path("step0") / "rank" / "dump_tensor_data"


def _bits(a: np.ndarray) -> bytes:
    """dtype, shape and raw bytes: equal only when the arrays are equal bit for bit."""
    return repr((a.dtype.str, a.shape)).encode() + a.tobytes(order="C")


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_npy_equals_asnumpy_bit_for_bit(tmp_path):
    rng = np.random.default_rng(7)
    values = {
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f16": np.array([np.inf, -0.0, 65504.0, np.nan], np.float16),
        "f64": rng.standard_normal(4),
        "i32": np.array([[-(2 ** 31), 2 ** 31 - 1]], np.int32),
        "u8": np.array([0, 255, 7], np.uint8),
        "bool": np.array([True, False, True]),
        "c64": np.array([1 + 2j, -3.5j], np.complex64),
        "scalar": np.array(-2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    tensors = {k: Tensor(v) for k, v in values.items()}
    bf = Tensor(np.array([1.5, -2.0, 0.0078125, 3.0e38], np.float32)).astype(ms.bfloat16)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task="tensor")
    dbg.start()
    for t in tensors.values():
        ops.abs(t) if t.dtype not in (ms.bool_,) else ops.logical_not(t)
    ops.neg(bf)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    tdir = tmp_path / "d" / TDIR
    names = sorted(k for k in data if k.startswith(("Functional.abs", "Functional.logical_not")))
    assert len(names) == len(tensors)
    checked = 0
    for name in names:
        rec = data[name]["input_args"][0]
        n = name.split(".")
        assert rec["data_name"] == f"{n[0]}.{n[1]}.{n[2]}.forward.input.0.npy"
        loaded = np.load(tdir / rec["data_name"], allow_pickle=False)
        # the recorded input is one of the tensors: find it by its bytes
        matches = [k for k, t in tensors.items() if _bits(t.asnumpy()) == _bits(loaded)]
        assert len(matches) == 1, (name, loaded)
        out = np.load(tdir / data[name]["output"][0]["data_name"])
        expected = np.logical_not(values[matches[0]]) if matches[0] == "bool" else np.abs(values[matches[0]])
        assert _bits(out) == _bits(expected.astype(out.dtype)) or np.array_equal(out, expected, equal_nan=True)
        checked += 1
    assert checked == len(tensors)
    rec = data["Functional.neg.0.forward"]
    assert rec["input_args"][0]["dtype"] == "BFloat16"
    bf_in = np.load(tdir / rec["input_args"][0]["data_name"])
    assert bf_in.dtype == np.float32
    assert _bits(bf_in) == _bits(bf.asnumpy().astype(np.float32))
    # bf16 → float32 is exact: the bf16 bits are the high half of the float32 bits
    hi = bf_in.view(np.uint32)
    assert np.all(hi & 0xFFFF == 0)
    np.testing.assert_array_equal(np.load(tdir / rec["output"][0]["data_name"]), -bf_in)


def test_inplace_input_recorded_before_the_call(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task="tensor")
    dbg.start()
    u = Tensor(np.array([3.0, -1.0], np.float32))
    u.copy_(Tensor(np.array([8.0, 9.0], np.float32)))
    dbg.stop()
    dbg.close()
    rec = load_dump(tmp_path / "d")[0]["data"]["Tensor.copy_.0.forward"]
    tdir = tmp_path / "d" / TDIR
    np.testing.assert_array_equal(np.load(tdir / rec["input_args"][0]["data_name"]), [3.0, -1.0])
    np.testing.assert_array_equal(np.load(tdir / rec["output"][0]["data_name"]), [8.0, 9.0])
    np.testing.assert_array_equal(u.asnumpy(), [8.0, 9.0])


class _Long(nn.Cell):
    def __init__(self, attr: str) -> None:
        super().__init__()
        setattr(self, attr, nn.Dense(2, 2))
        self.attr = attr

    def construct(self, x):
        return getattr(self, self.attr)(x)


LONG = "layer_" + "x" * 250


def _long_run(dump: Path) -> tuple[Tensor, nn.Cell]:
    net = _Long(LONG)
    w = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
    getattr(net, LONG).weight.set_data(Tensor(w))
    getattr(net, LONG).bias.set_data(Tensor(np.array([0.25, -0.5], np.float32)))
    x = Tensor(np.array([[1.0, 2.0]], np.float32))
    dbg = PrecisionDebugger(dump_path=str(dump), level="L0", task="tensor")
    dbg.start(net)
    net(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    return x, net


def test_long_cell_name_gets_short_file_and_mapping_row(tmp_path):
    x, _net = _long_run(tmp_path / "d")
    data = load_dump(tmp_path / "d")[0]["data"]
    entry = f"Cell.{LONG}.Dense.forward.0"
    full = f"{entry}.input.0.npy"
    assert data[entry]["input_args"][0]["data_name"] == full  # dump.json keeps the full name
    tdir = tmp_path / "d" / TDIR
    rows = list(csv.reader((tdir / MAPPING_FILE).read_text().splitlines()))
    assert rows[0] == ["file_name", "data_name"]
    mapping = {d: f for f, d in rows[1:]}
    short = mapping[full]
    assert len(short.encode()) <= 255 and short.endswith(".npy") and short != full
    assert full not in {p.name for p in tdir.iterdir()}
    np.testing.assert_array_equal(np.load(tdir / short), x.asnumpy())
    assert tensor_file_path(tdir, full) == tdir / short
    out_name = data[entry]["output"][0]["data_name"]
    np.testing.assert_array_equal(np.load(tensor_file_path(tdir, out_name)),
                                  [[1.0 * 1 + 2.0 * -2 + 0.25, 1.0 * 0.5 + 2.0 * 4 - 0.5]])
    # every long data_name is mapped, every mapped file exists
    assert set(mapping) == {r["data_name"] for r in tensor_records(data) if len(r["data_name"].encode()) > 255}
    assert all((tdir / f).is_file() for f in mapping.values())


@pytest.mark.parametrize("level", ["mix", "debug"])
def test_offline_export_writes_identical_npy_files(tmp_path, capsys, level):
    dump, other = tmp_path / "d", tmp_path / "other"
    if level == "debug":
        dbg = PrecisionDebugger(dump_path=str(dump), level="debug", task="tensor")

        def f(t):
            y = t * 2.0
            PrecisionDebugger.save(y, "y")
            # names are cut to 200 characters; the dict key makes the file name longer
            PrecisionDebugger.save({"k" * 80: y}, "y_" + "z" * 198, save_backward=False)
            return (y * y).sum()

        ms.grad(f)(Tensor(np.array([1.0, -2.0], np.float32)))
        dbg.close()
        rel = Path("rank") / "dump_tensor_data"
    else:
        _long_run(dump)
        rel = TDIR
    live = _files(dump / rel)
    assert MAPPING_FILE in live and len(live) >= 4
    assert main(["export", str(dump), "--out", str(other)]) == 0
    capsys.readouterr()
    assert _files(other / rel) == live
    json_name = "debug.json" if level == "debug" else "dump.json"
    live_doc = json.loads((dump / rel.parent / json_name).read_text())
    other_doc = json.loads((other / rel.parent / json_name).read_text())
    assert live_doc["data"] == other_doc["data"]


def test_save_grad_files_of_sanitised_keys_are_distinct(tmp_path, capsys):
    """``d_grad.0``'s gradients arrive one by one: keys "a/b" and "a_b" both sanitise to
    ``a_b``; each gradient gets its own file, named like its saved tensor's (before, both
    records named ``d_grad.0.tensor.a_b.npy``, holding the gradient that came last)."""
    dump = tmp_path / "d"
    dbg = PrecisionDebugger(dump_path=str(dump), level="debug", task="tensor")

    def f(a, b):
        x, y = a * 1.0, b * 1.0
        PrecisionDebugger.save({"a/b": x, "a_b": y}, "d")
        return (3 * x).sum() + (5 * y).sum()

    ms.grad(f, grad_position=(0, 1))(Tensor(np.array([1.0, 2.0], np.float32)),
                                      Tensor(np.array([3.0, 4.0], np.float32)))
    dbg.close()
    rank = dump / "rank"
    data = json.loads((rank / "debug.json").read_text())["data"]
    tdir = rank / "dump_tensor_data"
    expected = {("d.0", "a/b"): ("d.0.tensor.a_b.npy", [1.0, 2.0]),
                ("d.0", "a_b"): ("d.0.tensor.a_b-2.npy", [3.0, 4.0]),
                ("d_grad.0", "a/b"): ("d_grad.0.tensor.a_b.npy", [3.0, 3.0]),
                ("d_grad.0", "a_b"): ("d_grad.0.tensor.a_b-2.npy", [5.0, 5.0])}
    for (entry, key), (name, values) in expected.items():
        rec = data[entry][key]
        assert rec["data_name"] == name
        assert rec["Max"] == max(values)
        np.testing.assert_array_equal(np.load(tdir / name), np.array(values, np.float32))
    assert main(["export", str(dump), "--out", str(tmp_path / "other")]) == 0
    capsys.readouterr()
    assert _files(tmp_path / "other" / "rank" / "dump_tensor_data") == _files(tdir)

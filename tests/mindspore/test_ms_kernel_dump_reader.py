"""The kernel-dump reader on hand-made dumps in MindSpore's layout (no MindSpore needed):
file names, statistic.csv (the GPU/Ascend statistic dump), order, repeats, data_mode, md5."""
from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from msprobe.kernel_dump.ingest import KernelSettings, ingest_kernel_dump, read_settings, write_settings
from msprobe.kernel_dump.layout import parse_file_name
from msprobe.kernel_dump.statistic_csv import read_statistic_csv
from store.query import query

HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,"
          "Max Value,Min Value,Avg Value,Count,NaN Count,Negative Inf Count,Positive Inf Count,L2Norm Value")
ORDER = ["Default/net/d1-Dense/MatMul-op0", "Default/net/relu-ReLU/ReLU-op0",
         "Gradients/Default/net/relu-ReLU/Grad_ReLU/ReluGrad-op0"]


def _exec_order(root: Path, rank: int = 0, graph: int = 0, order=ORDER) -> None:
    d = root / f"rank_{rank}" / "execution_order"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"ms_execution_order_graph_{graph}.csv").write_text("NodeExecutionOrder-FullNameWithScope\n"
                                                             + "\n".join(order) + "\n")


def _npy(it_dir: Path, op_type: str, scope: str, ts: int, io: str, slot: int, a: np.ndarray, dtype: str) -> Path:
    it_dir.mkdir(parents=True, exist_ok=True)
    f = it_dir / f"{op_type}.{scope.replace('/', '_')}.0.0.{ts}.{io}.{slot}.DefaultFormat.{dtype}.npy"
    np.save(f, a)
    return f


def test_parse_file_name():
    f = parse_file_name("MatMul.Default_net-Net_d1-Dense_MatMul-op0.3.1.1796617820042075.input.1."
                        "DefaultFormat.Float32.npy")
    assert (f.op_type, f.op_name, f.task_id, f.stream_id, f.timestamp, f.io, f.slot, f.fmt, f.dtype) == (
        "MatMul", "Default_net-Net_d1-Dense_MatMul-op0", "3", "1", 1796617820042075, "input", 1, "DefaultFormat",
        "Float32")
    p = parse_file_name("Parameter.d1_weight.0.0.17966.output.0.DefaultFormat.Float32.npy")
    assert (p.op_type, p.op_name, p.io) == ("Parameter", "d1_weight", "output")
    for bad in ("statistic.csv", "x.npy", "MatMul.a.0.0.1.inout.0.DefaultFormat.Float32.npy",
                "MatMul.a.0.0.t.input.0.DefaultFormat.Float32.npy"):
        assert parse_file_name(bad) is None


STAT_CSV = HEADER + """
MatMul,Default/net/d1-Dense/MatMul-op0,1,0,100,input,0,80,float32,"(5,4)",2.5,-1.25,0.125,20,0,0,0,3.75
MatMul,Default/net/d1-Dense/MatMul-op0,1,0,101,output,0,60,float32,"(5,3)",nan,-7,nan,15,2,0,1,nan
ReluGrad,Gradients/Default/net/relu-ReLU/Grad_ReLU/ReluGrad-op0,3,0,103,output,0,60,float16,"(5,3)",1,0,0.5,15,0,0,0,2
ReLU,Default/net/relu-ReLU/ReLU-op0,2,0,102,input,0,2,bool,(),1,1,1,1,0,0,0,1
"""


def test_statistic_csv_rows_reach_the_views(tmp_path):
    it = tmp_path / "rank_0" / "Net" / "0" / "3"
    it.mkdir(parents=True)
    (it / "statistic.csv").write_text(STAT_CSV)
    _exec_order(tmp_path)
    report = ingest_kernel_dump(tmp_path, KernelSettings(task="statistics"))
    assert (report.calls, report.tensors, report.steps) == (3, 4, {0: [3]})
    rows = query(tmp_path, "SELECT step, name, api_type, direction, io, arg, dtype, shape, numel, max, min, mean, "
                           "norm, has_nan, has_inf, data_name FROM tensors ORDER BY seq, io, arg").to_pylist()
    assert [(r["name"], r["io"]) for r in rows] == [
        ("Kernel.0.Default/net/d1-Dense/MatMul-op0.0", "input"),
        ("Kernel.0.Default/net/d1-Dense/MatMul-op0.0", "output"),
        ("Kernel.0.Default/net/relu-ReLU/ReLU-op0.0", "input"),
        ("Kernel.0.Gradients/Default/net/relu-ReLU/Grad_ReLU/ReluGrad-op0.0", "output")]
    first, out, relu, grad = rows
    assert {r["step"] for r in rows} == {3}
    assert tuple(first[k] for k in ("dtype", "shape", "numel", "max", "min", "mean", "norm")) == \
        ("Float32", [5, 4], 20, 2.5, -1.25, 0.125, 3.75)
    assert tuple(first[k] for k in ("has_nan", "has_inf", "data_name", "direction")) == (False, False, None, "forward")
    assert out["has_nan"] is True and out["has_inf"] is True and out["min"] == -7.0
    assert (relu["dtype"], relu["shape"], relu["numel"]) == ("Bool", [], 1)
    assert (grad["dtype"], grad["direction"], grad["api_type"]) == ("Float16", "backward", "ReluGrad")
    parents = query(tmp_path, "SELECT parent FROM calls ORDER BY seq").column("parent").to_pylist()
    assert parents == ["Default/net/d1-Dense", "Default/net/relu-ReLU", "Gradients/Default/net/relu-ReLU/Grad_ReLU"]


@pytest.mark.parametrize(("text", "message"), [
    ("Op Type,Op Name,IO,Slot,Data Type\nMatMul,a,input,0,float32\n", "missing column\\(s\\) Shape"),
    (HEADER + "\nMatMul,a,1,0,1,in,0,4,float32,(1),1,1,1,1,0,0,0,1\n", "line 2: IO 'in'"),
    (HEADER + "\nMatMul,a,1,0,1,input,0,4,float32,1x2,1,1,1,1,0,0,0,1\n", "line 2: Shape '1x2'"),
])
def test_malformed_statistic_csv_is_a_clear_error(tmp_path, text, message):
    f = tmp_path / "statistic.csv"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_statistic_csv(f)


def test_statistic_csv_without_optional_columns(tmp_path):
    f = tmp_path / "statistic.csv"
    f.write_text("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,"
                 "L2Norm Value\nAdd,Default/Add-op1,0,0,5,output,0,24,Float32,\"(2, 3)\",inf,1,inf\n")
    (r,) = read_statistic_csv(f)
    assert (r.shape, r.numel, r.max, r.min, r.mean, r.norm, r.has_nan, r.has_inf) == (
        (2, 3), 6, float("inf"), 1.0, None, float("inf"), False, True)


def _tensor_dump(root: Path) -> dict:
    """Iteration 0 of graph 0: MatMul (inputs, output), ReLU run twice (a loop), a kernel
    missing from the execution order, ReluGrad, and a parameter."""
    it = root / "rank_0" / "Net" / "0" / "0"
    rng = np.random.default_rng(3)
    arrays = {
        "x": rng.standard_normal((5, 4)).astype(np.float32), "w": rng.standard_normal((3, 4)).astype(np.float32),
        "r0": rng.standard_normal((5, 3)).astype(np.float32), "r1": rng.standard_normal((5, 3)).astype(np.float16),
        "g": rng.standard_normal((5, 3)).astype(np.float32), "p": rng.standard_normal((3, 4)).astype(np.float32),
        "c": np.array([1, 2, 3], np.int64),
    }
    arrays["y"] = arrays["x"] @ arrays["w"].T
    _npy(it, "MatMul", ORDER[0], 10, "input", 0, arrays["x"], "Float32")
    _npy(it, "MatMul", ORDER[0], 11, "input", 1, arrays["w"], "Float32")
    _npy(it, "MatMul", ORDER[0], 12, "output", 0, arrays["y"], "Float32")
    _npy(it, "ReLU", ORDER[1], 30, "output", 0, arrays["r1"], "Float16")   # second run, later time stamp
    _npy(it, "ReLU", ORDER[1], 20, "output", 0, arrays["r0"], "Float32")
    _npy(it, "Cast", "Default/extra/Cast-op9", 5, "output", 0, arrays["c"], "Int64")
    _npy(it, "ReluGrad", ORDER[2], 40, "output", 0, arrays["g"], "Float32")
    _npy(it, "Parameter", "d1_weight", 50, "output", 0, arrays["p"], "Float32")
    _exec_order(root)
    return arrays


def test_tensor_dump_order_repeats_parameters_and_md5(tmp_path):
    arrays = _tensor_dump(tmp_path)
    write_settings(tmp_path, KernelSettings(task="tensor", summary_mode="md5"))
    assert read_settings(tmp_path) == KernelSettings(task="tensor", summary_mode="md5")
    ingest_kernel_dump(tmp_path)
    rows = query(tmp_path, "SELECT name, api_type, io, arg, max, crc32, data_name FROM tensors "
                           "ORDER BY seq, io, arg").to_pylist()
    assert [(r["name"], r["io"], r["arg"]) for r in rows] == [
        ("Kernel.0.Default/net/d1-Dense/MatMul-op0.0", "input", "0"),
        ("Kernel.0.Default/net/d1-Dense/MatMul-op0.0", "input", "1"),
        ("Kernel.0.Default/net/d1-Dense/MatMul-op0.0", "output", "0"),
        ("Kernel.0.Default/net/relu-ReLU/ReLU-op0.0", "output", "0"),
        ("Kernel.0.Default/net/relu-ReLU/ReLU-op0.1", "output", "0"),
        ("Kernel.0.Gradients/Default/net/relu-ReLU/Grad_ReLU/ReluGrad-op0.0", "output", "0"),
        ("Kernel.0.Default_extra_Cast-op9.0", "output", "0"),      # not in the execution order: after it
        ("Parameter.0.d1_weight.0", "parameters", "d1_weight"),    # parameters last
    ]
    expect = [arrays[k] for k in ("x", "w", "y", "r0", "r1", "g", "c", "p")]
    for r, a in zip(rows, expect):
        assert r["max"] == float(a.astype(np.float64).max())
        assert r["crc32"] == format(zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF, "08x")
        np.testing.assert_array_equal(np.load(tmp_path / r["data_name"]), a)


@pytest.mark.parametrize(("data_mode", "expect"), [
    (["backward"], {("ReluGrad", "output")}),
    (["input"], {("MatMul", "input"), ("Parameter", "parameters")}),
    (["forward", "output"], {("MatMul", "output"), ("ReLU", "output"), ("Cast", "output")}),
])
def test_data_mode_selects_kernels_and_sides(tmp_path, data_mode, expect):
    _tensor_dump(tmp_path)
    ingest_kernel_dump(tmp_path, KernelSettings(data_mode=tuple(data_mode)))
    got = query(tmp_path, "SELECT DISTINCT api_type, io FROM tensors").to_pylist()
    assert {(r["api_type"], r["io"]) for r in got} == expect


def test_ranks_outside_the_config_are_not_read(tmp_path):
    _tensor_dump(tmp_path)
    shutil.copytree(tmp_path / "rank_0", tmp_path / "rank_1", dirs_exist_ok=True)
    report = ingest_kernel_dump(tmp_path, KernelSettings(ranks=(1,)))
    assert report.steps == {1: [0]}
    assert query(tmp_path, "SELECT DISTINCT rank FROM calls").column("rank").to_pylist() == [1]


def test_unreadable_npy_is_skipped_and_reported(tmp_path):
    _tensor_dump(tmp_path)
    it = tmp_path / "rank_0" / "Net" / "0" / "0"
    bad = it / "Add.Default_net_Add-op7.0.0.60.output.0.DefaultFormat.Float32.npy"
    bad.write_bytes(b"not an npy file")
    report = ingest_kernel_dump(tmp_path)
    assert len(report.skipped) == 1 and report.skipped[0].startswith(str(bad))
    names = query(tmp_path, "SELECT name FROM calls").column("name").to_pylist()
    assert len(names) == 6 and not any("Add-op7" in n for n in names)   # the 6 readable kernels


@pytest.mark.parametrize("command", ["export", "compare"])
def test_malformed_statistic_csv_fails_the_command_with_its_message(tmp_path, capsys, command):
    from msprobe.cli import main

    it = tmp_path / "kd" / "rank_0" / "Net" / "0" / "0"
    it.mkdir(parents=True)
    (it / "statistic.csv").write_text("Op Type,Op Name,IO,Slot,Data Type\nMatMul,a,input,0,float32\n")
    argv = [command, str(tmp_path / "kd")] + ([str(tmp_path / "kd"), "-o", str(tmp_path / "out")]
                                              if command == "compare" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"msprobe {command}: error: ") and "missing column(s) Shape" in err
    assert "Traceback" not in err


def test_files_of_an_earlier_run_in_the_dump_path_are_left_out(tmp_path, caplog):
    """MindSpore writes a second run's files beside the first run's in the same iteration
    directories: a reader made with new_files_only reads only the second run's, also for
    iterations that the first run reached and the second has not yet."""
    from msprobe.kernel_dump.ingest import KernelDumpReader

    rng = np.random.default_rng(5)
    old = {i: rng.standard_normal((5, 4)).astype(np.float32) for i in range(3)}
    new = {i: rng.standard_normal((5, 4)).astype(np.float32) for i in range(2)}
    its = [tmp_path / "rank_0" / "Net" / "0" / str(i) for i in range(3)]
    for i, a in old.items():                   # the earlier run: iterations 0, 1, 2
        _npy(its[i], "MatMul", ORDER[0], 100 + i, "output", 0, a, "Float32")
    _exec_order(tmp_path)
    write_settings(tmp_path, KernelSettings())
    with caplog.at_level("WARNING", logger="msprobe"):
        reader = KernelDumpReader(tmp_path, new_files_only=True)
    assert "3 kernel dump files of an earlier run" in caplog.text
    _npy(its[0], "MatMul", ORDER[0], 200, "output", 0, new[0], "Float32")
    reader.read()                              # iteration 0 is this run's newest: not finished
    _npy(its[1], "MatMul", ORDER[0], 201, "output", 0, new[1], "Float32")
    reader.read()                              # iteration 0 finished; 1 (and the old 2) not read
    report = reader.close()
    assert report.steps == {0: [0, 1]} and report.calls == 2
    rows = query(tmp_path, "SELECT step, name, max, norm FROM tensors ORDER BY step").to_pylist()
    assert [(r["step"], r["name"]) for r in rows] == [(0, f"Kernel.0.{ORDER[0]}.0"), (1, f"Kernel.0.{ORDER[0]}.0")]
    for r in rows:
        a = new[r["step"]].astype(np.float64)
        assert r["max"] == a.max() and r["norm"] == pytest.approx(np.sqrt((a * a).sum()), rel=1e-12)


def test_tensorboard_export_reads_a_kernel_dump_without_a_log(tmp_path, capsys):
    """``msprobe export DUMP --tensorboard DIR`` on a kernel dump MindSpore wrote alone:
    read into the log first, then the forward MatMul output's Norm as a scalar of step 0."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from msprobe.cli import main

    arrays = _tensor_dump(tmp_path / "kd")
    assert main(["export", str(tmp_path / "kd"), "--tensorboard", str(tmp_path / "tb")]) == 0
    # MatMul, ReLU twice, Cast, ReluGrad, the parameter: 6 calls; 3 + 1 + 1 + 1 + 1 + 1 tensors
    assert capsys.readouterr().out.startswith("read 6 kernels (8 tensors)")
    acc = ea.EventAccumulator(str(tmp_path / "tb" / "rank0"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    matmul = [t for t in acc.Tags()["scalars"] if t.startswith("output_norm/") and "MatMul" in t]
    assert len(matmul) == 1
    (event,) = acc.Scalars(matmul[0])
    y = arrays["y"].astype(np.float64)
    assert event.step == 0 and event.value == pytest.approx(np.sqrt((y * y).sum()), rel=1e-6)


def test_export_that_fails_half_way_leaves_no_partial_log(tmp_path, capsys):
    """A kernel dump whose second iteration has a malformed statistic.csv: ``msprobe
    export`` fails with the message and leaves no log (a later export would otherwise take
    the first iteration for the whole recording); once the file is right, both iterations
    are read."""
    from msprobe.cli import main
    from store import schema as S
    from store.errors import LogNotFoundError
    from store.log_reader import find_log_files

    dump = tmp_path / "kd"
    for iteration in ("0", "1"):
        it = dump / "rank_0" / "Net" / "0" / iteration
        it.mkdir(parents=True)
        (it / "statistic.csv").write_text(STAT_CSV)
    bad = dump / "rank_0" / "Net" / "0" / "1" / "statistic.csv"
    bad.write_text("Op Type,Op Name,IO,Slot,Data Type\nMatMul,a,input,0,float32\n")
    assert main(["export", str(dump), "-o", str(tmp_path / "out")]) == 2
    assert "missing column(s) Shape" in capsys.readouterr().err
    with pytest.raises(LogNotFoundError):
        find_log_files(dump)
    assert [p.name for p in (dump / S.STORE_DIR).iterdir() if p.name.startswith("ingest-")] == []
    bad.write_text(STAT_CSV)
    assert main(["export", str(dump), "-o", str(tmp_path / "out")]) == 0
    steps = query(dump, "SELECT step, count(*) AS n FROM tensors GROUP BY step ORDER BY step").to_pylist()
    assert steps == [{"step": 0, "n": 4}, {"step": 1, "n": 4}]


def test_compare_of_two_statistic_dumps_names_the_changed_kernel(tmp_path):
    """Two statistic dumps (GPU/Ascend ``saved_data: "statistic"``, hand-made) that differ
    in ReluGrad's output Max (1 -> 1.5) and L2Norm (2 -> 2.2): compare runs in statistics
    mode, passes the other kernels and names ReluGrad, with the differences of the two
    files' values."""
    from msprobe.cli import main
    from msprobe.compare import compare

    row = 'ReluGrad,Gradients/Default/net/relu-ReLU/Grad_ReLU/ReluGrad-op0,3,0,103,output,0,60,float16,"(5,3)",'
    assert STAT_CSV.count(row + "1,0,0.5,15,0,0,0,2\n") == 1
    for name, text in (("base", STAT_CSV), ("changed", STAT_CSV.replace(row + "1,0,0.5,15,0,0,0,2\n",
                                                                         row + "1.5,0,0.5,15,0,0,0,2.2\n"))):
        it = tmp_path / name / "rank_0" / "Net" / "0" / "0"
        it.mkdir(parents=True)
        (it / "statistic.csv").write_text(text)
        _exec_order(tmp_path / name)
    result = compare(tmp_path / "changed", tmp_path / "base", out=tmp_path / "cmp")
    assert (result.summary["verdict"], result.summary["mode"]) == ("diverged", "statistics")
    rank = result.summary["ranks"][0]
    assert rank["counts"] == {"pass": 2, "propagated": 0, "origin": 1, "unpaired": 0}
    origin = rank["first_origin"]
    assert (origin["name"], origin["step"], origin["direction"], origin["kind"]) == (
        f"Kernel.0.{ORDER[2]}.0", 0, "backward", "kernel")
    cols = result.tensors.columns
    (diff,) = [r for r in result.tensors.filter("verdict != 'identical'").fetchall()]
    assert diff[cols.index("max_diff")] == 1.5 - 1.0
    assert diff[cols.index("norm_diff")] == pytest.approx(2.2 - 2.0, rel=1e-12)
    assert main(["compare", str(tmp_path / "changed"), str(tmp_path / "base"), "-o", str(tmp_path / "cli")]) == 1

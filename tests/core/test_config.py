"""Tests of msprobe.core.config: precedence, defaults and every validation (spec 5, 9)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msprobe.core import Config, ConfigError, MsprobeError, load_config
from msprobe.core.config import DEFAULT_CONFIG_PATH

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, doc: Any, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.fixture
def dump_dir(tmp_path: Path) -> str:
    return str(tmp_path / "dump")


@pytest.fixture
def make(tmp_path: Path, dump_dir: str):
    """Write a config with a valid dump_path plus ``fields`` and return its path."""

    def _make(**fields: Any) -> str:
        doc = {"dump_path": dump_dir, **fields}
        return write_config(tmp_path, doc)

    return _make


# --- errors -------------------------------------------------------------------------------


def test_config_error_message_and_attributes():
    err = ConfigError("task", "tensors", ("statistics", "tensor", "structure"))
    assert str(err) == "config field `task`: got 'tensors'; allowed: statistics, tensor, structure"
    assert (err.field, err.value, err.allowed) == ("task", "tensors", ("statistics", "tensor", "structure"))
    assert isinstance(err, MsprobeError) and isinstance(err, ValueError)
    detailed = ConfigError("step", -1, "ints", detail="value out of range")
    assert str(detailed) == "config field `step`: got -1; allowed: ints; value out of range"
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and copy.field == "task"


def test_config_error_long_value_is_shortened():
    err = ConfigError("list", "x" * 1000, "strings")
    assert len(str(err)) < 200 and "..." in str(err)


# --- defaults and precedence --------------------------------------------------------------


def test_packaged_default_config():
    assert DEFAULT_CONFIG_PATH == REPO_ROOT / "msprobe" / "config.json"
    cfg = load_config()
    assert cfg == Config(
        task="statistics",
        dump_path="./dump_path",
        rank=(),
        step=(),
        level="mix",
        async_dump=False,
        scope=(),
        list=(),
        data_mode=("all",),
        summary_mode="statistics",
        file_format="npy",
        framework="pytorch",
    )


def test_root_and_packaged_config_are_identical():
    assert (REPO_ROOT / "config.json").read_bytes() == (REPO_ROOT / "msprobe" / "config.json").read_bytes()
    doc = json.loads((REPO_ROOT / "config.json").read_text())
    assert doc["level"] == "mix" and doc["task"] == "statistics"


def test_config_is_frozen_and_slotted():
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.task = "tensor"  # type: ignore[misc]
    assert not hasattr(cfg, "__dict__")


def test_minimal_file_uses_builtin_defaults(make, dump_dir):
    cfg = load_config(make())
    assert cfg.task == "statistics"  # spec 9 fix 18: missing task → statistics
    assert cfg.level == "L1"  # spec 5.1 built-in default
    assert cfg.dump_path == dump_dir
    assert (cfg.rank, cfg.step, cfg.scope, cfg.list) == ((), (), (), ())
    assert cfg.data_mode == ("all",)
    assert (cfg.summary_mode, cfg.file_format, cfg.async_dump) == ("statistics", "npy", False)


def test_arguments_override_file(make, tmp_path):
    path = make(task="statistics", level="L0", step=[1], tensor={"list": ["relu"], "file_format": "bin"})
    other = str(tmp_path / "other")
    cfg = load_config(path, task="tensor", dump_path=other, level="L1", step=[5, "7-8"], framework="mindspore")
    assert (cfg.task, cfg.dump_path, cfg.level, cfg.step) == ("tensor", other, "L1", (5, 7, 8))
    assert cfg.framework == "mindspore"
    # the task argument selects the sub-object that is read (spec 5.2)
    assert (cfg.list, cfg.file_format) == (("relu",), "bin")


def test_file_overrides_builtin_defaults(make):
    cfg = load_config(make(task="tensor", level="L0", step=[3], rank=[1]))
    assert (cfg.task, cfg.level, cfg.step, cfg.rank) == ("tensor", "L0", (3,), (1,))


def test_empty_step_argument_overrides_file(make):
    assert load_config(make(step=[1, 2]), step=[]).step == ()


def test_only_effective_task_subobject_is_read(make):
    path = make(
        task="statistics",
        statistics={"list": ["a"], "summary_mode": "md5", "data_mode": ["forward"]},
        tensor={"list": ["b"], "data_mode": ["backward"], "file_format": "bin"},
    )
    stats = load_config(path)
    assert (stats.list, stats.summary_mode, stats.data_mode, stats.file_format) == (
        ("a",), "md5", ("forward",), "npy",
    )
    tensor = load_config(path, task="tensor")
    assert (tensor.list, tensor.summary_mode, tensor.data_mode, tensor.file_format) == (
        ("b",), "statistics", ("backward",), "bin",
    )


def test_invalid_options_of_other_task_are_not_read(make):
    # only the effective task's sub-object is validated
    path = make(task="statistics", tensor={"file_format": "pt", "data_mode": "bad"})
    assert load_config(path).task == "statistics"


def test_unread_keys_of_the_task_object_are_named_in_a_warning(make, caplog):
    """Upstream 26.x keys msprobe does not implement (``slice``, ``request_id``) and typos
    are named; the keys msprobe reads are not."""
    with caplog.at_level(logging.WARNING, logger="msprobe.core.config"):
        cfg = load_config(make(task="tensor", tensor={"slice": [{"dim": 0, "begin": 0, "end": 2}], "lsit": [],
                                                      "request_id": "r1", "summary_mode": "md5", "list": []}))
    assert cfg.summary_mode == "md5"
    for key in ("tensor.slice", "tensor.lsit", "tensor.request_id"):
        assert f"{key} is not read by msprobe" in caplog.text
    assert "tensor.list" not in caplog.text and "summary_mode" not in caplog.text


def test_structure_with_l1_becomes_mix(make, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe.core.config"):
        cfg = load_config(make(task="structure", level="L1"))
    assert (cfg.task, cfg.level) == ("structure", "mix")
    assert "mix" in caplog.text
    assert load_config(make(task="structure"), level="L1").level == "mix"
    assert load_config(make(task="structure", level="L0")).level == "L0"


def test_unknown_top_level_keys_are_ignored(make):
    cfg = load_config(
        make(enable_dataloader=False, is_deterministic=True, overflow_check={"x": 1}, free_benchmark={},
             run_ut={}, grad_probe={}, acc_check=[], something_else=None)
    )
    assert cfg.task == "statistics"


@pytest.mark.parametrize("typo, key", [("levle", "level"), ("LEVEL", "level"), ("statistcs", "statistics"),
                                       ("stpe", "step"), ("tsak", "task")])
def test_misspelt_recording_key_is_an_error_naming_the_key(make, typo, key):
    """A misspelling of a key that changes what is recorded fails at load time
    ("did you mean"), instead of recording with that key's default."""
    with pytest.raises(ConfigError, match=rf"config field `{typo}`: .*did you mean `{key}`\?") as info:
        load_config(make(**{typo: "L0" if key == "level" else {}}))
    assert info.value.field == typo


def test_misspelt_other_key_warns_with_the_closest_key(make, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe.core.config"):
        cfg = load_config(make(asnyc_dump=True, levle="L0", level="L0"))
    assert cfg.level == "L0" and cfg.async_dump is False
    assert "unknown top-level key 'asnyc_dump' ignored; did you mean `async_dump`?" in caplog.text
    # `level` is given: a near-miss of it is only a warning
    assert "unknown top-level key 'levle' ignored; did you mean `level`?" in caplog.text


def test_rank_and_step_ranges(make):
    cfg = load_config(make(step=[0, "2-4", 3], rank=["1-1", 0, 0]))
    assert cfg.step == (0, 2, 3, 4)
    assert cfg.rank == (0, 1)
    assert cfg.step_selected(3) and not cfg.step_selected(1)
    assert cfg.rank_selected(1) and not cfg.rank_selected(2)
    assert cfg.last_step == 4
    everything = load_config(make())
    assert everything.step_selected(123456) and everything.rank_selected(7)
    assert everything.last_step is None


def test_rank_and_step_as_strings_mixed_with_integers(make):
    # upstream 26.x config.json files write steps and ranks as strings: "0", "4-6"
    cfg = load_config(make(step=["0", "4-6", 2], rank=["1", 0, "3-4"]))
    assert cfg.step == (0, 2, 4, 5, 6)
    assert cfg.rank == (0, 1, 3, 4)
    assert load_config(make(), step=["3", "5-6"]).step == (3, 5, 6)  # the constructor argument too
    assert load_config(make(step=["2"]), framework="mindspore").step == (2,)


def test_upstream_26_keys_defaults_and_values(make):
    cfg = load_config(make())
    assert (cfg.extra_info, cfg.precision, cfg.risk_level, cfg.tensor_list, cfg.dump_enable) == (
        True, "low", "ALL", (), None)
    cfg = load_config(make(extra_info=False, precision="high", risk_level="CORE", dump_enable=False,
                           statistics={"tensor_list": ["relu", "Module.fc"], "summary_mode": "xor"}))
    assert (cfg.extra_info, cfg.precision, cfg.risk_level, cfg.tensor_list, cfg.dump_enable, cfg.summary_mode) == (
        False, "high", "CORE", ("relu", "Module.fc"), False, "xor")
    # tensor_list belongs to task statistics; the tensor task reads its own summary_mode
    cfg = load_config(make(task="tensor", tensor={"summary_mode": "md5"}, statistics={"tensor_list": ["x"]}))
    assert cfg.tensor_list == () and cfg.summary_mode == "md5"


def test_compiled_regions_default_and_value(make):
    assert load_config(make()).compiled_regions == "root"
    assert load_config(make(compiled_regions="inside")).compiled_regions == "inside"
    assert load_config(make(compiled_regions="root")).compiled_regions == "root"


@pytest.mark.parametrize(("fields", "pattern"), [
    ({"statistics": {"summary_mode": "xor"}}, r"`statistics.summary_mode`: got 'xor'; allowed: statistics, md5; "
                                              r"not supported by msprobe for MindSpore"),
    ({"precision": "high"}, r"`precision`: got 'high'; allowed: low; not supported"),
    ({"risk_level": "CORE"}, r"`risk_level`: got 'CORE'; allowed: ALL; not supported"),
    ({"statistics": {"tensor_list": ["relu"]}}, r"`statistics.tensor_list`: got \['relu'\]"),
    ({"dump_enable": True}, r"`dump_enable`: got True; allowed: absent; not supported"),
    ({"compiled_regions": "inside"}, r"`compiled_regions`: got 'inside'; allowed: absent; not supported"),
])
def test_mindspore_rejects_the_26_keys_it_does_not_implement(make, fields, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(make(**fields), framework="mindspore")
    load_config(make(**fields))  # PyTorch implements them
    load_config(make(extra_info=False, step=["1"], risk_level="ALL", precision="low"), framework="mindspore")


@pytest.mark.parametrize(("fields", "pattern"), [
    ({"task": "tensor", "tensor": {"bench_path": "nowhere", "summary_mode": "md5"}},
     r"`tensor.bench_path`: got 'nowhere'; allowed: absent; not supported by msprobe for MindSpore"),
    ({"task": "tensor", "tensor": {"diff_nums": 3}}, r"`tensor.diff_nums`: got 3; allowed: absent; not supported"),
    ({"load": {"path": "nowhere", "modules": ["Module.fc.Linear.forward.0"]}}, r"`load`: got .*; allowed: absent"),
])
def test_mindspore_rejects_bench_path_and_load_before_reading_them(make, fields, pattern):
    """The MindSpore error names the key, whatever its value (the paths are not looked at)."""
    with pytest.raises(ConfigError, match=pattern):
        load_config(make(**fields), framework="mindspore")


def test_step_upper_bound_is_inclusive(make):
    assert load_config(make(step=[1_000_000])).step == (1_000_000,)


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"task": "tensors"}, r"config field `task`: got 'tensors'; allowed: statistics, tensor, structure$"),
        ({"task": "overflow_check"}, r"`task`: got 'overflow_check'"),
        ({"task": None}, r"`task`: got None"),
        ({"level": "L3"}, r"config field `level`: got 'L3'; allowed: L0, L1, L2, mix, debug$"),
        ({"step": [-1]}, r"config field `step`: got -1; allowed: .*0\.\.1000000.*out of range"),
        ({"step": [1_000_001]}, r"`step`: got 1000001;.*out of range"),
        ({"step": "0-3"}, r"`step`: got '0-3';.*expected a list, got str"),
        ({"rank": 0}, r"config field `rank`: got 0;.*expected a list, got int"),
        ({"rank": None}, r"`rank`: got None"),
        ({"step": ["5-3"]}, r"`step`: got '5-3';.*range start 5 is greater than end 3"),
        ({"step": [True]}, r"`step`: got True;.*element of type bool"),
        ({"rank": [1.0]}, r"`rank`: got 1\.0;.*element of type float"),
        ({"step": ["3x"]}, r"`step`: got '3x';.*must be an integer '4' or a range"),
        ({"step": ["1-2000000"]}, r"`step`: got '1-2000000';.*out of range"),
        ({"step": ["0-" + "9" * 5000]}, r"`step`:.*out of range"),
        ({"step": [[1]]}, r"`step`: got \[1\];.*element of type list"),
        ({"async_dump": "true"}, r"config field `async_dump`: got 'true'; allowed: true, false$"),
        ({"async_dump": 1}, r"`async_dump`: got 1"),
        ({"statistics": []}, r"config field `statistics`: got \[\];"),
        ({"statistics": {"scope": ["Functional.relu.0.forward"]}}, r"`statistics.scope`:.*exactly 2"),
        ({"statistics": {"scope": "Functional.relu.0.forward"}}, r"`statistics.scope`:.*expected a list"),
        ({"statistics": {"scope": ["a", "b", "c"]}}, r"`statistics.scope`"),
        ({"statistics": {"scope": ["Functional.relu.0.forward", 3]}}, r"`statistics.scope`: got 3"),
        ({"statistics": {"list": "relu"}}, r"config field `statistics.list`: got 'relu';.*expected a list"),
        ({"statistics": {"list": ["relu", 1]}}, r"`statistics.list`: got 1; allowed: a list of non-empty strings"),
        ({"statistics": {"list": [""]}}, r"`statistics.list`: got ''"),
        ({"statistics": {"summary_mode": "sha1"}}, r"`statistics.summary_mode`: got 'sha1'; allowed: statistics, md5, xor$"),
        ({"tensor": {"summary_mode": "crc"}, "task": "tensor"}, r"`tensor.summary_mode`: got 'crc'; allowed: statistics, md5, xor$"),
        ({"task": "tensor", "tensor": {"file_format": "pt"}}, r"`tensor.file_format`: got 'pt'; allowed: npy, bin$"),
        ({"precision": "double"}, r"`precision`: got 'double'; allowed: low, high$"),
        ({"risk_level": "focus"}, r"`risk_level`: got 'focus'; allowed: ALL, FOCUS, CORE$"),
        ({"risk_level": "LOW"}, r"`risk_level`: got 'LOW'; allowed: ALL, FOCUS, CORE$"),
        ({"dump_enable": 1}, r"`dump_enable`: got 1; allowed: true, false$"),
        ({"extra_info": None}, r"`extra_info`: got None; allowed: true, false$"),
        ({"compiled_regions": "all"}, r"`compiled_regions`: got 'all'; allowed: root, inside$"),
        ({"compiled_regions": True}, r"`compiled_regions`: got True; allowed: root, inside$"),
        ({"statistics": {"tensor_list": "relu"}}, r"`statistics.tensor_list`: got 'relu';.*expected a list"),
        ({"statistics": {"tensor_list": ["relu", ""]}}, r"`statistics.tensor_list`: got ''"),
        ({"async_dump": True, "statistics": {"tensor_list": ["relu"]}},
         r"`statistics.tensor_list`: got \['relu'\]; allowed: \[\] when async_dump is true"),
        ({"statistics": {"data_mode": []}}, r"`statistics.data_mode`: got \[\];.*must not be empty"),
        ({"statistics": {"data_mode": "all"}}, r"`statistics.data_mode`: got 'all';.*expected a list"),
        ({"statistics": {"data_mode": ["all", "input"]}}, r"`statistics.data_mode`:.*'all' cannot be combined"),
        ({"statistics": {"data_mode": ["forward", "forward"]}}, r"`statistics.data_mode`:.*duplicate"),
        ({"statistics": {"data_mode": ["inputs"]}}, r"`statistics.data_mode`: got 'inputs'; allowed: all, forward, backward, input, output$"),
        ({"statistics": {"data_mode": [None]}}, r"`statistics.data_mode`: got None"),
    ],
)
def test_invalid_fields(make, fields, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(make(**fields))


def test_error_names_field_value_and_allowed(make):
    with pytest.raises(ConfigError) as info:
        load_config(make(level="l1"))
    assert (info.value.field, info.value.value) == ("level", "l1")
    assert info.value.allowed == ("L0", "L1", "L2", "mix", "debug")


def test_async_dump_tensor_requires_list(make):
    with pytest.raises(ConfigError, match=r"`tensor.list`: got \[\]; allowed: a non-empty list of names when async_dump"):
        load_config(make(task="tensor", async_dump=True))
    cfg = load_config(make(task="tensor", async_dump=True, tensor={"list": ["relu"]}))
    assert cfg.async_dump and cfg.list == ("relu",)
    assert load_config(make(async_dump=True)).async_dump  # statistics: no list needed


def test_level_l2_rules(make):
    """L2 (MindSpore's kernel dump): any number of kernel names (none = every kernel), no
    scope, no task structure."""
    with pytest.raises(ConfigError, match=r"`statistics.scope`:.*\[\] at level L2"):
        load_config(make(level="L2", statistics={"list": ["k"], "scope": ["Functional.a.0.forward"] * 2}))
    with pytest.raises(ConfigError, match=r"`task`: got 'structure'; allowed: statistics, tensor.*no structure-only"):
        load_config(make(level="L2", task="structure"))
    assert load_config(make(level="L2")).list == ()
    assert load_config(make(level="L2", statistics={"list": ["k"]})).list == ("k",)
    cfg = load_config(make(level="L2", task="tensor", tensor={"list": ["MatMul", "Default/network/ReLU-op0"]}))
    assert (cfg.task, cfg.list) == ("tensor", ("MatMul", "Default/network/ReLU-op0"))


@pytest.mark.parametrize(
    ("level", "scope", "ok"),
    [
        ("L1", ["Functional.relu.0.forward", "Tensor.__add__.1.forward"], True),
        ("L1", ["Torch.linalg.norm.0.forward", "Aten.add.Tensor.2.backward"], True),
        ("L1", ["Module.fc.Linear.forward.0", "Functional.relu.0.forward"], False),
        ("L0", ["Module.fc.Linear.forward.0", "Module.head.Linear.backward.1"], True),
        ("L0", ["Cell.block.Dense.forward.0", "Functional.relu.0.forward"], False),
        ("mix", ["Module.fc.Linear.forward.0", "Functional.relu.0.forward"], True),
        ("mix", ["relu", "gelu"], False),
        ("debug", ["anything", "goes"], True),
    ],
)
def test_scope_names_follow_level(make, level, scope, ok):
    path = make(level=level, statistics={"scope": scope})
    if ok:
        assert load_config(path).scope == tuple(scope)
    else:
        with pytest.raises(ConfigError, match=rf"`statistics.scope`:.*at level {level}"):
            load_config(path)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"task": 1}, r"`task`: got 1; allowed: a string; argument of type int"),
        ({"task": "bad"}, r"`task`: got 'bad'"),
        ({"level": ["L1"]}, r"`level`: got \['L1'\]; allowed: a string"),
        ({"dump_path": Path("x")}, r"`dump_path`: got PosixPath\('x'\)|`dump_path`: got WindowsPath"),
        ({"step": 3}, r"`step`: got 3; allowed: a list; argument of type int"),
        ({"step": "1-3"}, r"`step`: got '1-3'; allowed: a list"),
        ({"step": [-2]}, r"`step`: got -2"),
        ({"framework": "jax"}, r"`framework`: got 'jax'; allowed: pytorch, mindspore$"),
    ],
)
def test_invalid_arguments(make, kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(make(), **kwargs)


def test_step_argument_may_be_tuple(make):
    assert load_config(make(), step=(2, "0-1")).step == (0, 1, 2)


# --- the file itself ----------------------------------------------------------------------


def test_file_not_found(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"config field `config_path`: got '.*nope\.json';.*file not found"):
        load_config(missing)


def test_config_path_is_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"`config_path`:.*cannot read"):
        load_config(tmp_path)


def test_config_path_wrong_type():
    with pytest.raises(ConfigError, match=r"`config_path`: got 42; allowed: a path to a JSON file"):
        load_config(42)  # type: ignore[arg-type]


def test_invalid_json_reports_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "task": "statistics",\n  "dump_path": \n}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"`config_path`:.*invalid JSON at line 4 column 1: Expecting value"):
        load_config(str(path))


def test_not_utf8(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"task": "\xff"}')
    with pytest.raises(ConfigError, match=r"`config_path`:.*cannot read"):
        load_config(str(path))


@pytest.mark.parametrize("doc", [[], "statistics", 3, None])
def test_top_level_must_be_object(tmp_path, doc):
    with pytest.raises(ConfigError, match=r"`config_path`:.*the top level is a"):
        load_config(write_config(tmp_path, doc))


def test_duplicate_keys_are_rejected(tmp_path, dump_dir):
    path = tmp_path / "dup.json"
    path.write_text(f'{{"dump_path": {json.dumps(dump_dir)}, "step": [1], "step": [2]}}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"duplicate key 'step'"):
        load_config(str(path))


def test_deeply_nested_json(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"`config_path`"):
        load_config(str(path))


# --- dump_path ----------------------------------------------------------------------------


def test_dump_path_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"config field `dump_path`: got <missing>;.*set it in config.json or as an argument"):
        load_config(write_config(tmp_path, {"task": "statistics"}))


def test_dump_path_from_argument_only(tmp_path):
    target = str(tmp_path / "out")
    assert load_config(write_config(tmp_path, {}), dump_path=target).dump_path == target


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        ("", r"`dump_path`: got '';.*the path is empty"),
        (3, r"`dump_path`: got 3;.*expected a string, got int"),
        (None, r"`dump_path`: got None;.*expected a string"),
        (["a"], r"`dump_path`: got \['a'\]"),
        ("a\x00b", r"`dump_path`: got 'a\\x00b';.*NUL"),
        ("x" * 300, r"`dump_path`:.*too long"),
    ],
)
def test_dump_path_invalid_values(tmp_path, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(write_config(tmp_path, {"dump_path": value}))


def test_dump_path_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ConfigError, match=r"`dump_path`:.*it exists and is not a directory"):
        load_config(write_config(tmp_path, {}), dump_path=str(target))


def test_dump_path_parent_is_a_file(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    target = str(blocker / "sub" / "dump")
    with pytest.raises(ConfigError, match=r"`dump_path`:.*blocker' exists and is not a directory"):
        load_config(write_config(tmp_path, {}), dump_path=target)
    assert not (tmp_path / "blocker" / "sub").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can write read-only dirs")
def test_dump_path_parent_not_writable(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"`dump_path`:.*is not writable"):
            load_config(write_config(tmp_path, {}), dump_path=str(locked / "a" / "dump"))
    finally:
        locked.chmod(0o700)


def test_dump_path_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"`dump_path`:.*link' is a symbolic link"):
        load_config(write_config(tmp_path, {}), dump_path=str(link))
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        load_config(write_config(tmp_path, {}), dump_path=str(link / "sub"))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        load_config(write_config(tmp_path, {}), dump_path=str(dangling))


def test_dump_path_existing_dir_and_creatable_path(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    assert load_config(write_config(tmp_path, {}), dump_path=str(existing)).dump_path == str(existing)
    deep = tmp_path / "a" / "b" / "c"
    assert load_config(write_config(tmp_path, {}), dump_path=str(deep)).dump_path == str(deep)
    assert not (tmp_path / "a").exists()  # nothing is created at load time


def test_relative_dump_path_is_kept_as_configured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(write_config(tmp_path, {"dump_path": "./rel/out"}))
    assert cfg.dump_path == "./rel/out"
    assert not (tmp_path / "rel").exists()


# --- import hygiene -----------------------------------------------------------------------


def test_core_imports_no_framework():
    code = "import sys, msprobe.core; print(any(m in sys.modules for m in ('torch', 'mindspore')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "False"


# --- property: load_config returns a Config or raises ConfigError, never anything else ----

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)

_TASK_NAMES = ["statistics", "tensor", "structure"]
_FIELD_VALUES = {
    "task": st.sampled_from(_TASK_NAMES + ["overflow_check", ""]) | json_values,
    "dump_path": st.sampled_from(["DUMP", "DUMP/sub", "", "FILE", "FILE/x", "LINK"]) | json_values,
    "rank": st.lists(st.integers(-2, 5) | st.sampled_from(["0-2", "3-1", "x", "1-1"]), max_size=4) | json_values,
    "step": st.lists(st.integers(-2, 5) | st.sampled_from(["0-2", "3-1", "2"]), max_size=4) | json_values,
    "level": st.sampled_from(["L0", "L1", "L2", "mix", "debug", "L3"]) | json_values,
    "async_dump": st.booleans() | json_values,
}
_NAMES = st.sampled_from(
    ["Functional.relu.0.forward", "Module.fc.Linear.forward.0", "Tensor.add.1.backward", "relu", ""]
)
_SUB_VALUES = {
    "scope": st.lists(_NAMES, max_size=3) | json_values,
    "list": st.lists(_NAMES, max_size=3) | json_values,
    "data_mode": st.lists(st.sampled_from(["all", "forward", "backward", "input", "output", "x"]), max_size=5)
    | json_values,
    "summary_mode": st.sampled_from(["statistics", "md5", "xor"]) | json_values,
    "file_format": st.sampled_from(["npy", "bin", "pt"]) | json_values,
}
sub_objects = st.fixed_dictionaries({}, optional=_SUB_VALUES) | json_values
field_documents = st.fixed_dictionaries(
    {}, optional={**_FIELD_VALUES, **{name: sub_objects for name in _TASK_NAMES}, "enable_dataloader": json_values}
)
_VALID_SUB_VALUES = {
    "list": st.lists(st.sampled_from(["relu", "Functional.linear", "head"]), min_size=1, max_size=2),
    "data_mode": st.sampled_from([["all"], ["forward"], ["backward", "input"], ["output"]]),
    "summary_mode": st.sampled_from(["statistics", "md5"]),
    "file_format": st.sampled_from(["npy", "bin"]),
}
# mostly valid documents, so that the success path is exercised as well
valid_documents = st.fixed_dictionaries(
    {"dump_path": st.sampled_from(["DUMP", "DUMP/a/b"])},
    optional={
        "task": st.sampled_from(_TASK_NAMES),
        "rank": st.lists(st.integers(0, 8) | st.sampled_from(["0-3", "2-2"]), max_size=3),
        "step": st.lists(st.integers(0, 8) | st.sampled_from(["1-4", "7-7"]), max_size=3),
        "level": st.sampled_from(["L0", "L1", "mix", "debug"]),
        "async_dump": st.booleans(),
        **{name: st.fixed_dictionaries({}, optional=_VALID_SUB_VALUES) for name in _TASK_NAMES},
    },
)
documents = valid_documents | field_documents | json_values
arguments = st.fixed_dictionaries(
    {},
    optional={
        "task": st.sampled_from(_TASK_NAMES) | json_values,
        "dump_path": st.sampled_from(["DUMP", "FILE/x"]) | json_values,
        "level": st.sampled_from(["L0", "L1", "mix"]) | json_values,
        "step": st.lists(st.integers(-1, 3) | st.text(max_size=4), max_size=3) | json_values,
        "framework": st.sampled_from(["pytorch", "mindspore", "tf"]) | json_values,
    },
)


def _substitute(value: Any, tmp_path: Path) -> Any:
    """Replace path placeholders with real paths in tmp_path."""
    if isinstance(value, str):
        for token, real in (("DUMP", "dump"), ("FILE", "file"), ("LINK", "link")):
            if value.startswith(token):
                return str(tmp_path / (real + value[len(token):]))
    return value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents, kwargs=arguments)
def test_load_config_never_raises_anything_but_config_error(tmp_path_factory, doc, kwargs):
    tmp_path = tmp_path_factory.mktemp("prop")
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    if isinstance(doc, dict) and "dump_path" in doc:
        doc["dump_path"] = _substitute(doc["dump_path"], tmp_path)
    if "dump_path" in kwargs:
        kwargs["dump_path"] = _substitute(kwargs["dump_path"], tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    try:
        cfg = load_config(str(path), **kwargs)
    except ConfigError as err:
        assert re.match(r"config field `[^`]+`: got .*; allowed: ", str(err)), str(err)
        return
    assert isinstance(cfg, Config)
    assert cfg.task in _TASK_NAMES
    assert cfg.level in ("L0", "L1", "L2", "mix", "debug")
    assert not (cfg.task == "structure" and cfg.level == "L1")
    assert list(cfg.step) == sorted(set(cfg.step)) and all(0 <= s <= 1_000_000 for s in cfg.step)
    assert list(cfg.rank) == sorted(set(cfg.rank))
    assert len(cfg.scope) in (0, 2)
    assert isinstance(cfg.dump_path, str) and cfg.dump_path

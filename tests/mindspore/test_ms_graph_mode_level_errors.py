"""The ConfigError for each level msprobe does not record in GRAPH_MODE
(msprobe.mindspore.graph_levels.check_graph_mode_level); the level-L0 error with the real
TensorDump probe on the CPU backend is checked in test_ms_graph_kernels.py."""
from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.mindspore import graph_levels  # noqa: E402

PYNATIVE = "mindspore.set_context(mode=mindspore.PYNATIVE_MODE)"
CPU_MESSAGE = "Unsupported op [TensorDump] on CPU"


def test_level_l2_is_recorded_in_graph_mode():
    assert graph_levels.check_graph_mode_level("L2") is None


@pytest.mark.parametrize("level", ["L1", "debug"])
def test_python_call_levels_say_the_graph_has_no_python_calls(level):
    with pytest.raises(ConfigError) as info:
        graph_levels.check_graph_mode_level(level)
    text = str(info.value)
    assert text.startswith(f"config field `level`: got '{level}'; allowed: L2")
    assert "one compiled graph" in text and f"{PYNATIVE} for level {level}" in text
    assert "TensorDump" not in text


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_cell_levels_name_the_op_the_backend_lacks(monkeypatch, level):
    asked = []
    monkeypatch.setattr(graph_levels, "tensor_dump_missing", lambda device: asked.append(device) or CPU_MESSAGE)
    with pytest.raises(ConfigError) as info:
        graph_levels.check_graph_mode_level(level)
    text = str(info.value)
    assert asked == ["CPU"]
    assert f"need MindSpore's TensorDump op, which the CPU backend lacks ({CPU_MESSAGE})" in text
    assert f"{PYNATIVE} for level {level}" in text and "use level L2" in text


def test_backend_with_tensordump_says_cell_records_are_not_implemented(monkeypatch):
    monkeypatch.setattr(graph_levels, "tensor_dump_missing", lambda device: None)
    with pytest.raises(ConfigError, match=r"TensorDump in each Cell\) are not implemented by msprobe"):
        graph_levels.check_graph_mode_level("L0")


def test_probe_that_cannot_run_is_a_runtime_error_with_its_stderr():
    """A device target MindSpore does not know: the child process fails and its stderr
    is in the message (no silent 'TensorDump present')."""
    with pytest.raises(RuntimeError, match=r"(?s)TensorDump probe failed \(exit [1-9]\d*\):.*NoSuchDevice"):
        graph_levels.tensor_dump_missing("NoSuchDevice")

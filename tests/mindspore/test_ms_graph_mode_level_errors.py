"""The ConfigError for each level msprobe does not record in GRAPH_MODE
(msprobe.mindspore.graph_levels.check_graph_mode_level): L0 records on CPU (pyfunc ops,
test_ms_graph_cells.py) and is an error naming the TensorDump op on other backends; the
level-mix error of a real GRAPH_MODE run is checked in test_ms_graph_kernels.py."""
from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.mindspore import graph_levels  # noqa: E402

PYNATIVE = "mindspore.set_context(mode=mindspore.PYNATIVE_MODE)"
CPU_MESSAGE = "Unsupported op [TensorDump] on CPU"


@pytest.mark.parametrize("device", ["CPU", "GPU", "Ascend"])
def test_level_l2_is_recorded_in_graph_mode(device):
    assert graph_levels.check_graph_mode_level("L2", device) is None


def test_level_l0_is_recorded_on_cpu_without_asking_for_tensordump(monkeypatch):
    monkeypatch.setattr(graph_levels, "tensor_dump_missing", lambda device: pytest.fail("probe ran"))
    assert graph_levels.check_graph_mode_level("L0", "CPU") is None
    assert graph_levels.graph_levels("CPU") == ("L0", "L2") and graph_levels.graph_levels("GPU") == ("L2",)


@pytest.mark.parametrize("level", ["L1", "debug"])
@pytest.mark.parametrize("device, allowed", [("CPU", "L0, L2"), ("Ascend", "L2")])
def test_python_call_levels_say_the_graph_has_no_python_calls(level, device, allowed):
    with pytest.raises(ConfigError) as info:
        graph_levels.check_graph_mode_level(level, device)
    text = str(info.value)
    assert text.startswith(f"config field `level`: got '{level}'; allowed: {allowed}")
    assert "one compiled graph" in text and f"{PYNATIVE} for level {level}" in text
    assert "TensorDump" not in text


@pytest.mark.parametrize("device, allowed, l0", [("CPU", "L0, L2", True), ("GPU", "L2", False)])
def test_mix_says_the_graph_has_no_api_calls(monkeypatch, device, allowed, l0):
    monkeypatch.setattr(graph_levels, "tensor_dump_missing", lambda device: pytest.fail("probe ran"))
    with pytest.raises(ConfigError) as info:
        graph_levels.check_graph_mode_level("mix", device)
    text = str(info.value)
    assert text.startswith(f"config field `level`: got 'mix'; allowed: {allowed}")
    assert "adds API calls" in text and f"{PYNATIVE} for level mix" in text
    assert ("level L0 for the Cells (CPU)" in text) == l0


def test_l0_on_a_backend_without_tensordump_names_the_op(monkeypatch):
    asked = []
    message = "Unsupported op [TensorDump] on GPU"
    monkeypatch.setattr(graph_levels, "tensor_dump_missing", lambda device: asked.append(device) or message)
    with pytest.raises(ConfigError) as info:
        graph_levels.check_graph_mode_level("L0", "GPU")
    text = str(info.value)
    assert asked == ["GPU"]
    assert text.startswith("config field `level`: got 'L0'; allowed: L2")
    assert f"need MindSpore's TensorDump op, which the GPU backend lacks ({message})" in text
    assert f"{PYNATIVE} for level L0" in text and "use level L2" in text


def test_backend_with_tensordump_says_cell_records_are_not_implemented(monkeypatch):
    monkeypatch.setattr(graph_levels, "tensor_dump_missing", lambda device: None)
    with pytest.raises(ConfigError, match=r"on Ascend \(TensorDump in each Cell\) are not implemented by msprobe"):
        graph_levels.check_graph_mode_level("L0", "Ascend")


def test_cpu_backend_lacks_tensordump():
    """The real probe (a child process compiling a one-op TensorDump graph): the CPU backend
    of MindSpore has no TensorDump kernel, so GRAPH_MODE L0 on CPU goes through pyfunc ops."""
    assert CPU_MESSAGE in graph_levels.tensor_dump_missing("CPU")


def test_probe_that_cannot_run_is_a_runtime_error_with_its_stderr():
    """A device target MindSpore does not know: the child process fails and its stderr
    is in the message (no silent 'TensorDump present')."""
    with pytest.raises(RuntimeError, match=r"(?s)TensorDump probe failed \(exit [1-9]\d*\):.*NoSuchDevice"):
        graph_levels.tensor_dump_missing("NoSuchDevice")

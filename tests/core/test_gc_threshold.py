"""The garbage collector's generation-0 threshold while a session records
(msprobe.core.gc_threshold): raised at the first start(), put back at close(), shared
by sessions in one process, configurable and checked before training."""
import gc

import pytest

from msprobe.core.gc_threshold import DEFAULT_GEN0, GC_ENV, RaisedThreshold, gc_threshold


@pytest.fixture
def thresholds():
    """Python's thresholds set to its defaults for the test, put back afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_the_setting_reads_integers_and_defaults():
    assert gc_threshold({}) == DEFAULT_GEN0 == 10_000
    assert gc_threshold({GC_ENV: "  "}) == DEFAULT_GEN0
    assert gc_threshold({GC_ENV: " 2500 "}) == 2500
    assert gc_threshold({GC_ENV: "0"}) == 0
    for bad in ("-1", "1e4", "many", "10.5"):
        with pytest.raises(ValueError, match=GC_ENV):
            gc_threshold({GC_ENV: bad})


def test_raised_between_raise_and_restore_generations_1_and_2_kept(thresholds):
    gc.set_threshold(700, 7, 9)
    held = RaisedThreshold(5000)
    held.raise_()
    held.raise_()  # idempotent
    assert gc.get_threshold() == (5000, 7, 9)
    held.restore()
    assert gc.get_threshold() == (700, 7, 9)
    held.restore()  # idempotent
    assert gc.get_threshold() == (700, 7, 9)


def test_a_higher_threshold_a_disabled_collector_and_zero_are_left_alone(thresholds):
    gc.set_threshold(50_000, 10, 10)
    held = RaisedThreshold(10_000)
    held.raise_()
    assert gc.get_threshold()[0] == 50_000
    held.restore()
    assert gc.get_threshold()[0] == 50_000
    gc.set_threshold(0, 10, 10)  # automatic collection switched off
    held.raise_()
    assert gc.get_threshold()[0] == 0
    held.restore()
    gc.set_threshold(700, 10, 10)
    off = RaisedThreshold(0)
    off.raise_()
    assert gc.get_threshold()[0] == 700
    off.restore()


def test_sessions_share_the_raise_and_a_threshold_set_meanwhile_stays(thresholds):
    first, second = RaisedThreshold(10_000), RaisedThreshold(10_000)
    first.raise_()
    second.raise_()
    first.restore()
    assert gc.get_threshold()[0] == 10_000  # the second still records
    second.restore()
    assert gc.get_threshold()[0] == 700
    first.raise_()
    gc.set_threshold(3000, 10, 10)  # the script's own choice while recording
    first.restore()
    assert gc.get_threshold()[0] == 3000


def test_a_recording_debugger_raises_it_from_start_to_close(tmp_path, thresholds, monkeypatch):
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.delenv(GC_ENV, raising=False)
    model = torch.nn.Linear(4, 3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    assert gc.get_threshold()[0] == 700  # nothing before the first start()
    dbg.start()
    assert gc.get_threshold()[0] == DEFAULT_GEN0
    model(torch.ones(2, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    assert gc.get_threshold()[0] == DEFAULT_GEN0
    dbg.close()
    assert gc.get_threshold()[0] == 700


def test_zero_leaves_the_collector_as_it_is_while_recording(tmp_path, thresholds, monkeypatch):
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setenv(GC_ENV, "0")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    dbg.start()
    torch.nn.Linear(4, 3)(torch.ones(2, 4))
    assert gc.get_threshold()[0] == 700
    dbg.stop()
    dbg.close()


def test_a_bad_threshold_is_a_config_error_before_training(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from msprobe.core.errors import ConfigError
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setenv(GC_ENV, "lots")
    with pytest.raises(ConfigError, match=GC_ENV) as info:
        PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    assert info.value.field == GC_ENV and info.value.value == "lots"
    assert not (tmp_path / "d").exists()

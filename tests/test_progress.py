"""msprobe.progress and the commands' progress bars: silent unless stderr is a terminal,
drawn (after the delay) when it is."""
from __future__ import annotations

import io
import time

from msprobe import progress
from msprobe.cli import main
from msprobe.progress import Progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_a_terminal_draws_nothing():
    stream = io.StringIO()
    with Progress("work", total=3, stream=stream) as bar:
        for k in range(3):
            bar.advance(f"part {k}")
    assert not bar.shown and stream.getvalue() == ""


def test_terminal_draws_after_the_delay(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    stream = FakeTerminal()
    with Progress("msprobe export", total=2, unit="dir", stream=stream) as bar:
        assert bar.shown
        bar.advance("rank 0 step 0")
        time.sleep(0.2)   # tqdm redraws at most every 0.1 s
        bar.advance("rank 0 step 1")
    text = stream.getvalue()
    assert "msprobe export" in text and "2/2" in text and "rank 0 step 1" in text


def test_terminal_quick_work_draws_nothing():
    stream = FakeTerminal()   # DELAY_S = 2 s: work that ends sooner leaves no bar
    with Progress("msprobe report", stream=stream) as bar:
        shown = bar.shown
        bar.advance("overview")
    assert shown and stream.getvalue() == ""


def test_export_query_report_are_silent_on_a_pipe(tmp_path, capfd):
    import json

    import torch

    from msprobe.pytorch.debugger import PrecisionDebugger

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "mix"}))
    model = torch.nn.Linear(3, 2)
    dbg = PrecisionDebugger(config_path=str(config))
    dbg.start(model)
    model(torch.ones(4, 3)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    capfd.readouterr()
    assert main(["export", str(tmp_path / "dump"), "-o", str(tmp_path / "out")]) == 0
    assert main(["report", str(tmp_path / "dump"), "-o", str(tmp_path / "r.html")]) == 0
    captured = capfd.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines()[-1] == f"wrote {tmp_path / 'r.html'}"

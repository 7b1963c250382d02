"""The writer process (store/writer_process.py) and its client (store/writer_client.py):
what the training process hands over reaches the log and the step files exactly as the
in-process writer writes them; step() does not wait for the files, wait_files() and close()
do; a writer process that dies is replaced by writing in the training process with nothing
lost; a training process killed with SIGKILL keeps what it handed over."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from store.errors import StoreWriteError
from store.export import export_log
from store.log_reader import read_log
from store.records import Call, Marker, Stack, make_leaf
from store.writer_client import WriterClient, WriterGone, writer_command
from store.writer_process import HEADER, HELLO, encode_frame

REPO = Path(__file__).resolve().parents[2]
META = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank",
        "extra_info": None}
FILES = ("dump.json", "stack.json", "construct.json")


def leaf(io: str, value: float):
    return make_leaf((io, (0,), "tensor", "torch.Tensor", "torch.float32", (2,), 2, value, -value, 0.0,
                      value * 2 ** 0.5, None, None, None, False, False, False, None, None, None))


def call(step: int, i: int) -> Call:
    return Call(step=step, kind="api_forward", name=f"Torch.add.{i}.forward", api_type="Torch", stack_id=7,
                keys=("input_args", "output"), leaves=(leaf("input_args", float(i)), leaf("output", i + 0.5)))


def hand_over(client, steps: int = 2, calls: int = 5) -> None:
    client.append_stack(Stack(stack_id=7, frames=("File a.py, line 1, in f, \n x = y",)))
    for step in range(steps):
        client.append_marker(Marker(step=step, kind="start", meta=META))
        for i in range(calls):
            client.append(call(step, i))
        client.append_marker(Marker(step=step, kind="step_end", meta=META))
        client.export(step, META, True)
        client.end_step(step)


def test_records_reach_log_and_files_as_written_offline(tmp_path):
    client = WriterClient(tmp_path / "d", 3, flush_rows=4)
    hand_over(client)
    assert client.wait(60)
    client.close()
    table = read_log(tmp_path / "d").table
    calls = table.filter(table.column("row").to_numpy(zero_copy_only=False) == "call")
    assert calls.column("name").to_pylist() == [f"Torch.add.{i}.forward" for i in range(5)] * 2
    assert set(table.column("rank").to_pylist()) == {3}
    log_name = os.listdir(tmp_path / "d" / ".msprobe" / "log")[0]
    assert log_name.startswith(f"rank3.{os.getpid()}.")  # named after the training process
    export_log(tmp_path / "d", tmp_path / "offline")
    live, offline = _tree(tmp_path / "d"), _tree(tmp_path / "offline")
    assert live == offline and ("step1", "rank", "dump.json") in live
    dump = json.loads((tmp_path / "d" / "step1" / "rank" / "dump.json").read_text())
    assert dump["data"]["Torch.add.3.forward"]["output"][0]["Max"] == 3.5


def _tree(root: Path) -> dict:
    """``{relative path parts: bytes}`` of the step files below ``root``."""
    return {p.relative_to(root).parts: p.read_bytes() for p in root.rglob("*.json") if ".msprobe" not in p.parts}


def _slow_writer(seconds: float) -> list:
    return [sys.executable, "-c", f"import sys, time; sys.path.insert(0, {str(REPO)!r}); time.sleep({seconds}); "
            "from store.writer_process import main; main()"]


def test_export_is_not_waited_for_and_wait_is_bounded(tmp_path):
    client = WriterClient(tmp_path / "d", 0, command=_slow_writer(1.5))
    began = time.monotonic()
    hand_over(client, steps=1)
    assert time.monotonic() - began < 1.0  # handed over, not written
    assert not (tmp_path / "d" / "step0" / "rank" / "dump.json").exists()
    assert client.wait(0.05) is False
    assert client.wait(60) is True
    assert (tmp_path / "d" / "step0" / "rank" / "dump.json").exists()
    client.close()


def test_writer_gone_returns_every_unwritten_message(tmp_path):
    client = WriterClient(tmp_path / "d", 0, command=[sys.executable, "-c", "import sys; sys.stdin.buffer.read(4); sys.exit(9)"])
    client.append_marker(Marker(step=0, kind="start", meta=META))
    with pytest.raises(WriterGone) as gone:
        for i in range(200):  # the pipe breaks, or the end of the answers is seen
            client.append(call(0, i))
            client.export(0, META, True)
            time.sleep(0.01)
    kinds = [m[0] for m in gone.value.messages]
    from store.writer_process import CALL, MARKER
    assert kinds[0] == MARKER
    names = [m[3] for m in gone.value.messages if m[0] == CALL]
    assert names == [f"Torch.add.{i}.forward" for i in range(len(names))] and names
    assert gone.value.status == 9


def test_write_fault_is_raised_once(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    client = WriterClient(blocked / "d", 0)
    hand_over(client, steps=1)
    with pytest.raises(StoreWriteError, match="writer process failed"):
        client.wait(60)
        client.append(call(1, 0))
    client.close()  # raised once: no second error


def test_protocol_mismatch_is_refused(tmp_path):
    proc = subprocess.run(writer_command(), input=encode_frame([(HELLO, 999, {})]), capture_output=True, timeout=60)
    assert proc.returncode == 2 and b"protocol mismatch" in proc.stderr


def test_a_store_package_in_the_current_directory_is_not_imported(tmp_path, monkeypatch):
    """The writer process imports this installation's ``store``, whatever the training
    script's directory holds."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "__init__.py").write_text("raise SystemExit('the wrong store package')\n")
    monkeypatch.chdir(tmp_path)
    client = WriterClient(tmp_path / "d", 0)
    hand_over(client, steps=1)
    assert client.wait(60)
    client.close()
    assert json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["data"]


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="flush_rows"):
        WriterClient(tmp_path, 0, flush_rows=0)
    with pytest.raises(ValueError, match="flush_interval_s"):
        WriterClient(tmp_path, 0, flush_interval_s=0)


TRAIN = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {repo!r})
    import torch, torch.nn as nn
    from msprobe.pytorch import PrecisionDebugger
    out, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=out, level="mix", model=model)
    for step in range(3):
        dbg.start()
        loss = model(torch.randn(4, 6)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
        dbg.stop()
        if mode == "kill_writer" and step == 1:
            os.kill(dbg.session._client.pid, signal.SIGKILL)
            time.sleep(0.5)
        if mode == "kill_self" and step == 2:
            time.sleep(1.0)  # past the flush interval: handed over
            os.kill(os.getpid(), signal.SIGKILL)
        dbg.step()
    dbg.close()
    print("DONE", flush=True)
""")


def _train(tmp_path, name: str, mode: str, env: dict) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(repo=str(REPO)))
    return subprocess.run([sys.executable, str(script), str(tmp_path / name), mode], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def _files(root: Path) -> dict:
    return {(step, name): (root / f"step{step}" / "rank" / name).read_bytes() for step in range(3) for name in FILES}


def test_killed_writer_process_is_replaced_and_nothing_is_lost(tmp_path):
    ref = _train(tmp_path, "ref", "none", {"MSPROBE_WRITER": "inprocess"})
    assert "DONE" in ref.stdout, ref.stderr
    run = _train(tmp_path, "run", "kill_writer", {"MSPROBE_WAIT_FILES": ""})
    assert "DONE" in run.stdout, run.stderr
    assert run.stderr.count("the writer process ended") == 1
    assert _files(tmp_path / "run") == _files(tmp_path / "ref")
    export_log(tmp_path / "run", tmp_path / "offline")
    assert _files(tmp_path / "offline") == _files(tmp_path / "ref")


def test_killed_training_process_keeps_what_it_handed_over(tmp_path):
    ref = _train(tmp_path, "ref", "none", {"MSPROBE_WRITER": "inprocess"})
    run = _train(tmp_path, "run", "kill_self", {"MSPROBE_WAIT_FILES": ""})
    assert run.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60
    log = tmp_path / "run" / ".msprobe" / "log"
    # the writer process reads to the end of its input, then closes the log
    while time.monotonic() < deadline and not _closed(log):
        time.sleep(0.2)
    assert _closed(log)
    export_log(tmp_path / "run", tmp_path / "offline")
    ref_files, got = _files(tmp_path / "ref"), _files(tmp_path / "offline")
    for step in (0, 1):
        for name in FILES:
            assert got[(step, name)] == ref_files[(step, name)]
    # step 2 was stopped (all its calls handed over), not ended: its entries are all there
    assert json.loads(got[(2, "dump.json")])["data"].keys() == json.loads(ref_files[(2, "dump.json")])["data"].keys()


def _closed(log: Path) -> bool:
    files = list(log.glob("*.arrows")) if log.exists() else []
    return len(files) == 1 and files[0].read_bytes().endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")


def test_step_does_not_wait_wait_files_does(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger
    monkeypatch.delenv("MSPROBE_WAIT_FILES", raising=False)
    model = torch.nn.Linear(4, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    for _ in range(2):
        dbg.start(model)
        model(torch.ones(3, 4)).sum().backward()
        dbg.stop()
        dbg.step()
    assert dbg.session.wait_files(120) is True
    dump = json.loads((tmp_path / "d" / "step1" / "rank" / "dump.json").read_text())
    expected = (torch.ones(3, 4) @ model.weight.detach().T + model.bias.detach()).max().item()
    assert dump["data"]["Functional.linear.0.forward"]["output"][0]["Max"] == pytest.approx(expected, rel=1e-6)
    dbg.close()


GONE = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {repo!r})
    import torch, torch.nn as nn
    import store.writer_client as writer_client
    from msprobe.pytorch import PrecisionDebugger
    out, when = sys.argv[1], sys.argv[2]
    # every frame waits 0.3 s in the writer process: an export request is still unwritten
    # when the writer process is killed right after it
    slow = ("import sys, time; sys.path.insert(0, {repo!r}); import store.writer_process as w; "
            "read = w._read_frame; w._read_frame = lambda s: (time.sleep(0.3), read(s))[1]; w.main()")
    writer_client.writer_command = lambda: [sys.executable, "-c", slow]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=out, level="mix", model=model)

    def kill_writer():
        client = dbg.session._client
        answer = client._answer  # the end of its answers is seen late: the next hand-over finds it
        client._answer = lambda line: (time.sleep(3) if line is None else None, answer(line))[1]
        os.kill(client.pid, signal.SIGKILL)
        client._proc.wait()

    for step in range(3):
        dbg.start()
        loss = model(torch.randn(4, 6)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
        if step == 1 and when == "before_stop":
            kill_writer()  # stop()'s export request finds it gone
        dbg.stop()
        if step == 1 and when == "before_step":
            kill_writer()  # step()'s end-of-step request finds it gone
        dbg.step()
    dbg.close()
    print("DONE", flush=True)
""")


@pytest.mark.parametrize("when", ["before_stop", "before_step"])
def test_writer_gone_found_by_an_export_or_step_end_request(tmp_path, when):
    """The writer process dies with the step's export unwritten and the next request to it
    (stop()'s export, or step()'s end of step) is what finds it gone: the training goes on
    and every step's files equal those of a run without a writer process."""
    ref = _train(tmp_path, "ref", "none", {"MSPROBE_WRITER": "inprocess"})
    assert "DONE" in ref.stdout, ref.stderr
    script = tmp_path / "gone.py"
    script.write_text(GONE.format(repo=str(REPO)))
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), when], capture_output=True,
                         text=True, env={**os.environ, "MSPROBE_WAIT_FILES": ""}, timeout=300)
    assert "DONE" in run.stdout, run.stderr
    assert run.stderr.count("the writer process ended") == 1 and "Traceback" not in run.stderr
    got, want = _files(tmp_path / "run"), _files(tmp_path / "ref")
    for key in want:  # stack.json names the script, which differs: its entries must not
        if key[1] == "stack.json":
            assert json.loads(got[key]).keys() == json.loads(want[key]).keys()
        else:
            assert got[key] == want[key], key

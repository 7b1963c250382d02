"""Task statistics with ``tensor_list``: every entry keeps its statistics, and the entries
whose name contains a listed string also get their full tensors (``data_name``, a .pt file
in ``dump_tensor_data``), forward, backward and parameter gradients alike."""
from __future__ import annotations

import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import assert_record


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def _run(tmp_path, tensor_list):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "mix",
                               "statistics": {"tensor_list": tensor_list}}))
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(5, 4)
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start(net)
    net(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    rank = tmp_path / "d" / "step0" / "rank"
    return json.loads((rank / "dump.json").read_text()), rank / "dump_tensor_data", net, x


def _records(entry):
    for key, value in entry.items():
        for rec in (value if isinstance(value, list) else value.values() if isinstance(value, dict) else []):
            if isinstance(rec, dict) and rec.get("type") == "torch.Tensor":
                yield key, rec


def test_only_listed_entries_get_tensor_files(tmp_path):
    dump, tensors, net, x = _run(tmp_path, ["relu", "Module.fc2"])
    saved = set()
    for name, entry in dump["data"].items():
        listed = "relu" in name or "Module.fc2" in name
        for _, rec in _records(entry):
            assert rec["Max"] is not None or rec["dtype"] == "torch.bool"  # statistics everywhere
            assert ("data_name" in rec) == listed, (name, rec)
            if listed:
                saved.add(rec["data_name"])
    assert dump["dump_data_dir"] is not None
    assert sorted(p.name for p in tensors.iterdir()) == sorted(saved)
    assert {"Functional.relu.0.forward.input.0.pt", "Functional.relu.0.backward.input.0.pt",
            "Module.fc2.Linear.forward.0.parameters.weight.pt", "Module.fc2.Linear.parameters_grad.weight.pt"} <= saved
    # the files hold the recorded values, and their statistics match the record
    h = F.linear(x, net.fc1.weight, net.fc1.bias)
    relu_in = torch.load(tensors / "Functional.relu.0.forward.input.0.pt", weights_only=True)
    assert torch.equal(relu_in, h)
    assert_record(dump["data"]["Functional.relu.0.forward"]["input_args"][0], h)
    grad = torch.load(tensors / "Module.fc2.Linear.parameters_grad.weight.pt", weights_only=True)
    assert torch.equal(grad, net.fc2.weight.grad)


def test_empty_tensor_list_writes_no_tensor_files(tmp_path):
    dump, tensors, _, _ = _run(tmp_path, [])
    assert not tensors.exists() and dump["dump_data_dir"] is None
    assert all("data_name" not in rec for e in dump["data"].values() for _, rec in _records(e))

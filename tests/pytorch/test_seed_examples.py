"""Every PyTorch example of the seeds' data-dump document (05.data_dump_PyTorch.md, 1.2.2),
run unchanged apart from the removed ``torch_npu`` lines (and, where the document elides
code with ``...``, the smallest filling: a model, a data loader, a loss), checked against
the layout and names the document describes."""
from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from test_dump_filters import both
from test_seed import global_state  # noqa: F401  (fixture: restores what seed_all changes)

QUICK_START = '''
# 根据需要import包
import torch
import torch.nn as nn
import torch.nn.functional as F

# 导入工具的数据采集接口
from msprobe.pytorch import PrecisionDebugger, seed_all

# 在模型训练开始前固定随机性
seed_all()
# 在模型训练开始前实例化PrecisionDebugger
debugger = PrecisionDebugger(config_path='./config.json')

# 定义网络
class ModuleOP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features=8, out_features=4)
        self.linear_2 = nn.Linear(in_features=4, out_features=2)

    def forward(self, x):
        x1 = self.linear_1(x)
        x2 = self.linear_2(x1)
        r1 = F.relu(x2)
        return r1

if __name__ == "__main__":
    module = ModuleOP()
    # 开启数据 dump
    debugger.start(model=module)

    x = torch.randn(10, 8)
    out = module(x)
    loss = out.sum()
    loss.backward()

    # 关闭数据 dump
    debugger.stop()
'''

# 2.2 and 2.3 elide the model, the loader and the loss ("# ..."): the filling is marked FILL.
PRELUDE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
class Model(nn.Module):                                         # FILL
    def __init__(self):                                         # FILL
        super().__init__()                                      # FILL
        self.fc = nn.Linear(8, 2)                               # FILL
    def forward(self, x):                                       # FILL
        return F.relu(self.fc(x))                               # FILL
model = Model()                                                 # FILL
data_loader = [(torch.randn(4, 8), torch.randn(4, 2)) for _ in range(2)]  # FILL
'''

FULL_FORWARD_BACKWARD = PRELUDE + '''
from msprobe.pytorch import PrecisionDebugger, seed_all
# 在模型训练开始前固定随机性
seed_all()
# 请勿将PrecisionDebugger的初始化流程插入到循环代码中
debugger = PrecisionDebugger(config_path="./config.json", dump_path="./dump_path")

# 模型、损失函数的定义及初始化等操作
# ...
# 数据集迭代的位置一般为模型训练开始的位置
for data, label in data_loader:
    debugger.start()  # 开启数据dump
    # 如下是模型每个step执行的逻辑
    output = model(data)
    loss = F.mse_loss(output, label)                            # FILL
    loss.backward()
    debugger.stop()  # 关闭数据dump
    debugger.step()  # 结束一个step的dump
'''

CODE_BLOCK = PRELUDE + '''
from msprobe.pytorch import PrecisionDebugger, seed_all

# 在模型训练开始前固定随机性
seed_all()
# 请勿将PrecisionDebugger的初始化流程插入到循环代码中
debugger = PrecisionDebugger(config_path="./config.json", dump_path="./dump_path")

# 模型、损失函数的定义及初始化等操作
# ...
# 数据集迭代的位置一般为模型训练开始的位置
for data, label in data_loader:
    debugger.start()  # 开启数据dump
    # 如下是模型每个step执行的逻辑
    output = model(data)

    debugger.forward_backward_dump_end()  # 插入该函数到start函数之后，只dump start函数到该函数之间的前反向数据。
    # ...
    loss = F.mse_loss(output, label)                            # FILL
    loss.backward()
    debugger.step()  # 结束一个step的dump
'''

MODULE_DUMP = '''
# 根据需要import包
import torch
import torch.nn as nn
import torch.nn.functional as F

# 导入工具的数据采集接口
from msprobe.pytorch import PrecisionDebugger, module_dump, module_dump_end

# 在模型训练开始前实例化PrecisionDebugger
debugger = PrecisionDebugger(config_path='./config.json')

# 定义网络
class ModuleOP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features=8, out_features=4)
        self.linear_2 = nn.Linear(in_features=4, out_features=2)

    def forward(self, x):
        x1 = self.linear_1(x)
        x2 = self.linear_2(x1)
        r1 = F.relu(x2)
        return r1

if __name__ == "__main__":
    module = ModuleOP()
    # 开启数据dump
    debugger.start()
    x = torch.randn(10, 8)
    # ...                              # start和module_dump接口之间的数据正常dump
    module_dump(module, "MyModuleOP")  # 开启模块级精度数据dump
    out = module(x)                    # module内部的child modules或API将不会被dump
    module_dump_end()                  # 关闭模块级精度数据dump
    loss = out.sum()                   # module_dump_end和stop接口之间的数据正常dump
    loss.backward()
    # 关闭数据dump
    debugger.stop()
'''


def run_example(tmp_path, monkeypatch, code: str, config: dict) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"dump_path": "./dump_path", **config}))
    script = tmp_path / "example.py"
    script.write_text(code)
    ns = runpy.run_path(str(script), run_name="__main__")
    ns["debugger"].close()   # what interpreter exit does
    return tmp_path / "dump_path"


def load(dump_path, step=0):
    return json.loads((dump_path / f"step{step}" / "rank" / "dump.json").read_text())


QUICK_NAMES = (both("Functional.linear.0", "Functional.linear.1", "Functional.relu.0", "Tensor.sum.0")
               | {f"Module.{m}.Linear.{d}.0" for m in ("linear_1", "linear_2") for d in ("forward", "backward")}
               | {"Module.linear_1.Linear.parameters_grad", "Module.linear_2.Linear.parameters_grad"})


def test_quick_start_mix(tmp_path, monkeypatch, global_state):
    dump_path = run_example(tmp_path, monkeypatch, QUICK_START, {"task": "statistics", "level": "mix"})
    rank_dir = dump_path / "step0" / "rank"
    assert sorted(p.name for p in rank_dir.iterdir()) == ["construct.json", "dump.json", "stack.json"]
    dump = load(dump_path)
    assert set(dump["data"]) == QUICK_NAMES
    construct = json.loads((rank_dir / "construct.json").read_text())
    assert construct["Functional.linear.0.forward"] == "Module.linear_1.Linear.forward.0"


def test_quick_start_tensor_layout(tmp_path, monkeypatch, global_state):
    dump_path = run_example(tmp_path, monkeypatch, QUICK_START, {"task": "tensor", "level": "mix"})
    dump = load(dump_path)
    assert dump["dump_data_dir"] == "./dump_path/step0/rank/dump_tensor_data"
    files = {p.name for p in (dump_path / "step0" / "rank" / "dump_tensor_data").iterdir()}
    for name in ("Functional.linear.0.forward.input.0.pt", "Functional.linear.1.backward.output.1.pt",
                 "Module.linear_1.Linear.forward.0.input.0.pt", "Module.linear_1.Linear.forward.0.parameters.bias.pt",
                 "Module.linear_1.Linear.parameters_grad.weight.pt", "Module.linear_2.Linear.backward.0.input.0.pt"):
        assert name in files


def test_full_forward_backward_loop(tmp_path, monkeypatch, global_state):
    dump_path = run_example(tmp_path, monkeypatch, FULL_FORWARD_BACKWARD, {"task": "statistics", "level": "L1"})
    assert sorted(p.name for p in dump_path.iterdir() if not p.name.startswith(".")) == ["step0", "step1"]
    for step in (0, 1):
        assert set(load(dump_path, step)["data"]) == both("Functional.linear.0", "Functional.relu.0",
                                                          "Functional.mse_loss.0")


def test_code_block_forward_backward_dump_end(tmp_path, monkeypatch, global_state):
    with pytest.warns(DeprecationWarning, match="forward_backward_dump_end"):
        dump_path = run_example(tmp_path, monkeypatch, CODE_BLOCK, {"task": "statistics", "level": "L1"})
    for step in (0, 1):
        assert set(load(dump_path, step)["data"]) == both("Functional.linear.0", "Functional.relu.0")


def test_module_dump_example(tmp_path, monkeypatch, global_state):
    dump_path = run_example(tmp_path, monkeypatch, MODULE_DUMP, {"task": "statistics", "level": "L1"})
    assert set(load(dump_path)["data"]) == {"Module.MyModuleOP.ModuleOP.forward.0",
                                            "Module.MyModuleOP.ModuleOP.backward.0",
                                            "Tensor.sum.0.forward", "Tensor.sum.0.backward"}

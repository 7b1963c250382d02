"""One small convolutional model built twice, in PyTorch and in MindSpore, with the same
weights and inputs: two 3x3 convolutions with bias (padding 1) around a ReLU, a flatten
and a Dense/Linear head. ``record_torch``/``record_ms`` run one forward and backward
recorded at a level; ``bug`` (MindSpore only) scales the output of the Cell ``conv2`` by
1.25 inside its ``construct`` (the Cell's own computation is wrong, its inputs are right).

MindSpore's ``nn.Conv2d`` calls the ``Conv2D`` primitive and adds the bias with a separate
``BiasAdd``; PyTorch's calls ``F.conv2d(input, weight, bias)``: the two conv calls' results
differ by the bias, which is what the built-in table's ``primitive_leaf`` entry for
``Conv2D`` states."""
from __future__ import annotations

import numpy as np

C_IN, C_MID, H, W, BATCH, CLASSES = 3, 4, 6, 6, 2, 5


def weights() -> dict:
    """name → float32 array, PyTorch layout (conv weight ``(out, in, kh, kw)``, as MindSpore's)."""
    rng = np.random.default_rng(0)
    w = {"conv1.weight": 0.3 * rng.standard_normal((C_MID, C_IN, 3, 3)), "conv1.bias": 0.1 * rng.standard_normal(C_MID),
         "conv2.weight": 0.3 * rng.standard_normal((C_MID, C_MID, 3, 3)), "conv2.bias": 0.1 * rng.standard_normal(C_MID),
         "head.weight": 0.3 * rng.standard_normal((CLASSES, C_MID * H * W)),
         "head.bias": 0.1 * rng.standard_normal(CLASSES)}
    return {k: v.astype(np.float32) for k, v in w.items()}


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """``(images float32 (BATCH, C_IN, H, W), loss weights float32 (BATCH, CLASSES))``."""
    rng = np.random.default_rng(1)
    return (rng.standard_normal((BATCH, C_IN, H, W)).astype(np.float32),
            rng.standard_normal((BATCH, CLASSES)).astype(np.float32))


def record_torch(path, level: str) -> None:
    import torch
    import torch.nn as nn
    from msprobe.pytorch import PrecisionDebugger

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(C_IN, C_MID, 3, padding=1)
            self.act = nn.ReLU()
            self.conv2 = nn.Conv2d(C_MID, C_MID, 3, padding=1)
            self.flatten = nn.Flatten()
            self.head = nn.Linear(C_MID * H * W, CLASSES)

        def forward(self, x):
            return self.head(self.flatten(self.conv2(self.act(self.conv1(x)))))

    net = Net()
    w = weights()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(w[name]))
    x, c = inputs()
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics")
    dbg.start(model=net)
    (net(torch.from_numpy(x)) * torch.from_numpy(c)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()


def record_ms(path, level: str, bug: bool = False) -> None:
    import mindspore as ms
    from mindspore import Tensor, nn
    from msprobe.mindspore import PrecisionDebugger

    ms.set_device("CPU")

    class Conv2d(nn.Conv2d):
        """``nn.Conv2d`` (same class name, so the built-in table pairs it with PyTorch's)
        whose result is scaled by 1.25 when ``bug``."""

        def construct(self, x):
            y = super().construct(x)
            return y * 1.25 if bug else y

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(C_IN, C_MID, 3, pad_mode="pad", padding=1, has_bias=True)
            self.act = nn.ReLU()
            self.conv2 = Conv2d(C_MID, C_MID, 3, pad_mode="pad", padding=1, has_bias=True)
            self.flatten = nn.Flatten()
            self.head = nn.Dense(C_MID * H * W, CLASSES)

        def construct(self, x):
            return self.head(self.flatten(self.conv2(self.act(self.conv1(x)))))

    net = Net()
    w = weights()
    for p in net.trainable_params():
        p.set_data(Tensor(w[p.name]))
    x, c = inputs()
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics")
    dbg.start(model=net)
    ms.value_and_grad(lambda i: (net(i) * Tensor(c)).sum(), None, net.trainable_params())(Tensor(x))
    dbg.stop()
    dbg.step()
    dbg.close()

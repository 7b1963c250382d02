"""The networks of the GRAPH_MODE tests (graph_train.py runs them in GRAPH_MODE; the tests
run them in PyNative for reference values). Importing this module sets no MindSpore mode."""
from __future__ import annotations

from mindspore import nn, ops


class Net(nn.Cell):
    """Dense(4→3) → ReLU → Dense(3→2) (graph_train.py's default, ``--net dense``)."""

    def __init__(self) -> None:
        super().__init__()
        self.d1 = nn.Dense(4, 3)
        self.relu = nn.ReLU()
        self.d2 = nn.Dense(3, 2)

    def construct(self, x):
        return self.d2(self.relu(self.d1(x)))


class Split(nn.Cell):
    """A Cell returning a tuple."""

    def construct(self, x):
        return x * 2, x - 1


class Block(nn.Cell):
    """Holds a Cell applied twice (``fc``) and a Cell returning a tuple (``split``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.split = Split()

    def construct(self, x):
        a, b = self.split(self.fc(self.fc(x)))
        return a * b


class BlockNet(nn.Cell):
    """``--net block``: Dense(4→3) → Block → Dense(3→2)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Dense(4, 3)
        self.block = Block()
        self.out = nn.Dense(3, 2)

    def construct(self, x):
        return self.out(self.block(self.inp(x)))


class TiedNet(nn.Cell):
    """``--net tied``: Dense(4→4) ``a`` → Dense(4→4) ``b`` sharing ``a.weight`` (tied
    weights) → Dense(4→2) ``c``, whose bias does not require grad."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Dense(4, 4)
        self.b = nn.Dense(4, 4)
        self.b.weight = self.a.weight
        self.c = nn.Dense(4, 2)
        self.c.bias.requires_grad = False

    def construct(self, x):
        return self.c(self.b(self.a(x)))


class TwiceNet(nn.Cell):
    """``--net twice``: Dense(4→3) → ``fc(h) * fc(h)`` (one Cell called twice on the same
    input) → Dense(3→2)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Dense(4, 3)
        self.fc = nn.Dense(3, 3)
        self.out = nn.Dense(3, 2)

    def construct(self, x):
        h = self.inp(x)
        return self.out(self.fc(h) * self.fc(h))


class ProjectionNet(nn.Cell):
    """``--net projection``: Dense(4→4) ``a``, whose weight the network also reads directly
    (``h @ a.weight.T``, as a tied output projection does), → Dense(4→2) ``out``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Dense(4, 4)
        self.out = nn.Dense(4, 2)

    def construct(self, x):
        h = self.a(x)
        return self.out(ops.matmul(h, self.a.weight.T))

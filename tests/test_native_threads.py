"""The native statistics pass shared with PyTorch's OpenMP threads (msprobe.pytorch.omp_team,
``set_parallel`` in fused_stats.c).

The pass reduces fixed chunks of 16,384 elements and adds their results in chunk order, so
the statistics must be the same bits whether one thread or a team reduces the chunks. A fake
OpenMP runtime (ctypes callbacks standing in for ``GOMP_parallel`` and friends) runs the
team's threads one after the other, last thread first, and records every team started: the
tests see which calls share, and that sharing changes no bit. References for the values are
numpy float64 with ``math.fsum``.
"""
from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest
import torch

import msprobe.pytorch.stats as stats_mod
from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64
from msprobe.pytorch import omp_team

NATIVE = stats_mod.NATIVE
pytestmark = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "set_parallel"),
                                reason="the native extension (with set_parallel) is not built")
CHUNK = 16384

_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class FakeOpenMP:
    """Stand-ins for the five OpenMP functions: a team of ``threads`` run in turn."""

    def __init__(self, threads: int, late: float = 0.0) -> None:
        self.threads = threads
        self.late = late  # seconds the other threads start after the caller's share
        self.teams = []  # num_threads of every GOMP_parallel call
        self._current = 0

        @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
        def parallel(fn, data, num_threads, flags):
            self.teams.append(num_threads)
            self._size = num_threads
            body = _BODY(fn)
            for t in reversed(range(num_threads)):  # any order: the result must not depend on it
                self._current = t
                if t and self.late:
                    time.sleep(self.late)
                body(data)

        self._fns = [parallel,
                     ctypes.CFUNCTYPE(ctypes.c_int)(lambda: self._current),
                     ctypes.CFUNCTYPE(ctypes.c_int)(lambda: self._size),
                     ctypes.CFUNCTYPE(ctypes.c_int)(lambda: self.threads),
                     ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)]
        self.addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in self._fns]


def _restore():
    """Back to the process's own state: PyTorch's runtime if share_once installed it."""
    NATIVE.set_parallel(0, 0, 0, 0, 0)
    if omp_team.sharing():
        assert omp_team.share_with_torch_threads(NATIVE)


@pytest.fixture
def fake_team():
    """Install a fake three-thread runtime (threads run one after the other, so the
    contention guard is off: backoff 0); afterwards the real one again (or none)."""
    fake = FakeOpenMP(3)
    NATIVE.set_parallel(*fake.addresses, 0.0)
    try:
        yield fake
    finally:
        _restore()


def _data(n: int, kind: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n) * 3.0
    a[rng.integers(0, n, 50)] = -0.0
    if kind == KIND_F32:
        return a.astype(np.float32)
    if kind == KIND_F64:
        return a
    if kind == KIND_F16:
        return a.astype(np.float16)
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits


def _values(buf: np.ndarray, kind: int) -> np.ndarray:
    if kind == KIND_BF16:
        return (buf.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return buf.astype(np.float64)


def _serial(fake: FakeOpenMP, call):
    NATIVE.set_parallel(0, 0, 0, 0, 0)
    try:
        return call()
    finally:
        NATIVE.set_parallel(*fake.addresses, 0.0)


@pytest.mark.parametrize("kind", [KIND_F32, KIND_F64, KIND_BF16, KIND_F16])
@pytest.mark.parametrize("n", [65535, 65536, 65537, 5 * CHUNK + 7, 200_003])
@pytest.mark.parametrize("portable", [False, True])
def test_team_gives_the_same_bits(fake_team, kind, n, portable):
    buf = _data(n, kind, n + kind)
    got = NATIVE.reduce_at(buf.ctypes.data, n, kind, portable)
    alone = _serial(fake_team, lambda: NATIVE.reduce_at(buf.ctypes.data, n, kind, portable))
    assert got == alone
    assert [math.copysign(1.0, v) for v in got[:2]] == [math.copysign(1.0, v) for v in alone[:2]]
    assert fake_team.teams == ([3] if n >= 65536 else [])
    a64 = _values(buf, kind)
    assert (got[0], got[1]) == (a64.max(), a64.min())
    assert abs(got[2] - math.fsum(a64)) <= 1e-12 * math.fsum(np.abs(a64))
    assert abs(got[3] - math.fsum(a64 * a64)) <= 1e-12 * math.fsum(a64 * a64)
    assert got[4:] == (False, False)


def test_signed_zero_max_across_chunks(fake_team):
    """Max and Min of zeros of both signs: the earlier chunk's zero wins, team or not."""
    a = np.zeros(4 * CHUNK, np.float32)
    a[:CHUNK] = -0.0
    b = -a  # +0.0 first, then -0.0
    for buf in (a, b):
        got = NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)
        alone = _serial(fake_team, lambda: NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32))
        assert [math.copysign(1.0, v) for v in got[:2]] == [math.copysign(1.0, v) for v in alone[:2]]
    assert fake_team.teams == [3, 3]


def test_nan_and_inf_in_a_late_chunk(fake_team):
    a = _data(3 * CHUNK + 5, KIND_F32, 1)
    a[2 * CHUNK + 3] = np.inf
    got = NATIVE.reduce_at(a.ctypes.data, a.size, KIND_F32)
    assert got[0] == math.inf and got[4:] == (False, True)
    a[3 * CHUNK + 1] = np.nan
    got = NATIVE.reduce_at(a.ctypes.data, a.size, KIND_F32)
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[4:] == (True, True)


@pytest.mark.parametrize("kind", [KIND_F32, KIND_BF16])
def test_snapshot_shared_copy(fake_team, kind):
    buf = _data(4 * CHUNK + 9, kind, 7)
    data, reduced = NATIVE.snapshot_at(buf.ctypes.data, buf.size, kind, 0, False, 4096)
    assert bytes(data) == buf.tobytes()
    assert reduced == _serial(fake_team, lambda: NATIVE.reduce_at(buf.ctypes.data, buf.size, kind))
    assert fake_team.teams == [3]


@pytest.mark.parametrize("kind", [KIND_F32, KIND_F64, KIND_BF16, KIND_F16])
@pytest.mark.parametrize("n", [65536, 5 * CHUNK + 3, 70 * CHUNK + 11])
def test_crc_of_chunks_combined(fake_team, kind, n):
    """summary_mode md5 in a team: each chunk's CRC-32 from 0, combined in order, is zlib's
    CRC of all the bytes (bfloat16: of their float32 values); the statistics are
    reduce_at's; the snapshot copies the bytes too."""
    if stats_mod.FUSED_CRC is None:
        pytest.skip("no C CRC-32 function (isal)")
    buf = _data(n, kind, n % 97 + kind)
    data = (buf.astype(np.uint32) << 16).tobytes() if kind == KIND_BF16 else buf.tobytes()
    got = NATIVE.reduce_crc_at(buf.ctypes.data, n, kind, stats_mod.FUSED_CRC)
    assert got[6] == zlib.crc32(data)
    assert got[:6] == _serial(fake_team, lambda: NATIVE.reduce_at(buf.ctypes.data, n, kind))
    copy, reduced = NATIVE.snapshot_at(buf.ctypes.data, n, kind, stats_mod.FUSED_CRC, False, 4096)
    assert bytes(copy) == buf.tobytes() and reduced == got
    alone = _serial(fake_team, lambda: NATIVE.reduce_crc_at(buf.ctypes.data, n, kind, stats_mod.FUSED_CRC))
    assert alone == got
    assert fake_team.teams == [3, 3]


def test_other_threads_reduce_alone(fake_team):
    buf = _data(4 * CHUNK, KIND_F32, 9)
    out = []
    worker = threading.Thread(target=lambda: out.append(NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)))
    worker.start()
    worker.join()
    assert fake_team.teams == []
    assert out == [NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)]
    assert fake_team.teams == [3]


def test_one_thread_allowed_means_no_team(fake_team):
    fake_team.threads = 1
    buf = _data(4 * CHUNK, KIND_F32, 2)
    NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)
    assert fake_team.teams == []


def test_late_workers_back_off():
    """Workers that start late (another process on their core): the team's wall time is far
    above the caller's own share, and the next buffers are reduced on one thread for
    ``backoff`` seconds; with backoff 0 every large buffer is shared."""
    buf = _data(8 * CHUNK, KIND_F32, 4)
    late = FakeOpenMP(2, late=0.005)
    try:
        NATIVE.set_parallel(*late.addresses, 30.0)
        first = NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)
        second = NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)
        assert late.teams == [2] and first == second
        NATIVE.set_parallel(*late.addresses, 30.0)  # installing again resets the guard
        NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)
        assert late.teams == [2, 2]
        NATIVE.set_parallel(*late.addresses, 0)
        for _ in range(3):
            assert NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32) == first
        assert late.teams == [2, 2, 2, 2, 2]
    finally:
        _restore()


def test_late_teams_in_a_row_double_the_quiet_period():
    """Under lasting load each try costs a time slice: after late teams in a row the period
    on one thread doubles (backoff 0.2 s here: 0.2, then 0.4)."""
    buf = _data(8 * CHUNK, KIND_F32, 6)
    late = FakeOpenMP(2, late=0.005)
    try:
        NATIVE.set_parallel(*late.addresses, 0.2)
        NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)  # late: 0.2 s on one thread
        assert late.teams == [2]
        time.sleep(0.25)
        NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)  # tries again, late: 0.4 s
        assert late.teams == [2, 2]
        time.sleep(0.25)
        NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)  # still within the 0.4 s
        assert late.teams == [2, 2]
        time.sleep(0.25)
        late.late = 0.0
        NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)  # tries again
        assert late.teams == [2, 2, 2]
    finally:
        _restore()


def test_set_parallel_bad_arguments():
    with pytest.raises(TypeError, match="takes 5 addresses"):
        NATIVE.set_parallel(0, 0)
    with pytest.raises(ValueError, match="an address is 0"):
        NATIVE.set_parallel(1, 0, 0, 0, 0)
    for bad in (-1.0, math.nan, 1e9):
        with pytest.raises(ValueError, match="backoff"):
            NATIVE.set_parallel(0, 0, 0, 0, 0, bad)
    with pytest.raises(TypeError):
        NATIVE.set_parallel(0, 0, 0, 0, 0, "1")


def _maps(tmp_path, *paths):
    lines = [f"7f0000000000-7f0000001000 r-xp 00000000 fd:00 {i} {p}" for i, p in enumerate(paths, 1)]
    lines.append("7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]")
    f = tmp_path / "maps"
    f.write_text("\n".join(lines) + "\n")
    return str(f)


def test_openmp_runtime_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(torch._C, "has_openmp", True, raising=False)
    inside = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "lib", "libgomp.so.1")
    system = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
    assert omp_team.openmp_runtime(_maps(tmp_path, "/usr/lib/libc.so.6", inside, inside, system)) == inside
    assert omp_team.openmp_runtime(_maps(tmp_path, system, system)) == system
    assert omp_team.openmp_runtime(_maps(tmp_path, system, "/opt/intel/lib/libiomp5.so")) is None
    assert omp_team.openmp_runtime(_maps(tmp_path, "/usr/lib/libc.so.6")) is None
    assert omp_team.openmp_runtime(str(tmp_path / "missing")) is None
    monkeypatch.setattr(torch._C, "has_openmp", False, raising=False)
    assert omp_team.openmp_runtime(_maps(tmp_path, inside)) is None


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("MSPROBE_NO_NATIVE_THREADS", "1")
    assert omp_team.share_with_torch_threads(NATIVE) is False
    assert omp_team.share_with_torch_threads(None) is False


def test_not_shared_when_workers_sleep(monkeypatch):
    """With a passive wait policy every team would have to wake the workers first."""
    assert omp_team.workers_sleep({"OMP_WAIT_POLICY": "passive"})
    assert omp_team.workers_sleep({"GOMP_SPINCOUNT": "0"})
    assert not omp_team.workers_sleep({"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10000"})
    assert not omp_team.workers_sleep({})
    monkeypatch.delenv("MSPROBE_NO_NATIVE_THREADS", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert omp_team.share_with_torch_threads(NATIVE) is False  # set_parallel not called


def test_real_team_same_bits():
    """With PyTorch's own runtime: the output of a two-thread operator, shared and alone."""
    torch.manual_seed(0)
    y = torch.randn(512, 1024) @ torch.randn(1024, 1024)
    try:
        if not omp_team.share_with_torch_threads(NATIVE):
            pytest.skip("PyTorch's OpenMP runtime was not found")
        shared = NATIVE.reduce_at(y.data_ptr(), y.numel(), KIND_F32)
        NATIVE.set_parallel(0, 0, 0, 0, 0)
        alone = NATIVE.reduce_at(y.data_ptr(), y.numel(), KIND_F32)
    finally:
        _restore()
    assert shared == alone
    if stats_mod.FUSED_CRC is not None:
        try:
            assert omp_team.share_with_torch_threads(NATIVE)
            crc = NATIVE.reduce_crc_at(y.data_ptr(), y.numel(), KIND_F32, stats_mod.FUSED_CRC)
        finally:
            _restore()
        assert crc[:6] == shared and crc[6] == zlib.crc32(y.numpy().tobytes())
    a64 = y.double().numpy()
    assert (shared[0], shared[1]) == (a64.max(), a64.min())


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("MSPROBE_NO_NATIVE_THREADS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


def test_import_starts_no_team_so_forked_children_do_not_hang():
    """GNU OpenMP's threads do not survive fork(): a child whose parent's runtime had started a
    team hangs in its first parallel operator. Importing msprobe must start none."""
    code = """
import os, signal, sys, torch
torch.set_num_threads(2)
import msprobe.pytorch, msprobe.pytorch.stats
from msprobe.pytorch import omp_team
assert not omp_team.sharing()
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang ends the child with SIGALRM
    y = torch.randn(512, 512) @ torch.randn(512, 512)
    os._exit(0 if y.shape == (512, 512) else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    proc = _run(code)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def test_fork_after_start_without_large_cpu_tensors(tmp_path):
    """start() hands the runtime over but starts no team: a process that records no CPU
    tensor of 65,536 elements (say a GPU training step) can still fork children that run
    multi-threaded operators."""
    code = f"""
import os, signal, sys, torch
torch.set_num_threads(2)
from msprobe.pytorch import PrecisionDebugger
d = PrecisionDebugger(task="statistics", dump_path={str(tmp_path)!r}, level="L1")
d.start()
y = torch.nn.functional.relu(torch.ones(100, 100))
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang ends the child with SIGALRM
    a = torch.randn(1500, 1500)
    os._exit(0 if (a @ a).shape == (1500, 1500) else 3)
_, status = os.waitpid(pid, 0)
d.stop()
sys.exit(os.waitstatus_to_exitcode(status))
"""
    proc = _run(code)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def test_start_shares_on_the_training_thread(tmp_path):
    """The first recorded step hands PyTorch's runtime to the pass (where one is found), and
    the statistics are those of numpy float64."""
    code = f"""
import json, sys, numpy as np, torch
torch.set_num_threads(2)
from msprobe.pytorch import PrecisionDebugger, omp_team
from msprobe.pytorch.stats import NATIVE
assert not omp_team.sharing()
d = PrecisionDebugger(task="statistics", dump_path={str(tmp_path)!r}, level="L1")
x = torch.randn(400, 300, generator=torch.Generator().manual_seed(1))
d.start()
y = torch.nn.functional.relu(x)
d.stop()
d.step()
found = omp_team.openmp_runtime() is not None and NATIVE is not None
assert omp_team.sharing() == found, (omp_team.sharing(), found)
entry = json.load(open({str(tmp_path / "step0" / "rank" / "dump.json")!r}))["data"]["Functional.relu.0.forward"]
out = entry["output"][0]
ref = np.maximum(x.double().numpy(), 0.0)
assert (out["Max"], out["Min"]) == (ref.max(), ref.min())
assert abs(out["Mean"] - ref.mean()) <= 1e-12 * abs(ref).mean()
assert abs(out["Norm"] - np.sqrt((ref * ref).sum())) <= 1e-12 * np.sqrt((ref * ref).sum())
print("shared" if found else "alone")
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_set_parallel_from_another_thread_while_reducing():
    """One thread switches the runtime off and on while the owner reduces: every reduction
    sees one whole runtime or none (no crash, same bits)."""
    code = """
import sys, threading, numpy as np, torch
torch.set_num_threads(2)
from msprobe.pytorch import omp_team
from msprobe.pytorch.stats import NATIVE
a = np.random.default_rng(0).standard_normal(70000).astype(np.float32)
alone = NATIVE.reduce_at(a.ctypes.data, a.size, 0)
addresses = omp_team.runtime_addresses()
if addresses is None:
    raise SystemExit(0)
sys.setswitchinterval(1e-5)  # switch threads often
stop = False
def off():
    while not stop:
        NATIVE.set_parallel(0, 0, 0, 0, 0)
t = threading.Thread(target=off)
t.start()
try:
    for _ in range(2000):
        NATIVE.set_parallel(*addresses)
        assert NATIVE.reduce_at(a.ctypes.data, a.size, 0) == alone
finally:
    stop = True
    t.join()
"""
    proc = _run(code, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def test_only_the_setting_thread_shares_even_when_thread_ids_are_reused():
    """The owner is the thread that called set_parallel, by thread-local state: a thread
    started after it exited (glibc reuses its id) starts no team."""
    fake = FakeOpenMP(2)
    buf = _data(8 * CHUNK, KIND_F32, 8)
    setter = threading.Thread(target=lambda: NATIVE.set_parallel(*fake.addresses, 0.0))
    try:
        setter.start()
        setter.join()
        results = []
        for _ in range(20):
            worker = threading.Thread(target=lambda: results.append(
                NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)))
            worker.start()
            worker.join()
        results.append(NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32))  # this thread: not the owner
        assert fake.teams == []
        assert len(set(results)) == 1
    finally:
        _restore()

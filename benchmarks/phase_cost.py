"""Wall time per recorder phase inside real recorded steps of the encoder workload
(perf_counter wrappers around the recorder's entry points: inclusive times, per step and
per call). Unlike cProfile it adds ~1 µs per wrapped call, not per Python function, and
unlike microbenchmarks it measures the code with the cache state of a training step
(the same Python runs 3-5x slower there than in a tight loop). Not a test.

    python benchmarks/phase_cost.py [--config l1_stats] [--threads 1] [--steps 6] [--no-fused]

--no-fused: summary_mode md5 with the two-pass statistics + CRC-32 (``stats.FUSED_CRC = None``,
the path without isal or the extension), to compare with the fused pass. With
``--config l1_tensor`` the payload capture (snapshot copy, content key), the waits for the
payload writer thread and the moving/linking of the tensor files are listed too.
"""
import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--config", default="l1_stats", help="a recording configuration of benchmarks/workloads.py")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--no-fused", action="store_true", help="md5: two passes (stats.FUSED_CRC = None)")
args = p.parse_args()
import torch  # noqa: E402
torch.set_num_threads(args.threads)
from workloads import build_encoder, config_json  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from msprobe.pytorch import backward as B, leaves as L, recorder as R, stats as STT  # noqa: E402
from msprobe.core import session as S, stack as ST  # noqa: E402
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(cls, name, label):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: acc[label] += time.perf_counter() - t; cnt[label] += 1
    setattr(cls, name, w)
for cls, name in [(R.Recorder, "record_api"), (R.Recorder, "_api_before"), (R.Recorder, "_api_after"),
                  (B.BackwardTaps, "tap_inputs"), (B.BackwardTaps, "tap_outputs"), (R.Recorder, "emit"),
                  (R.Recorder, "_on_grad"), (R.Recorder, "module_pre"), (R.Recorder, "module_post"),
                  (L.LeafBuilder, "tensor_leaf"), (ST.StackInterner, "capture"), (S.Session, "stop"), (S.Session, "start"),
                  (S.Session, "end_step"), (R.Recorder, "parameter_grad")]:
    wrap(cls, name, f"{cls.__name__}.{name}")
if args.no_fused:
    STT.FUSED_CRC = None
# the statistics / CRC-32 entry points as the leaf builder calls them (module attributes)
for mod, name in [(L, "tensor_stats"), (L, "crc32_hex"), (STT, "fused_stats_crc")]:
    if hasattr(mod, name):
        wrap(mod, name, name)
# task tensor: the payload capture (snapshot copy, content key, queue) and where the step
# waits for the payload writer thread (flush at stop()/step()) and moves/links its files
from msprobe.pytorch import payload as P  # noqa: E402
from store import export as E, payload_writer as PW  # noqa: E402
for obj, name, label in [(P.PayloadCapture, "__call__", "PayloadCapture (task tensor)"),
                         (P, "tensor_bytes", "tensor_bytes (snapshot copy)"),
                         (PW.PayloadWriter, "put", "PayloadWriter.put"), (PW, "content_key", "content_key (XXH3-128)"),
                         (PW.PayloadWriter, "flush", "PayloadWriter.flush (waits for the writer)"),
                         (E, "export_tensors", "export_tensors (move/link files)")]:
    wrap(obj, name, label)
orig = STT._native_reduce
def nr(x):
    t = time.perf_counter()
    try: return orig(x)
    finally: acc["_native_reduce"] += time.perf_counter() - t; cnt["_native_reduce"] += 1
STT._native_reduce = nr
model, train_step = build_encoder(4)
scratch = tempfile.mkdtemp()
cfg_path = os.path.join(scratch, "c.json"); json.dump(config_json(args.config, os.path.join(scratch, "dump")), open(cfg_path, "w"))
dbg = PrecisionDebugger(config_path=cfg_path)
def step(): dbg.start(model); train_step(); dbg.stop(); dbg.step()
for i in range(2): step()
acc.clear(); cnt.clear(); N = args.steps
t = time.perf_counter()
for i in range(N): step()
print(f"{args.config}, {args.threads} thread(s): recorded step {(time.perf_counter()-t)/N*1e3:.1f} ms (inclusive times; nested phases overlap)")
for k in sorted(acc, key=acc.get, reverse=True): print(f"{k:30s} {acc[k]/N*1e3:7.2f} ms/step  {cnt[k]/N:6.0f} calls/step  {acc[k]/max(cnt[k],1)*1e6:7.1f} us/call")
dbg.close()
shutil.rmtree(scratch, ignore_errors=True)

"""Benchmark workloads and the child-process runner used by ``benchmarks/overhead.py``.

This file is run as a script in a fresh interpreter for every measurement::

    python workloads.py --workload encoder --layers 4 --config l1_stats \
        --dump-path /tmp/x/dump --config-path /tmp/x/config.json --result /tmp/x/result.json

It builds the workload, optionally constructs ``msprobe.pytorch.PrecisionDebugger`` (whichever
``msprobe`` the interpreter finds: ours via PYTHONPATH, or upstream mindstudio-probe installed in
another virtual environment), runs one warm-up step and N timed steps, and writes a JSON result
(step times, RSS, which msprobe was imported) to ``--result``.  It does not import anything from
this repository unless the parent puts the repository on PYTHONPATH.

Not a test module: pytest does not collect it (no ``test_`` prefix, no test functions).
"""

import argparse
import importlib.util
import json
import os
import resource
import sys
import time

# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------

# name -> (task, level, summary_mode, mode)
#   mode "record":  start(model) / stop() / step() around the warm-up and every timed step
#   mode "stopped": start(model) then stop() once before the warm-up; the steps run with the
#                   hooks installed but the recorder switched off (no start/stop/step calls)
#   mode "finished": config step [0]: the warm-up step is recorded (the last step of the
#                   list), the timed steps call start(model) / stop() / step() and record
#                   nothing (step() of the last step removed the hooks)
#   mode "none":    msprobe is not imported at all
CONFIGS = {
    "none": (None, None, None, "none"),
    "l1_stats": ("statistics", "L1", "statistics", "record"),
    "mix_stats": ("statistics", "mix", "statistics", "record"),
    "l1_md5": ("statistics", "L1", "md5", "record"),
    "mix_md5": ("statistics", "mix", "md5", "record"),
    # the replica-check combination of docs/distributed.md: module parameters (and inputs) only
    "l0_params_md5": ("statistics", "L0", "md5", "record"),
    "l1_tensor": ("tensor", "L1", "statistics", "record"),
    "mix_stopped": ("statistics", "mix", "statistics", "stopped"),
    "mix_finished": ("statistics", "mix", "statistics", "finished"),
}
#: data_mode of the configurations that do not record everything (default ["all"])
DATA_MODE = {"l0_params_md5": ["forward", "input"]}


def config_json(name, dump_path):
    """The config.json content for configuration ``name`` (None for ``none``)."""
    task, level, summary_mode, mode = CONFIGS[name]
    if task is None:
        return None
    return {
        "task": task,
        "dump_path": dump_path,
        "rank": [],
        "step": [0] if mode == "finished" else [],
        "level": level,
        "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": DATA_MODE.get(name, ["all"]),
                       "summary_mode": summary_mode},
        "tensor": {"scope": [], "list": [], "data_mode": ["all"], "file_format": "npy"},
    }


# --------------------------------------------------------------------------------------------
# Workloads: each returns (model, train_step) where train_step() runs forward, backward and the
# optimizer step once.
# --------------------------------------------------------------------------------------------

#: sizes of the encoder workloads: ``encoder`` is compute-bound on a CPU (tens of ms of kernels
#: per step); ``dispatch`` is the same model shrunk until the host time per call decides the
#: step time, as on a GPU (about 7 ms per step on one CPU thread for ~320 API calls)
ENCODER_SIZES = {
    "encoder": dict(vocab=1000, d_model=256, nhead=4, ff=1024, batch=8, seq=128),
    "dispatch": dict(vocab=1000, d_model=32, nhead=4, ff=128, batch=2, seq=16),
}


def build_encoder(layers=4, seed=0, device="cpu", size="encoder"):
    """The encoder workload (``size``: a key of :data:`ENCODER_SIZES`); one fixed batch
    reused every step. On a CUDA device each step ends with ``torch.cuda.synchronize()`` so
    that its time includes the device work."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    dims = ENCODER_SIZES[size]
    vocab, d_model, batch, seq = dims["vocab"], dims["d_model"], dims["batch"], dims["seq"]

    class EncoderLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model=d_model, nhead=dims["nhead"], dim_feedforward=dims["ff"], dropout=0.0, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    model = EncoderLM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def train_step():
        opt.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        sync()
        return loss

    return model, train_step


LM_NEEDS = ("seed_everything", "load_text", "make_vocab", "make_batches", "build_model")


def load_char_lm(repo_root):
    """Import examples/char_lm.py by file path (the repository itself stays off sys.path).

    Returns the module, or None when the file does not exist."""
    path = os.path.join(repo_root, "examples", "char_lm.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("msprobe_bench_char_lm", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def build_lm(repo_root, steps):
    """The README's example language model (examples/char_lm.py), trained as its ``train()``
    does (seed, AdamW at its LEARNING_RATE, CrossEntropyLoss, model.train()), one batch from
    its ``make_batches`` per step, without its own recorder: the harness adds that.

    Raises LookupError (the parent prints it and skips the workload) when the file or one of
    the builders it needs (LM_NEEDS) is missing."""
    import torch
    import torch.nn as nn

    mod = load_char_lm(repo_root)
    if mod is None:
        raise LookupError("examples/char_lm.py does not exist")
    missing = [n for n in LM_NEEDS if not callable(getattr(mod, n, None))]
    if missing:
        raise LookupError("examples/char_lm.py lacks %s" % ", ".join(missing))
    mod.seed_everything()
    text = mod.load_text()
    vocab = mod.make_vocab(text)
    batches = mod.make_batches(text, vocab, steps)
    model = mod.build_model(len(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=getattr(mod, "LEARNING_RATE", 3e-3))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    it = iter(batches)

    def train_step():
        x, y = next(it)
        opt.zero_grad()
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    return model, train_step


# --------------------------------------------------------------------------------------------
# Child runner
# --------------------------------------------------------------------------------------------

def _vm_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def run_child(args):
    if args.import_dynamo:
        # mindstudio-probe 1.2.2 wraps torch.ops.aten; a later lazy import of torch._dynamo
        # (optimizer.step does one) then crashes with KeyError: AtenOPTemplate (spec section 8,
        # item 26).  Importing it up front, in every child, keeps the configurations comparable.
        import torch._dynamo  # noqa: F401
    import torch

    torch.set_num_threads(args.threads)
    result = {"workload": args.workload, "layers": args.layers, "config": args.config,
              "python": sys.executable, "torch": torch.__version__, "msprobe_file": None,
              "device": args.device}

    if args.workload in ENCODER_SIZES:
        model, train_step = build_encoder(args.layers, device=args.device, size=args.workload)
    elif args.device != "cpu":
        raise SystemExit("--device applies to the encoder workloads only")
    elif args.workload == "lm":
        try:
            model, train_step = build_lm(args.repo_root, args.steps + 1)
        except LookupError as exc:
            result["skipped"] = str(exc)
            return result
    else:
        raise SystemExit("unknown workload %r" % args.workload)

    _task, _level, _summary, mode = CONFIGS[args.config]
    dbg = None
    if mode != "none":
        cfg = config_json(args.config, args.dump_path)
        with open(args.config_path, "w") as f:
            json.dump(cfg, f)
        import msprobe
        from msprobe.pytorch import PrecisionDebugger

        result["msprobe_file"] = getattr(msprobe, "__file__", None) or str(list(getattr(msprobe, "__path__", [])))
        dbg = PrecisionDebugger(config_path=args.config_path, dump_path=args.dump_path)
        if mode == "stopped":
            dbg.start(model)
            dbg.stop()

    record = mode in ("record", "finished")

    def one_step():
        c0 = time.process_time()
        t0 = time.perf_counter()
        if record:
            dbg.start(model)
        t1 = time.perf_counter()
        loss = train_step()
        t2 = time.perf_counter()
        if record:
            dbg.stop()
            dbg.step()
        t3 = time.perf_counter()
        c3 = time.process_time()
        return t3 - t0, (t1 - t0) + (t3 - t2), c3 - c0, float(loss.detach())

    one_step()  # warm-up: identical to a timed step (recorded too, when the config records)
    rss_after_warmup = _vm_kib("VmRSS")
    times, dbg_times, cpu_times, rss, losses = [], [], [], [], []
    for _ in range(args.steps):
        total, in_dbg, cpu, loss = one_step()
        times.append(total)
        dbg_times.append(in_dbg)
        cpu_times.append(cpu)
        losses.append(loss)
        rss.append(_vm_kib("VmRSS"))

    result.update(
        step_times=times,
        debugger_call_times=dbg_times,
        cpu_times=cpu_times,
        losses=losses,
        rss_kib_after_warmup=rss_after_warmup,
        rss_kib_per_step=rss,
        vm_hwm_kib=_vm_kib("VmHWM"),
        ru_maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        recorded_steps=(args.steps + 1) if mode == "record" else 1 if mode == "finished" else 0,
    )
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="encoder", choices=sorted(ENCODER_SIZES) + ["lm"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--config", default="none", choices=sorted(CONFIGS))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="torch device of the encoder workload (cpu, cuda)")
    p.add_argument("--dump-path", default="./bench_dump")
    p.add_argument("--config-path", default="./bench_config.json")
    p.add_argument("--repo-root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--no-import-dynamo", dest="import_dynamo", action="store_false")
    p.add_argument("--result", help="write the JSON result here (default: stdout)")
    args = p.parse_args(argv)
    result = run_child(args)
    text = json.dumps(result)
    if args.result:
        with open(args.result, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

"""Train a zoo model with and without the recorder and check the dump against values
computed here.

:func:`train` runs the seeded script of a :class:`zoo_models.Case` for :data:`STEPS`
steps: unrecorded, recorded (``dbg`` given), or probed (``probe=True``: forward hooks
note every submodule call, and tensor hooks on its outputs note which received a gradient
and what gradient). :func:`check` compares a recorded run with the unrecorded one and its
dump with the probe, and returns a :class:`Report`; the tests assert on it and
``python tests/zoo/zoo_harness.py`` prints the table model x level.

Names are the recorder's (docs/pytorch.md, Levels): ``Module.{path}.{Class}.forward.{n}``
and ``.backward.{n}``, ``n`` counting the calls of that module in the step (activation
checkpointing's recomputation included), ``Module.{path}.{Class}.parameters_grad`` with
one key per parameter the module owns directly, and ``Module.model.{Class}.parameters_grad``
for the parameters of the root model.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
from pathlib import Path
from typing import Any, Optional

import torch

# the PyTorch tests' helpers (tests/pytorch/pt_helpers.py), for the zoo tests too
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch"))
from pt_helpers import assert_record, load_dump, np_stats  # noqa: E402,F401

from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from msprobe.pytorch.stats import NATIVE  # noqa: E402

STEPS = 2
#: relative tolerance of Mean/Norm against float64 numpy/torch: msprobe sums float32 and
#: lower in float64 in its native pass (error ~1e-15 of the sum); without the extension
#: tensors above 4096 elements take float32 cascaded sums
RTOL = 1e-9 if NATIVE is not None else 1e-6
#: relative tolerance of backward ``input`` statistics against a boundary probe run
#: (:func:`grad_match`)
BWD_RTOL = 1e-5

#: (level, task) pairs a case can be run at
LEVELS = {"L0": ("L0", "statistics"), "L1": ("L1", "statistics"), "mix": ("mix", "statistics"),
          "L1-tensor": ("L1", "tensor"), "mix-tensor": ("mix", "tensor")}


class _Errors(logging.Handler):
    """Collects the ERROR records of the ``msprobe`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _map(value: Any, path: tuple, fn, depth: int = 0) -> Any:
    """``value`` with each tensor ``t`` at ``path`` replaced by ``fn(t, path)``, keyed as
    the recorder keys a forward record (lists/tuples by index, dicts by key, namedtuples
    and dataclasses by field); an HF ``ModelOutput`` is updated in place."""
    if isinstance(value, torch.Tensor):
        return fn(value, path)
    if depth >= 4:
        return value
    if isinstance(value, dict):
        if dataclasses.is_dataclass(value):  # ModelOutput: item and attribute in one
            for k, v in list(value.items()):
                value[k] = _map(v, path + (str(k),), fn, depth + 1)
            return value
        return type(value)((k, _map(v, path + (str(k),), fn, depth + 1)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        fields = getattr(value, "_fields", None)
        if fields is not None:
            return type(value)(*(_map(v, path + (str(f),), fn, depth + 1) for f, v in zip(fields, value)))
        return type(value)(_map(v, path + (i,), fn, depth + 1) for i, v in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _map(getattr(value, f.name), path + (f.name,), fn, depth + 1)
                                             for f in dataclasses.fields(value) if f.init})
    return value


class Probe:
    """Hooks of the probed run: per step, the calls of each submodule (``calls``: how many
    began, which numbers the recorder's counter gives them; ``returned``: those whose
    forward returned, which get an entry: activation checkpointing stops its recomputation
    by raising inside the last module it needs), the gradients their outputs received, and
    the first module call's first tensor argument, and the calls made while backward ran
    (``recompute``), and the outputs that are one of the call's input tensors handed back
    (``passthrough``: ``(prefix, n, path)``).

    ``grads[step][(prefix, n)][path]``: the gradient w.r.t. that output tensor, its total
    one; with ``boundary`` the one the caller's uses sent it (the hook returns a copy of each
    output tensor, which only the caller reads; a copy, not a view: a view the caller
    writes in place is replaced in the graph and its hook would never run). The copies
    change how autograd groups sums, so a boundary run is compared with tolerances, never
    bit for bit."""

    def __init__(self, net: torch.nn.Module, boundary: bool = False) -> None:
        self.net, self.boundary = net, boundary
        self.prefix = {}
        self.open: dict[int, list] = {}  # id(module) -> [(n, ids of its input tensors)] of calls in progress
        self.handles = []
        for name, m in net.named_modules():
            if name:
                self.prefix[id(m)] = f"Module.{name}.{type(m).__name__}"
                self.handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
                self.handles.append(m.register_forward_hook(self._post))
        self.calls: list[dict[str, int]] = []
        self.returned: list[set] = []
        self.recompute: list[set] = []
        self.passthrough: list[set] = []
        self.grads: list[dict[tuple, dict]] = []
        self.first: list[Optional[tuple]] = []

    def begin_step(self) -> None:
        self.calls.append({})
        self.returned.append(set())
        self.recompute.append(set())
        self.passthrough.append(set())
        self.grads.append({})
        self.first.append(None)

    def _pre(self, module, args, kwargs):
        if not self.calls:
            return None
        prefix = self.prefix[id(module)]
        calls = self.calls[-1]
        n = calls.get(prefix, 0)
        calls[prefix] = n + 1
        if torch._C._current_graph_task_id() != -1:  # runs inside backward: a recomputation
            self.recompute[-1].add((prefix, n))
        if self.first[-1] is None:
            found = [("input_args", i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            found += [("input_kwargs", k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
            if found:
                io, key, t = found[0]
                self.first[-1] = (f"{prefix}.forward.{n}", io, key, t.detach().clone())
        ids = set()
        _map((args, kwargs), (), lambda t, _: ids.add(id(t)) or t)
        self.open.setdefault(id(module), []).append((n, ids))
        return None

    def _post(self, module, args, output):
        if not self.calls:
            return None
        n, inputs = self.open[id(module)].pop()  # (a call that raised left its entry below)
        key = (self.prefix[id(module)], n)
        self.returned[-1].add(key)
        if not torch.is_grad_enabled():
            return None
        grads = self.grads[-1]

        def tap(t, path):
            if not t.requires_grad:
                return t
            if id(t) in inputs:
                self.passthrough[-1].add(key + (path,))
            if self.boundary:
                t = t.clone()
            t.register_hook(lambda g: grads.setdefault(key, {}).__setitem__(
                path, None if g is None else g.detach().clone()))
            return t

        if isinstance(output, (list, tuple)) and not hasattr(output, "_fields"):
            new = type(output)(_map(v, (i,), tap) for i, v in enumerate(output))
        else:
            new = _map(output, (0,), tap)
        return new if self.boundary else None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@dataclasses.dataclass
class Run:
    """What one run of a case produced, per step: the loss, every parameter's gradient
    (after backward) and value (after the optimizer step), by ``named_parameters`` name."""

    losses: list
    grads: list
    params: list
    batches: list
    probe: Optional[Probe] = None
    boundary: Optional[Probe] = None
    model: Any = None
    net: Any = None
    errors: tuple = ()
    disabled: bool = False


def train(case, dbg: Optional[PrecisionDebugger] = None, probe: bool = False, boundary: bool = False) -> Run:
    """Run ``case``'s seeded training for :data:`STEPS` steps: recorded between
    ``dbg.start(net)`` and ``dbg.stop()``/``dbg.step()`` when ``dbg`` is given (closed at
    the end), probed with :class:`Probe` (``Probe(net, boundary)``) when ``probe``."""
    torch.manual_seed(0)
    model = case.build()
    opt = case.optim(model.parameters())
    net = case.wrap(model)
    if case.warmup:
        with case.context():
            loss = case.loss(net, case.batch(-1))
        loss.backward()
        opt.zero_grad(set_to_none=True)
    p = Probe(net, boundary) if probe else None
    if p and net is not model:
        # a wrapped model (torch.compile) is probed eagerly: hooks inside a compiled region
        # are traced, not run; the names are the wrapper's (``_orig_mod.``)
        net = model
    errors = _Errors()
    log = logging.getLogger("msprobe")
    log.addHandler(errors)
    run = Run([], [], [], [], probe=p, model=model, net=p.net if p else net)
    try:
        for _ in range(STEPS):
            batch = case.batch(len(run.losses))
            if p:
                p.begin_step()
            if dbg:
                dbg.start(net)
            with case.context():
                loss = case.loss(net, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if dbg:
                dbg.stop()
                dbg.step()
            run.losses.append(loss.detach().clone())
            run.grads.append({n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None})
            run.params.append({n: q.detach().clone() for n, q in model.named_parameters()})
            run.batches.append(batch)
        if dbg:
            run.disabled = bool(dbg.session.disabled)
            dbg.close()
    finally:
        log.removeHandler(errors)
        if p:
            p.remove()
    run.errors = tuple(errors.messages)
    return run


def same_training(a: Run, b: Run) -> list[str]:
    """What differs between two runs' losses, gradients and parameters (``torch.equal``);
    empty when they are bit-identical."""
    diffs = []
    for s in range(STEPS):
        if not torch.equal(a.losses[s], b.losses[s]):
            diffs.append(f"step {s} loss {a.losses[s].item()!r} != {b.losses[s].item()!r}")
        for what, x, y in (("grad", a.grads[s], b.grads[s]), ("param", a.params[s], b.params[s])):
            if x.keys() != y.keys():
                diffs.append(f"step {s} {what}s of {sorted(x.keys() ^ y.keys())} present in one run only")
            diffs += [f"step {s} {what} {n}" for n in x if n in y and not torch.equal(x[n], y[n])]
    return diffs


def _close(a: Optional[float], b: float, rtol: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=rtol, abs_tol=1e-30)


def stats_match(rec: Optional[dict], t: torch.Tensor, rtol: float = RTOL) -> bool:
    """True if the dump record ``rec`` holds ``t``'s dtype, shape and statistics (Max/Min
    exact, Mean/Norm within ``rtol`` of float64 numpy)."""
    if not isinstance(rec, dict) or rec.get("dtype") != str(t.dtype) or rec.get("shape") != list(t.shape):
        return False
    exp = np_stats(t)
    return (rec["Max"] == exp["Max"] and rec["Min"] == exp["Min"]
            and _close(rec["Mean"], exp["Mean"], rtol) and _close(rec["Norm"], exp["Norm"], rtol))


def grad_match(rec: Optional[dict], g: torch.Tensor, total: torch.Tensor) -> bool:
    """True if the backward ``input`` record ``rec`` holds the gradient ``g`` the caller's
    uses sent an output (from a boundary probe run), where ``total`` is the output's whole
    gradient. Both the probe (another grouping of autograd's sums) and the recorder (the
    caller's part as ``total`` less the module's own uses, in float32) round per element
    within a few float32 ulps of ``|total|``: Max/Min/Mean within 1e-6 of max ``|total|``,
    Norm within 1e-6 of ``total``'s Norm, beyond :data:`BWD_RTOL` of the value."""
    if not isinstance(rec, dict) or rec.get("dtype") != str(g.dtype) or rec.get("shape") != list(g.shape):
        return False
    exp, tot = np_stats(g), np_stats(total)
    scale = {"Max": max(abs(tot["Max"]), abs(tot["Min"])), "Norm": tot["Norm"]}
    scale["Min"] = scale["Mean"] = scale["Max"]
    return all(rec[k] is not None and abs(rec[k] - exp[k]) <= BWD_RTOL * abs(exp[k]) + 1e-6 * scale[k]
               for k in exp)


def _at(record: Any, path: tuple) -> Any:
    for k in path:
        if isinstance(record, list) and isinstance(k, int) and k < len(record):
            record = record[k]
        elif isinstance(record, dict) and str(k) in record:
            record = record[str(k)]
        else:
            return None
    return record


def owned_grads(net: torch.nn.Module, calls: dict, grads: dict) -> dict:
    """``{(parameters_grad entry, key): gradient}`` expected in a step whose module calls
    are ``calls``: each module that ran or sits inside one that ran, for each parameter it owns that got a gradient
    (the root's own ones under ``Module.model.{Class}``). ``grads``: by parameter object id."""
    out = {}
    named = [(n, m) for n, m in net.named_modules() if n]
    ran = {n for n, m in named if f"Module.{n}.{type(m).__name__}" in calls}
    # a module's parameters count when it or a module containing it ran (a parameter used
    # by its owner's parent, like MultiheadAttention.out_proj's, docs/pytorch.md)
    owners = [(f"Module.{n}.{type(m).__name__}", m) for n, m in named
              if any(n == r or n.startswith(r + ".") for r in ran)]
    if calls and any(True for _ in net.children()):
        owners.append((f"Module.model.{type(net).__name__}", net))
    for prefix, m in owners:
        for pname, q in m.named_parameters(recurse=False):
            if q.requires_grad and id(q) in grads:
                out[(f"{prefix}.parameters_grad", pname)] = grads[id(q)]
    return out


@dataclasses.dataclass
class Report:
    """The checks of one recorded run (one case at one level)."""

    case: str
    level: str
    identical: bool
    diffs: list
    errors: tuple
    fwd_expected: int = 0
    fwd_found: int = 0
    fwd_missing: list = dataclasses.field(default_factory=list)
    fwd_extra: list = dataclasses.field(default_factory=list)
    recompute_bad: list = dataclasses.field(default_factory=list)
    bwd_expected: int = 0
    bwd_found: int = 0
    bwd_missing: list = dataclasses.field(default_factory=list)
    bwd_input_checked: int = 0
    bwd_input_bad: list = dataclasses.field(default_factory=list)
    pgrad_expected: int = 0
    pgrad_found: int = 0
    pgrad_bad: list = dataclasses.field(default_factory=list)
    first_input_ok: bool = False
    api_entries: int = 0
    tensor_file_ok: Optional[bool] = None

    @property
    def pgrad_ok(self) -> bool:
        return self.pgrad_found == self.pgrad_expected and not self.pgrad_bad

    def row(self) -> str:
        """This report as a row of :data:`HEADER`."""
        def pct(a, b):
            return f"{100.0 * a / b:.0f}% ({a}/{b})" if b else "-"

        def ok(good, n):
            return f"{'yes' if good else 'NO'} ({n})" if n else "-"

        checked = self.bwd_input_checked
        first = "yes" if self.first_input_ok and self.tensor_file_ok is not False else "NO"
        return (f"| {self.case} | {self.level} | {'yes' if self.identical else 'NO'} | "
                f"{pct(self.fwd_found, self.fwd_expected)} | {pct(self.bwd_found, self.bwd_expected)} | "
                f"{ok(not self.bwd_input_bad, checked)} | {ok(self.pgrad_ok, self.pgrad_expected)} | {first} | "
                f"{'none' if not self.errors else 'YES'} |")


def check(case, level: str, dump: Path, reference: Run, probed: Run) -> Report:
    """Record ``case`` at ``level`` (a key of :data:`LEVELS`) into ``dump`` and check it
    against the unrecorded ``reference`` run and the ``probed`` run (see the module doc)."""
    lvl, task = LEVELS[level]
    dbg = PrecisionDebugger(dump_path=str(dump), level=lvl, task=task)
    rec = train(case, dbg)
    diffs = same_training(reference, rec)
    errors = rec.errors + (("recording disabled",) if rec.disabled else ())
    rep = Report(case.name, level, not diffs, diffs, errors)
    probe = probed.probe
    modules = lvl in ("L0", "mix")
    first_ok = []
    for s in range(STEPS):
        data = load_dump(dump, s)[0]["data"]
        rep.api_entries += sum(1 for k in data if not k.startswith("Module."))
        fwd_names = {k for k in data if k.startswith("Module.") and ".forward." in k}
        if not modules:
            rep.fwd_extra += sorted(fwd_names)
            batch = rec.batches[s][case.first_input]
            first_ok.append(_first_api_input_ok(data, batch, dump / f"step{s}" / "rank" if task == "tensor" else None, rep))
            continue
        calls = probe.calls[s]
        expected = {f"{p}.forward.{n}" for p, n in probe.returned[s]}
        rep.fwd_expected += len(expected)
        rep.fwd_found += len(expected & fwd_names)
        rep.fwd_missing += sorted(expected - fwd_names)
        rep.fwd_extra += sorted(fwd_names - expected)
        rep.recompute_bad += [f"{p}.forward.{n}" for p, n in probe.returned[s] if f"{p}.forward.{n}" in data
                              and data[f"{p}.forward.{n}"].get("is_recompute") != ((p, n) in probe.recompute[s])]
        for (prefix, n), grads in probe.grads[s].items():
            name = f"{prefix}.backward.{n}"
            rep.bwd_expected += 1
            if name not in data:
                rep.bwd_missing.append(name)
                continue
            rep.bwd_found += 1
            callers = probed.boundary.grads[s].get((prefix, n), {})
            for path, total in grads.items():
                if total is None:
                    continue
                # an input handed back unchanged has no node of the call: the recorder
                # gives its whole gradient, other uses included (docs/pytorch.md)
                g = total if (prefix, n, path) in probe.passthrough[s] else callers.get(path)
                rep.bwd_input_checked += 1
                if not grad_match(_at(data[name].get("input"), path), torch.zeros_like(total) if g is None else g,
                                  total):
                    rep.bwd_input_bad.append(f"{name} input{list(path)}")
        by_id = {id(q): reference.grads[s][n] for n, q in probed.model.named_parameters() if n in reference.grads[s]}
        owned = owned_grads(probed.net, calls, by_id)
        rep.pgrad_expected += len(owned)
        for (entry, key), g in owned.items():
            record = data.get(entry, {}).get(key)
            record = record[0] if isinstance(record, list) and record else record
            if record is None:
                rep.pgrad_bad.append(f"{entry}[{key}] missing")
                continue
            rep.pgrad_found += 1
            if not (_close(record.get("Norm"), float(g.double().norm()), RTOL) and stats_match(record, g)):
                rep.pgrad_bad.append(f"{entry}[{key}] Norm {record.get('Norm')} != {float(g.double().norm())}")
        extra = sum(1 for k, v in data.items() if k.endswith(".parameters_grad")
                    for key in v if (k, key) not in owned)
        if extra:
            rep.pgrad_bad.append(f"{extra} parameters_grad records not expected")
        first = probe.first[s]
        if first is not None:
            fname, io, key, t = first
            record = _at(data.get(fname, {}).get(io), (key,))
            first_ok.append(stats_match(record, t) and torch.equal(t, rec.batches[s][case.first_input]))
            if task == "tensor":
                path = dump / f"step{s}" / "rank" / "dump_tensor_data" / str((record or {}).get("data_name"))
                ok = path.is_file() and torch.equal(torch.load(path, weights_only=True), t)
                rep.tensor_file_ok = ok and rep.tensor_file_ok is not False
    rep.first_input_ok = bool(first_ok) and all(first_ok)
    return rep


def _first_api_input_ok(data: dict, batch: torch.Tensor, rank_dir: Optional[Path], rep: Report) -> bool:
    """At L1: the first API entry that takes a tensor of the batch's dtype and shape holds
    the batch's statistics (and, with task tensor, its values in the ``.pt`` file under
    ``rank_dir``)."""
    for name, entry in data.items():
        for rec in entry.get("input_args", []) or []:
            if isinstance(rec, dict) and rec.get("dtype") == str(batch.dtype) and rec.get("shape") == list(batch.shape):
                ok = stats_match(rec, batch)
                if rank_dir is not None:
                    path = rank_dir / "dump_tensor_data" / str(rec.get("data_name"))
                    rep.tensor_file_ok = path.is_file() and torch.equal(torch.load(path, weights_only=True), batch) \
                        if rep.tensor_file_ok is not False else False
                return ok
    return False


_REFERENCE: dict = {}


def reference_runs(case) -> tuple[Run, Run]:
    """The unrecorded run and the probed run of ``case`` (the latter with the boundary
    probe's run in ``boundary``), computed once per process."""
    if case.name not in _REFERENCE:
        ref, probed = train(case), train(case, probe=True)
        diffs = same_training(ref, probed) if probed.net is probed.model else []  # compiled vs eager may differ
        assert not diffs, f"the probe hooks changed the training of {case.name}: {diffs[:5]}"
        probed.boundary = train(case, probe=True, boundary=True).probe
        _REFERENCE[case.name] = ref, probed
    return _REFERENCE[case.name]


#: the table of :meth:`Report.row`: backward input = the gradients w.r.t. module outputs
#: (slots checked), parameters_grad = every record present and its Norm right (records)
HEADER = ("| model | level | bit-identical | forward coverage | backward coverage | backward input | "
          "parameters_grad | first input | internal error |\n|---|---|---|---|---|---|---|---|---|")

if __name__ == "__main__":
    import tempfile
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from zoo_models import CASES

    names = sys.argv[1:] or list(CASES)
    print(HEADER)
    with tempfile.TemporaryDirectory() as tmp:
        for cname in names:
            case = CASES[cname]
            ref, probed = reference_runs(case)
            for level in LEVELS:
                t0 = time.perf_counter()
                try:
                    r = check(case, level, Path(tmp) / cname / level, ref, probed)
                except Exception as exc:  # the training itself raised
                    print(f"| {cname} | {level} | raised {type(exc).__name__}: {str(exc)[:120]} |", flush=True)
                    continue
                print(r.row(), f"{time.perf_counter() - t0:.1f}s", flush=True)
                for what in ("diffs", "errors", "fwd_missing", "fwd_extra", "recompute_bad", "bwd_missing", "bwd_input_bad",
                             "pgrad_bad"):
                    items = getattr(r, what)
                    if items:
                        print(f"    {what}: {len(items)}: {list(items)[:6]}", flush=True)

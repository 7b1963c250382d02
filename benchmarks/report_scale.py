"""How ``msprobe report`` copes with a big recording: writes a synthetic log of STEPS steps
x MODULES modules (one forward output and one parameter gradient per module and step),
then times building the page and prints its size.

Usage: ``python benchmarks/report_scale.py [--steps 1000] [--modules 1000] [--nested] [--out DIR]``.
Prints the seconds to write the log, to build the report, the page's bytes, and the heat
map's drawn size (rows x columns after sampling and binning).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from msprobe.report import write_report  # noqa: E402
from store.log_writer import LogWriter  # noqa: E402
from store.records import Call, Leaf, Marker  # noqa: E402

META = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank"}


def leaf(io: str, value: float) -> Leaf:
    return Leaf(io=io, path=(0,), leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32", shape=(4,),
                numel=4, max=value, min=-value, mean=0.0, norm=2 * value, requires_grad=True,
                has_nan=False, has_inf=False)


def module_names(modules: int, nested: bool) -> list[tuple[str, str | None]]:
    """``[(module name without .forward.0, parent entry name or None)]`` in call order.
    Flat: ``Module.layers.{m}.Linear``. Nested: blocks of 10 modules, ``Module.blocks.{b}.Block``
    holding ``Module.blocks.{b}.fc{k}.Linear`` (k = 0..8), the children called first."""
    if not nested:
        return [(f"Module.layers.{m}.Linear", None) for m in range(modules)]
    out: list[tuple[str, str | None]] = []
    for b in range(modules // 10):
        block = f"Module.blocks.{b}.Block"
        out += [(f"Module.blocks.{b}.fc{k}.Linear", f"{block}.forward.0") for k in range(9)]
        out.append((block, None))
    return out


def write_log(path: Path, steps: int, modules: int, nested: bool = False) -> None:
    """A log of ``steps`` steps of ``modules`` modules (see :func:`module_names`), one
    float32 output of 4 elements and one parameter gradient per module and step."""
    names = module_names(modules, nested)
    with LogWriter(path, 0) as writer:
        writer.append_marker(Marker(step=0, kind="start", meta=META))
        for step in range(steps):
            for m, (name, parent) in enumerate(names):
                value = (1 + m % 7) * math.exp(0.002 * step)
                writer.append(Call(step=step, kind="module_forward", name=f"{name}.forward.0", api_type="Module",
                                   parent=parent, keys=("input_args", "input_kwargs", "output"),
                                   leaves=(leaf("output", value),)))
                writer.append(Call(step=step, kind="parameters_grad", name=f"{name}.parameters_grad",
                                   api_type="Module", keys=("weight",), leaves=(leaf("weight", value / 100),)))
            writer.append_marker(Marker(step=step, kind="step_end", meta=META))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--modules", type=int, default=1000)
    parser.add_argument("--out", default=None)
    parser.add_argument("--nested", action="store_true", help="modules in blocks of 10 (construct.json parents)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="msprobe-report-scale-"))
    t0 = time.perf_counter()
    write_log(out / "dump", args.steps, args.modules, args.nested)
    t1 = time.perf_counter()
    page = write_report(out / "dump", out / "report.html")
    t2 = time.perf_counter()
    text = page.read_text()
    data = json.loads(text.split("id='msprobe-data'>", 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
    heat = data["per_rank"]["0"]["output"]
    print(f"{args.steps} steps x {args.modules} modules: log written in {t1 - t0:.1f} s, "
          f"report built in {t2 - t1:.1f} s, page {len(text.encode()) / 1e6:.2f} MB, "
          f"heat map {len(heat['rows'])} x {len(heat['columns'])} (of {heat['rows_total']} x {heat['steps_total']}), "
          f"{page}")


if __name__ == "__main__":
    main()

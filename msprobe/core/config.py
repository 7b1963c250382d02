"""Read config.json into a frozen :class:`Config`; every bad value is a :class:`ConfigError`.

Implements spec section 5 (fields 5.1, precedence 5.2, validation 5.3, rank/step 5.6) with
the fixes of section 9: a file without ``task`` means ``statistics`` (fix 18) and the
dump path is checked when the debugger is constructed, not at ``start()`` (fix 18).
Nothing is created on disk here.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import tempfile
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

from msprobe.core.errors import MISSING, ConfigError
from msprobe.core.filters import DataMode, parse_int_list

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "Config",
    "FileFormat",
    "Framework",
    "Level",
    "LoadSpec",
    "Precision",
    "RiskLevel",
    "CompiledRegions",
    "SummaryMode",
    "Task",
    "load_config",
]

logger = logging.getLogger(__name__)

Task = Literal["statistics", "tensor", "structure"]
Level = Literal["L0", "L1", "L2", "mix", "debug"]
SummaryMode = Literal["statistics", "md5", "xor"]
Precision = Literal["low", "high"]
RiskLevel = Literal["ALL", "FOCUS", "CORE"]
CompiledRegions = Literal["root", "inside"]
FileFormat = Literal["npy", "bin"]
Framework = Literal["pytorch", "mindspore"]

TASKS: Final[tuple[str, ...]] = get_args(Task)
LEVELS: Final[tuple[str, ...]] = get_args(Level)
SUMMARY_MODES: Final[tuple[str, ...]] = get_args(SummaryMode)
FILE_FORMATS: Final[tuple[str, ...]] = get_args(FileFormat)
FRAMEWORKS: Final[tuple[str, ...]] = get_args(Framework)
PRECISIONS: Final[tuple[str, ...]] = get_args(Precision)
RISK_LEVELS: Final[tuple[str, ...]] = get_args(RiskLevel)
COMPILED_REGIONS: Final[tuple[str, ...]] = get_args(CompiledRegions)

#: The packaged default config (spec 5.1: used when no path is given).
DEFAULT_CONFIG_PATH: Final = Path(__file__).resolve().parent.parent / "config.json"

#: Built-in defaults below the config file (spec 5.2).
DEFAULT_TASK: Final = "statistics"
DEFAULT_LEVEL: Final = "L1"

#: Top-level keys this module reads; the task sub-objects are read by name.
_KNOWN_KEYS: Final = frozenset({"task", "dump_path", "rank", "step", "level", "async_dump", "api_list",
                                "extra_info", "precision", "risk_level", "dump_enable", "load",
                                "compiled_regions"})

#: Keys of the task sub-object this module reads: every task's, then each task's own.
_SUB_KEYS: Final = frozenset({"scope", "list", "data_mode"})
_TASK_KEYS: Final = {
    "statistics": frozenset({"summary_mode", "tensor_list"}),
    "tensor": frozenset({"summary_mode", "file_format", "bench_path", "diff_nums"}),
}

#: Scope endpoint patterns (spec 5.3).
_API_NAME_RE: Final = re.compile(
    r"(Distributed|Functional|Torch|Tensor|Mint|MintFunctional|Primitive|Aten|VF|NPU|Jit)"
    r"\..*\.\d+\.(forward|backward)",
    re.DOTALL,
)
_MODULE_NAME_RE: Final = re.compile(r"(Cell|Module)\..*\.(forward|backward)\.\d+", re.DOTALL)

#: a ``load.modules`` entry: a module forward's dump.json name (spec 2.1)
_LOAD_MODULE_RE: Final = re.compile(r"Module\.(.+)\.forward\.(\d+)", re.DOTALL)

_MAX_PATH_CHARS: Final = 4096
_MAX_NAME_CHARS: Final = 255


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    """The ``load`` object of config.json (upstream 26.x): module inputs replayed from an
    earlier tensor dump (:mod:`msprobe.pytorch.replay`, docs/pytorch-features.md).

    Attributes:
        path: the earlier dump's root (the directory holding ``step{N}/``).
        modules: module forward entry names, ``Module.{path}.{Class}.forward.{n}``.
        step: steps in which inputs are replaced (``()``: every step); the tensors come
            from the same step number of the earlier dump.
        rank: ranks in which inputs are replaced (``()``: every rank); the tensors come
            from the same rank of the earlier dump.
        dump_after_load: also record the run (False: only replace inputs, record nothing).
    """

    path: str
    modules: tuple[str, ...]
    step: tuple[int, ...] = ()
    rank: tuple[int, ...] = ()
    dump_after_load: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A validated dump configuration (spec 5.1). Build it with :func:`load_config`.

    Attributes:
        task: what is recorded per tensor: ``statistics``, ``tensor`` or ``structure``.
        dump_path: the output directory as configured (may be relative to the cwd).
        rank: ranks to record, sorted and distinct; ``()`` means all (spec 5.6).
        step: steps to record, sorted and distinct; ``()`` means all (spec 5.6).
        level: ``L0`` (modules), ``L1`` (APIs), ``L2`` (kernels), ``mix`` or ``debug``.
        async_dump: write asynchronously.
        scope: ``()`` or ``(first, last)`` entry names of an inclusive range (spec 5.5).
        list: substring filters on entry names (spec 5.5); ``()`` keeps everything.
        data_mode: values from ``all, forward, backward, input, output`` (spec 5.4).
        summary_mode: ``statistics``, ``md5`` (CRC-32 besides the statistics) or ``xor``
            (a 64-bit XOR fold instead of the statistics); read for tasks statistics and
            tensor.
        file_format: ``npy`` or ``bin``; read for task tensor only.
        framework: ``pytorch`` or ``mindspore``.
        api_list: path of the user's own API list YAML (``support_wrap_ops.yaml`` format)
            replacing the packaged one; None = the packaged list.
        extra_info: write stack.json and construct.json (False: dump.json only).
        precision: ``low`` or ``high`` (all statistics accumulated in float64).
        risk_level: ``ALL`` (every API of the list), ``FOCUS`` (without the low-risk
            shape, copy and creation APIs) or ``CORE`` (:mod:`msprobe.core.risk`).
        tensor_list: task statistics: substrings of entry names whose tensors are also
            saved in full (``()``: none).
        dump_enable: None when config.json has no ``dump_enable`` (no re-reading);
            else whether recording is switched on, and the file is re-read while the
            job runs (docs/pytorch-features.md).
        bench_path: task tensor with summary_mode md5: the root of a baseline recording
            (an msprobe dump path or an upstream dump directory) whose CRC-32s decide
            which calls keep their full tensors (:mod:`msprobe.core.bench`); None: all.
        diff_nums: with ``bench_path``: at most this many calls keep their tensors
            (``-1``: no limit).
        load: module inputs replayed from an earlier tensor dump (:class:`LoadSpec`);
            None without a ``load`` object.
        compiled_regions: PyTorch ``torch.compile``: ``root`` (the compiled module as a
            whole, graphs unchanged) or ``inside`` (also the modules and API calls traced
            into the graph, through an opaque recording op; :mod:`msprobe.pytorch.compiled_record`).
    """

    task: Task = "statistics"
    dump_path: str
    rank: tuple[int, ...] = ()
    step: tuple[int, ...] = ()
    level: Level = "L1"
    async_dump: bool = False
    scope: tuple[str, ...] = ()
    list: tuple[str, ...] = ()
    data_mode: tuple[str, ...] = ("all",)
    summary_mode: SummaryMode = "statistics"
    file_format: FileFormat = "npy"
    framework: Framework = "pytorch"
    api_list: str | None = None
    extra_info: bool = True
    precision: Precision = "low"
    risk_level: RiskLevel = "ALL"
    tensor_list: tuple[str, ...] = ()
    dump_enable: bool | None = None
    bench_path: str | None = None
    diff_nums: int = 1
    load: LoadSpec | None = None
    compiled_regions: CompiledRegions = "root"

    def step_selected(self, step: int) -> bool:
        """True if ``step`` is recorded: ``step`` is empty (all) or contains it."""
        return not self.step or step in self.step

    def rank_selected(self, rank: int) -> bool:
        """True if ``rank`` is recorded: ``rank`` is empty (all) or contains it.

        A non-distributed run counts as rank 0 (section 9, fix 18); the caller passes 0.
        """
        return not self.rank or rank in self.rank

    @property
    def last_step(self) -> int | None:
        """The largest selected step, after which recording stops for good (spec 5.6);
        ``None`` when every step is selected."""
        return self.step[-1] if self.step else None


def load_config(
    config_path: str | os.PathLike[str] | None = None,
    *,
    task: str | None = None,
    dump_path: str | None = None,
    level: str | None = None,
    step: list[int | str] | None = None,
    framework: str = "pytorch",
) -> Config:
    """Read, merge and validate a dump configuration.

    Args:
        config_path: a config.json; ``None`` reads the packaged default
            (``msprobe/config.json``).
        task, dump_path, level, step: ``PrecisionDebugger`` arguments; when not ``None``
            they override the file, which overrides the built-in defaults (task
            ``statistics``, level ``L1``; dump_path has none) (spec 5.2). The effective
            task selects the sub-object read for scope/list/data_mode/summary_mode/
            file_format (``task="tensor"`` reads ``json["tensor"]``).
        framework: ``pytorch`` or ``mindspore``.

    Returns:
        A frozen :class:`Config`. Task ``structure`` with level ``L1`` becomes level
        ``mix`` with a logged warning (spec 5.3).

    Raises:
        ConfigError: for an unreadable or invalid file and for every invalid value (spec
            5.3): unknown task/level, bad rank/step/scope/list/data_mode/summary_mode/
            file_format/async_dump/extra_info/dump_enable/precision/risk_level/tensor_list/
            bench_path/diff_nums/load/compiled_regions, async_dump with task tensor and an empty
            list, L2 with a scope or task structure, a dump_path that is
            missing, empty, a file, a symlink, or whose parent cannot be created, and an
            unknown top-level key close to an absent key that changes what is recorded
            (``"levle"``: "did you mean `level`?"). Other unknown keys are logged as
            warnings, with the closest key msprobe reads.

    Example: a file ``{"dump_path": "out", "step": [0, "2-4", 3]}`` with
    ``load_config(path, level="L0")`` gives ``task="statistics"``, ``level="L0"``,
    ``step=(0, 2, 3, 4)``.
    """
    framework = _choice("framework", framework, FRAMEWORKS)
    _check_argument("task", task, str)
    _check_argument("dump_path", dump_path, str)
    _check_argument("level", level, str)
    _check_argument("step", step, (list, tuple))

    doc = _read_document(DEFAULT_CONFIG_PATH if config_path is None else config_path)
    _check_unknown_keys(doc)

    eff_task = _choice("task", task if task is not None else doc.get("task", DEFAULT_TASK), TASKS)
    eff_level = _choice("level", level if level is not None else doc.get("level", DEFAULT_LEVEL), LEVELS)
    eff_dump_path = dump_path if dump_path is not None else doc.get("dump_path", MISSING)
    rank = parse_int_list("rank", doc.get("rank", []))
    eff_step = parse_int_list("step", step if step is not None else doc.get("step", []))
    api_list = doc.get("api_list")
    if api_list is not None and (not isinstance(api_list, str) or not os.path.isfile(api_list)):
        raise ConfigError("api_list", api_list, "the path of an existing YAML file (support_wrap_ops.yaml format)")
    async_dump = _flag(doc, "async_dump", False)
    extra_info = _flag(doc, "extra_info", True)
    dump_enable = _flag(doc, "dump_enable", None)
    precision = _choice("precision", doc.get("precision", "low"), PRECISIONS)
    risk_level = _choice("risk_level", doc.get("risk_level", "ALL"), RISK_LEVELS)
    compiled_regions = _choice("compiled_regions", doc.get("compiled_regions", "root"), COMPILED_REGIONS)

    sub = doc.get(eff_task, {})
    if not isinstance(sub, dict):
        raise ConfigError(eff_task, sub, f"a JSON object with the `{eff_task}` task's options")
    read = _SUB_KEYS | _TASK_KEYS.get(eff_task, frozenset())
    for key in sorted(sub.keys() - read):
        logger.warning("config.json: %s.%s is not read by msprobe; ignored (docs/pytorch-features.md)", eff_task, key)
    scope = _string_list(f"{eff_task}.scope", sub.get("scope", []))
    if len(scope) not in (0, 2):
        raise ConfigError(f"{eff_task}.scope", list(scope), "an empty list or exactly 2 entry names")
    names = _string_list(f"{eff_task}.list", sub.get("list", []))
    data_mode_value = sub.get("data_mode", ["all"])
    DataMode.from_config(data_mode_value, field=f"{eff_task}.data_mode")
    summary_mode = "statistics"
    if eff_task in ("statistics", "tensor"):
        summary_mode = _choice(f"{eff_task}.summary_mode", sub.get("summary_mode", "statistics"), SUMMARY_MODES)
    tensor_list: tuple[str, ...] = ()
    if eff_task == "statistics":
        tensor_list = _string_list("statistics.tensor_list", sub.get("tensor_list", []))
    file_format = "npy"
    bench_path, diff_nums = None, 1
    if eff_task == "tensor":
        file_format = _choice("tensor.file_format", sub.get("file_format", "npy"), FILE_FORMATS)
        if framework == "pytorch":  # MindSpore: a ConfigError below (_check_mindspore_keys)
            bench_path, diff_nums = _bench_options(sub, summary_mode, async_dump, data_mode_value)
    load = _load_options(doc) if "load" in doc and framework == "pytorch" else None
    if load is not None and not load.dump_after_load and eff_dump_path is MISSING:
        eff_dump_path = load.path  # nothing is recorded: the dump path is not used (as upstream)

    if eff_task == "structure" and eff_level == "L1":
        logger.warning("task `structure` does not support level L1; using level mix (spec 5.3)")
        eff_level = "mix"
    if async_dump and tensor_list:
        raise ConfigError("statistics.tensor_list", list(tensor_list), "[] when async_dump is true")
    if async_dump and eff_task == "tensor" and not names:
        raise ConfigError(
            "tensor.list", [], "a non-empty list of names when async_dump is true and task is tensor"
        )
    if framework == "mindspore":
        _check_mindspore_keys(doc, summary_mode, eff_task, precision, risk_level, tensor_list)
    _check_level_options(eff_task, eff_level, scope)
    _check_dump_path(eff_dump_path)
    if bench_path is not None and os.path.realpath(bench_path) == os.path.realpath(eff_dump_path):
        raise ConfigError("tensor.bench_path", bench_path, "a baseline dump other than dump_path",
                          "the run would write its log beside the baseline's")

    return Config(
        task=eff_task,
        dump_path=eff_dump_path,
        rank=rank,
        step=eff_step,
        level=eff_level,
        async_dump=async_dump,
        scope=scope,
        list=names,
        data_mode=tuple(data_mode_value),
        summary_mode=summary_mode,
        file_format=file_format,
        framework=framework,
        api_list=api_list,
        extra_info=extra_info,
        precision=precision,
        risk_level=risk_level,
        tensor_list=tensor_list,
        dump_enable=dump_enable,
        bench_path=bench_path,
        diff_nums=diff_nums,
        load=load,
        compiled_regions=compiled_regions,
    )


def _bench_options(sub: dict[str, Any], summary_mode: str, async_dump: bool,
                   data_mode: Any) -> tuple[str | None, int]:
    """``(bench_path, diff_nums)`` of the ``tensor`` sub-object (``(None, 1)`` without
    ``bench_path``). The baseline's contents are read when the debugger is built
    (:class:`msprobe.core.bench.BenchBaseline`); here its place is checked: an existing
    directory holding an msprobe log (``.msprobe/log/``) or a ``dump.json`` below it."""
    diff_nums = sub.get("diff_nums", 1)
    if isinstance(diff_nums, bool) or not isinstance(diff_nums, int) or not (diff_nums == -1 or diff_nums >= 1):
        raise ConfigError("tensor.diff_nums", diff_nums, "-1 (no limit) or a positive integer")
    if "bench_path" not in sub:
        if "diff_nums" in sub:
            logger.warning("config.json: tensor.diff_nums is read only with tensor.bench_path; ignored")
        return None, 1
    value = sub["bench_path"]
    allowed = "a directory holding a baseline dump: an msprobe dump path or step{N}/rank{R}/dump.json below it"
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ConfigError("tensor.bench_path", value, allowed)
    path = Path(value)
    if not path.is_dir():
        raise ConfigError("tensor.bench_path", value, allowed,
                          "it does not exist" if not path.exists() else "it is not a directory")
    if not (path / ".msprobe" / "log").is_dir() and not _has_dump_json(path):
        raise ConfigError("tensor.bench_path", value, allowed, "neither .msprobe/log/ nor a dump.json below it")
    if summary_mode != "md5":
        raise ConfigError("tensor.summary_mode", summary_mode, ("md5",),
                          "tensor.bench_path compares CRC-32s, recorded in summary_mode md5")
    if async_dump:
        raise ConfigError("async_dump", True, "false", "tensor.bench_path decides per call, while the call runs")
    modes = set(data_mode)
    if "all" not in modes and ("input" in modes) != ("output" in modes):
        raise ConfigError("tensor.data_mode", list(data_mode), "a data_mode recording both input and output",
                          "tensor.bench_path compares a call's inputs and outputs")
    return value, diff_nums


def _has_dump_json(root: Path) -> bool:
    """True if ``root`` holds a ``dump.json`` at most three directory levels down
    (``step{N}/rank{R}/dump.json``, or the step or rank directory itself)."""
    for pattern in ("dump.json", "*/dump.json", "*/*/dump.json"):
        if next(iter(root.glob(pattern)), None) is not None:
            return True
    return False


def _load_options(doc: dict[str, Any]) -> LoadSpec:
    """The top-level ``load`` object (upstream 26.x keys ``path``, ``modules``, ``step``,
    ``rank``, ``dump_after_load``) as a :class:`LoadSpec`.

    Checked here: the types, the entry-name form of each module, no duplicates, and that
    ``path`` is a directory where every module has at least one input tensor file
    (``step{N}/{rank dir}/dump_tensor_data/{module}.input.*`` or ``.kwargs.*``). That each
    module exists in the model is checked at ``start(model)``."""
    value = doc["load"]
    if not isinstance(value, dict):
        raise ConfigError("load", value, "a JSON object with path, modules, step, rank, dump_after_load")
    for key in sorted(value.keys() - {"path", "modules", "step", "rank", "dump_after_load"}):
        logger.warning("config.json: unknown key load.%s ignored", key)
    modules = value.get("modules", MISSING)
    entry_form = "a non-empty list of module forward names such as Module.layer1.Linear.forward.0"
    if not isinstance(modules, list) or not modules:
        raise ConfigError("load.modules", modules, entry_form)
    seen: set[str] = set()
    for name in modules:
        if not isinstance(name, str) or not _LOAD_MODULE_RE.fullmatch(name) or ".backward." in name:
            raise ConfigError("load.modules", name, entry_form)
        if name in seen:
            raise ConfigError("load.modules", name, entry_form, "listed twice")
        seen.add(name)
    path = value.get("path", MISSING)
    allowed = "the directory of an earlier tensor dump (holding step{N}/)"
    if not isinstance(path, str) or not path:
        raise ConfigError("load.path", path, allowed)
    if not os.path.isdir(path):
        raise ConfigError("load.path", path, allowed, "it does not exist" if not os.path.exists(path)
                          else "it is not a directory")
    found = _tensor_file_prefixes(Path(path))
    if not found:
        raise ConfigError("load.path", path, allowed, "no step*/*/dump_tensor_data/ with tensor files below it")
    for name in modules:
        if name not in found:
            raise ConfigError("load.modules", name, "a module whose input tensors the dump at load.path holds",
                              f"no {name}.input.* or {name}.kwargs.* file under {path!r}")
    dump_after_load = value.get("dump_after_load", False)
    if not isinstance(dump_after_load, bool):
        raise ConfigError("load.dump_after_load", dump_after_load, "true, false")
    return LoadSpec(path=path, modules=tuple(modules), step=parse_int_list("load.step", value.get("step", [])),
                    rank=parse_int_list("load.rank", value.get("rank", [])), dump_after_load=dump_after_load)


def _tensor_file_prefixes(root: Path) -> set[str]:
    """Module forward names with an input tensor file (``{entry}.input.*``, ``{entry}.kwargs.*``)
    in any ``step*/*/dump_tensor_data/`` under ``root`` (one directory listing each)."""
    found: set[str] = set()
    for data_dir in root.glob("step*/*/dump_tensor_data"):
        try:
            names = os.listdir(data_dir)
        except OSError:
            continue
        for file_name in names:
            match = _INPUT_FILE_RE.match(file_name)
            if match is not None:
                found.add(match.group(1))
    return found


#: a module forward's input tensor file: ``{entry}.input.{i}...`` or ``{entry}.kwargs.{key}...``
_INPUT_FILE_RE: Final = re.compile(r"(Module\..*?\.forward\.\d+)\.(?:input|kwargs)\.", re.DOTALL)


def _check_argument(field: str, value: Any, types: type | tuple[type, ...]) -> None:
    """A ``PrecisionDebugger`` argument, when given, must have the documented type."""
    if value is not None and not isinstance(value, types):
        allowed = "a list" if types == (list, tuple) else "a string"
        raise ConfigError(field, value, allowed, f"argument of type {type(value).__name__}")


def _flag(doc: dict[str, Any], field: str, default: bool | None) -> bool | None:
    """The boolean top-level ``field`` of ``doc`` (``default`` when absent)."""
    value = doc.get(field, default)
    if value is not default and not isinstance(value, bool):
        raise ConfigError(field, value, "true, false")
    return value


def _choice(field: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(field, value, allowed)
    return value


def _string_list(field: str, value: Any) -> tuple[str, ...]:
    allowed = "a list of non-empty strings"
    if not isinstance(value, list):
        raise ConfigError(field, value, allowed, f"expected a list, got {type(value).__name__}")
    for element in value:
        if not isinstance(element, str) or not element:
            raise ConfigError(field, element, allowed)
    return tuple(value)


def _read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a config file into its top-level object; raise ConfigError on any failure."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("config_path", path, "a path to a JSON file")
    allowed = "a readable JSON file holding an object"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("config_path", os.fspath(path), allowed, "file not found") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("config_path", path, allowed, f"cannot read: {exc}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "config_path", os.fspath(path), allowed,
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
        ) from None
    except _DuplicateKey as exc:
        raise ConfigError(
            "config_path", os.fspath(path), allowed, f"duplicate key {exc.args[0]!r} in a JSON object"
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer literal too long to convert
        raise ConfigError("config_path", os.fspath(path), allowed, f"invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(
            "config_path", os.fspath(path), allowed, f"the top level is a {type(doc).__name__}"
        )
    return doc


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _check_mindspore_keys(doc: dict[str, Any], summary_mode: str, task: str, precision: str, risk_level: str,
                          tensor_list: tuple[str, ...]) -> None:
    """The upstream 26.x keys msprobe for MindSpore does not implement are a ConfigError
    when set to anything but their default (docs/pytorch-features.md lists which keys each
    framework supports)."""
    detail = "not supported by msprobe for MindSpore"
    if summary_mode == "xor":
        raise ConfigError(f"{task}.summary_mode", "xor", ("statistics", "md5"), detail)
    if precision != "low":
        raise ConfigError("precision", precision, ("low",), detail)
    if risk_level != "ALL":
        raise ConfigError("risk_level", risk_level, ("ALL",), detail)
    if tensor_list:
        raise ConfigError("statistics.tensor_list", list(tensor_list), "[]", detail)
    for key in ("dump_enable", "load", "compiled_regions"):
        if key in doc:
            raise ConfigError(key, doc[key], "absent", detail)
    if isinstance(doc.get(task), dict):
        for key in ("bench_path", "diff_nums"):
            if key in doc[task]:
                raise ConfigError(f"{task}.{key}", doc[task][key], "absent", detail)


def _check_level_options(task: str, level: str, scope: tuple[str, ...]) -> None:
    """Level-dependent rules for scope and list (spec 5.3). Level L2 (MindSpore's kernel
    dump) takes any number of kernel names in ``list`` (none: every kernel), no ``scope``,
    and task ``statistics`` or ``tensor`` (docs/mindspore.md, "GRAPH_MODE and level L2")."""
    if level == "L2":
        if scope:
            raise ConfigError(f"{task}.scope", list(scope), "[] at level L2")
        if task == "structure":
            raise ConfigError("task", task, ("statistics", "tensor"),
                              detail="level L2 records MindSpore's kernel dump, which has no structure-only mode")
        return
    if not scope or level == "debug":
        return
    kinds = []
    for name in scope:
        if _API_NAME_RE.fullmatch(name):
            kinds.append("api")
        elif _MODULE_NAME_RE.fullmatch(name):
            kinds.append("module")
        else:
            kinds.append(None)
    api_allowed = "API names such as Functional.relu.0.forward"
    module_allowed = "module names such as Module.layer1.Linear.forward.0"
    if level == "L1":
        allowed, ok = api_allowed, all(kind == "api" for kind in kinds)
    elif level == "L0":
        allowed, ok = module_allowed, all(kind == "module" for kind in kinds)
    else:  # mix
        allowed, ok = f"{api_allowed} or {module_allowed}", None not in kinds
    if not ok:
        raise ConfigError(f"{task}.scope", list(scope), f"{allowed} at level {level}")


#: top-level keys whose value changes what is recorded (a task key names its sub-object):
#: a misspelling of one of them is an error, not a warning
_RECORDING_KEYS: Final = frozenset({"task", "dump_path", "rank", "step", "level", "api_list", "precision",
                                    "risk_level", *TASKS})


def _check_unknown_keys(doc: dict[str, Any]) -> None:
    """Warn about each top-level key of ``doc`` msprobe does not read, naming the closest
    key it reads (``difflib.get_close_matches`` of the lower-cased key, ratio >= 0.75) as
    ``did you mean ...?``.

    Raises:
        ConfigError: the closest key is one of :data:`_RECORDING_KEYS` and absent from
            ``doc`` (``"levle"`` for ``"level"``): recording would silently use the default.
    """
    readable = sorted(_KNOWN_KEYS | set(TASKS))
    for key in sorted(doc.keys() - _KNOWN_KEYS - set(TASKS)):
        if key in _UPSTREAM_ONLY_KEYS:
            logger.debug("config.json: ignoring unsupported top-level key %r", key)
            continue
        close = difflib.get_close_matches(key.lower(), readable, n=1, cutoff=0.75)   # the keys are lower case
        if close and close[0] in _RECORDING_KEYS and close[0] not in doc:
            raise ConfigError(key, doc[key], "a key msprobe reads",
                              f"did you mean `{close[0]}`? (without it, `{close[0]}` keeps its default, "
                              f"which changes what is recorded)")
        hint = f"; did you mean `{close[0]}`?" if close else ""
        logger.warning("config.json: unknown top-level key %r ignored%s", key, hint)


# keys of upstream's config.json that this project accepts and does not use (spec 5.1)
_UPSTREAM_ONLY_KEYS = frozenset({
    "enable_dataloader", "is_deterministic", "overflow_check", "free_benchmark", "run_ut",
    "grad_probe", "acc_check", "nan_check", "diff_check", "exception_dump", "custom_op_namespaces",
})


def _can_create_in(directory: Path) -> bool:
    """Try for real (os.access is always True for root): create and remove a temporary file."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _check_dump_path(value: Any) -> None:
    """Validate the dump path without creating anything (section 9, fix 18).

    Accepted: a non-empty string without NUL, at most 4096 characters with names of at
    most 255, no symlink among the components as written (the path itself included),
    either an existing writable directory or a path whose nearest existing ancestor is a
    writable directory (so it can be created at start).
    """
    allowed = "a directory path that exists or can be created"
    if value is MISSING:
        raise ConfigError("dump_path", value, allowed, "set it in config.json or as an argument")
    if not isinstance(value, str):
        raise ConfigError("dump_path", value, allowed, f"expected a string, got {type(value).__name__}")
    if not value:
        raise ConfigError("dump_path", value, allowed, "the path is empty")
    if "\x00" in value:
        raise ConfigError("dump_path", value, allowed, "the path contains a NUL character")
    if len(value) > _MAX_PATH_CHARS or any(len(part) > _MAX_NAME_CHARS for part in value.split(os.sep)):
        raise ConfigError("dump_path", value, allowed, "the path or one of its names is too long")
    try:
        prefix = ""
        for part in Path(value).parts:
            prefix = os.path.join(prefix, part) if prefix else part
            if os.path.islink(prefix):
                raise ConfigError("dump_path", value, allowed, f"{prefix!r} is a symbolic link")
        absolute = Path(os.path.abspath(value))
        if absolute.exists() and not absolute.is_dir():
            raise ConfigError("dump_path", value, allowed, "it exists and is not a directory")
        ancestor = absolute
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
    except OSError as exc:
        raise ConfigError("dump_path", value, allowed, f"cannot inspect the path: {exc}") from None
    if not ancestor.is_dir():
        raise ConfigError("dump_path", value, allowed, f"{str(ancestor)!r} exists and is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK) or not _can_create_in(ancestor):
        raise ConfigError("dump_path", value, allowed, f"directory {str(ancestor)!r} is not writable")

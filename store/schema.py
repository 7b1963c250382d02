"""The one schema of the msprobe event log: Arrow columns, row kinds, entry kinds.

Every module in ``store/`` (writer, reader, exporter, query views) imports its column
names from here and never spells one locally.

The log is one Arrow IPC *stream* per writing process and rank, a sequence of record
batches that all share :data:`LOG_SCHEMA`. Each row is one of four row kinds
(column :data:`ROW`):

``call``
    one dump.json entry (or a part of one: ``parameters_grad`` entries arrive one
    parameter at a time and are merged by the exporter). Columns ``kind``, ``name``,
    ``api_type``, ``parent``, ``stack_id``, ``is_recompute`` and ``keys`` (the JSON list of
    the entry's top-level keys, in dump.json order) are set. ``kind`` ``kernel`` marks
    a kernel of MindSpore's GRAPH_MODE kernel dump (level L2, :data:`KERNEL`), which has
    no dump.json entry.
``leaf``
    one argument leaf of the call with the same ``seq``: a tensor with statistics, a
    non-tensor value, ``None``, or an empty container. ``io`` names the top-level key of
    the entry it belongs to (``input_args``, ``input_kwargs``, ``output``, ``parameters``,
    ``input``, a parameter name for ``parameters_grad``, or ``""`` for a debug save whose
    value is the saved variable itself); ``path`` is the JSON list of components below it
    (``int`` = list index, ``str`` = dict key), ``arg`` the same path joined with ``.``.
``stack``
    one interned call stack: ``stack_id`` and ``frames`` (innermost first).
``marker``
    a session marker (``kind`` ``start``, ``stop`` or ``step_end``) with ``meta``: a JSON object
    holding ``task``, ``level``, ``framework``, ``dump_data_dir``, ``rank_dir``.

The format version is stamped into the schema metadata under ``msprobe.format``; version 2
also names the batch checksum under ``msprobe.checksum`` (``crc32``, see
:mod:`store.log_frame`). Version 1 logs (no checksums) have the same columns.
"""
from __future__ import annotations

import functools

FORMAT_VERSION = "2"
FORMAT_KEY = b"msprobe.format"
#: format versions this package reads: "1" (no checksums: unverified), "2" (every record
#: batch carries a CRC-32 of its message, :mod:`store.log_frame`)
FORMAT_VERSIONS = ("1", "2")
#: schema-metadata key naming the batch checksum of format 2
CHECKSUM_ALGORITHM_KEY = b"msprobe.checksum"
CHECKSUM_ALGORITHM = "crc32"

# --- columns -------------------------------------------------------------------------
RANK = "rank"
STEP = "step"
SEQ = "seq"
ROW = "row"
KIND = "kind"
NAME = "name"
API_TYPE = "api_type"
PARENT = "parent"
STACK_ID = "stack_id"
IS_RECOMPUTE = "is_recompute"
KEYS = "keys"
IO = "io"
PATH = "path"
ARG = "arg"
LEAF_KIND = "leaf_kind"
TYPE = "type"
DTYPE = "dtype"
SHAPE = "shape"
NUMEL = "numel"
MAX = "max"
MIN = "min"
MEAN = "mean"
NORM = "norm"
MAX_FINITE = "max_finite"
MIN_FINITE = "min_finite"
CRC32 = "crc32"
REQUIRES_GRAD = "requires_grad"
HAS_NAN = "has_nan"
HAS_INF = "has_inf"
DATA_NAME = "data_name"
PAYLOAD = "payload"
VALUE_JSON = "value_json"
FRAMES = "frames"
META = "meta"


# --- the field table: every column order is taken from here ---------------------------
#: The fields of a leaf, in the order of a :class:`store.records.Leaf` tuple (what the
#: recorders build and the writer process receives). The log's leaf columns are these,
#: in this order, with :data:`ARG` (``path`` joined with ``.``) after :data:`PATH`.
LEAF_FIELDS = (
    IO, PATH, LEAF_KIND, TYPE, DTYPE, SHAPE, NUMEL, MAX, MIN, MEAN, NORM, MAX_FINITE, MIN_FINITE, CRC32,
    REQUIRES_GRAD, HAS_NAN, HAS_INF, DATA_NAME, PAYLOAD, VALUE_JSON,
)
#: ``(column, dump.json key)`` of each field of a tensor record (spec 3.3), in upstream
#: key order: the order of :data:`store.entries.RECORD_FIELDS` and of its encoders
TENSOR_RECORD_KEYS = (
    (TYPE, "type"), (DTYPE, "dtype"), (SHAPE, "shape"), (MAX, "Max"), (MIN, "Min"), (MEAN, "Mean"),
    (NORM, "Norm"), (REQUIRES_GRAD, "requires_grad"), (MAX_FINITE, "Max_except_inf_nan"),
    (MIN_FINITE, "Min_except_inf_nan"), (CRC32, "md5"), (DATA_NAME, "data_name"),
)
#: the columns of a call row (after :data:`RANK`, :data:`STEP`, :data:`SEQ`, :data:`ROW`)
CALL_FIELDS = (KIND, NAME, API_TYPE, PARENT, STACK_ID, IS_RECOMPUTE, KEYS)
#: every column of the log, in :data:`LOG_SCHEMA` order (a plain tuple: no pyarrow)
COLUMNS = (
    (RANK, STEP, SEQ, ROW) + CALL_FIELDS
    + tuple(column for field in LEAF_FIELDS for column in ((PATH, ARG) if field == PATH else (field,)))
    + (FRAMES, META)
)
#: columns every row sets (the others are nullable)
_NOT_NULL = (RANK, STEP, SEQ, ROW)


def _log_schema():
    import pyarrow as pa

    types = {
        RANK: pa.int32(), STEP: pa.int32(), SEQ: pa.int64(), STACK_ID: pa.int64(), IS_RECOMPUTE: pa.bool_(),
        SHAPE: pa.list_(pa.int64()), NUMEL: pa.int64(), MAX: pa.float64(), MIN: pa.float64(),
        MEAN: pa.float64(), NORM: pa.float64(), MAX_FINITE: pa.float64(), MIN_FINITE: pa.float64(),
        REQUIRES_GRAD: pa.bool_(), HAS_NAN: pa.bool_(), HAS_INF: pa.bool_(), FRAMES: pa.list_(pa.string()),
    }  # every other column: string
    return pa.schema(
        [pa.field(name, types.get(name, pa.string()), nullable=name not in _NOT_NULL) for name in COLUMNS],
        metadata={FORMAT_KEY: FORMAT_VERSION.encode(), CHECKSUM_ALGORITHM_KEY: CHECKSUM_ALGORITHM.encode()},
    )


def __getattr__(name: str):
    """``LOG_SCHEMA`` (the Arrow schema of the log, :data:`COLUMNS` typed), built at first
    use: importing the constants of this module loads no pyarrow."""
    if name == "LOG_SCHEMA":
        value = _log_schema()
    else:
        raise AttributeError(f"module 'store.schema' has no attribute {name!r}")
    globals()[name] = value
    return value


# --- row kinds -------------------------------------------------------------------------
ROW_CALL = "call"
ROW_LEAF = "leaf"
ROW_STACK = "stack"
ROW_MARKER = "marker"

# --- call kinds (column KIND on call and leaf rows) -----------------------------------
API_FORWARD = "api_forward"
API_BACKWARD = "api_backward"
MODULE_FORWARD = "module_forward"
MODULE_BACKWARD = "module_backward"
PARAMETERS_GRAD = "parameters_grad"
DEBUG_SAVE = "debug_save"
#: a kernel of MindSpore's GRAPH_MODE kernel dump (level L2; msprobe.kernel_dump.ingest):
#: name ``Kernel.{graph}.{scope}.{k}`` or ``Parameter.{graph}.{name}.{k}``, api_type the
#: kernel type, leaves ``input``/``output`` by slot; not in CALL_KINDS (no dump.json entry)
KERNEL = "kernel"
#: regular expression matching the names of kernel rows of the backward pass (MindSpore
#: scopes them ``Gradients/...``)
KERNEL_BACKWARD_RE = r"^Kernel\.[0-9]+\.Gradients/"
CALL_KINDS = (API_FORWARD, API_BACKWARD, MODULE_FORWARD, MODULE_BACKWARD, PARAMETERS_GRAD, DEBUG_SAVE)
FORWARD_KINDS = (API_FORWARD, MODULE_FORWARD, DEBUG_SAVE)
MODULE_KINDS = (MODULE_FORWARD, MODULE_BACKWARD)
API_KINDS = (API_FORWARD, API_BACKWARD)

# --- marker kinds -------------------------------------------------------------------------
MARKER_START = "start"
MARKER_STOP = "stop"
MARKER_STEP_END = "step_end"

# --- leaf kinds ---------------------------------------------------------------------------
LEAF_TENSOR = "tensor"          # statistics columns set; record built from columns
LEAF_VALUE = "value"            # VALUE_JSON holds the whole JSON record
LEAF_NONE = "none"              # Python None or a missing gradient: JSON null
LEAF_EMPTY_LIST = "empty_list"  # an empty list/tuple at this path: JSON []
LEAF_EMPTY_DICT = "empty_dict"  # an empty dict at this path: JSON {}
LEAF_KINDS = (LEAF_TENSOR, LEAF_VALUE, LEAF_NONE, LEAF_EMPTY_LIST, LEAF_EMPTY_DICT)

# dtype spellings whose Max/Min are booleans (any/all) in dump.json
BOOL_DTYPES = frozenset({"torch.bool", "Bool", "bool"})

def is_xor_checksum(text) -> bool:
    """True if a leaf's ``crc32`` text is summary_mode xor's 64-bit XOR checksum
    (``"0x"`` + 16 hex digits, :func:`msprobe.core.checksum.xor64_hex`) rather than a
    CRC-32 (8 hex digits); such a dump.json record carries no statistics."""
    return text is not None and text[:2] == "0x"


# top-level keys whose empty value is a JSON object; all others are lists
DICT_ROOTS = frozenset({"input_kwargs", "parameters"})

# store layout inside dump_path
STORE_DIR = ".msprobe"
#: the tensor files' directory inside a step's rank directory (spec section 1)
TENSOR_DIR = "dump_tensor_data"
LOG_DIR = "log"
LOG_SUFFIX = ".arrows"


@functools.lru_cache(maxsize=512)
def scalar(value, column: str) -> "pyarrow.Scalar":
    """``value`` as an Arrow scalar of log column ``column``'s type, for comparisons and
    fills in ``pyarrow.compute``.

    Given a plain Python value, pyarrow converts it on every call, and that conversion
    tries to import pandas and dateutil each time where they are not installed: 0.1–0.2 ms
    per call against ~5–10 µs with a typed scalar (measured with pyarrow 25).

    Raises:
        KeyError: ``column`` is not a column of :data:`LOG_SCHEMA`.
        pyarrow.ArrowInvalid / TypeError: ``value`` does not fit the column's type.
    """
    import pyarrow as pa

    return pa.scalar(value, type=__getattr__("LOG_SCHEMA").field(column).type)


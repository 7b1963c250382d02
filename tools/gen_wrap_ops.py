"""Generate msprobe/pytorch/support_wrap_ops.yaml from the installed PyTorch's namespaces.

Usage: ``python tools/gen_wrap_ops.py [OUT.yaml]``

Rules (this project's own; see docs/pytorch.md "API list"):

* ``functional``: public functions of ``torch.nn.functional`` (not classes, not typing or
  dispatch helpers);
* ``tensor``: ``torch.Tensor`` arithmetic/comparison/indexing dunders and public methods that
  compute on tensor values; methods that only read metadata, convert types or devices,
  manage autograd, storage or hooks are left out (``size``, ``dim``, ``to``, ``float``,
  ``detach``, ``clone``, ``contiguous``, ``view``, ``register_hook``, ...), as are those that
  would make the recorder call itself;
* ``torch``: public callables of ``torch`` that are tensor operators (built-in
  ``torch._C._VariableFunctions`` and Python functions defined in ``torch.functional``),
  without factories that take no tensor (``ones``, ``zeros``, ``empty``, ``tensor``,
  ``randn``, ...) and without helpers (``is_tensor``, ``set_*``, ``manual_seed``...);
* ``aten``: EMPTY by default, opt-in. The names of the ``torch`` section that are also
  ``torch.ops.aten`` operator packets are written as comments under it (uncomment to record
  ``torch.ops.aten.X`` / ``torch.ops.aten.X.overload`` calls made from Python). Why not on by
  default: see msprobe/pytorch/aten_hooks.py (a TorchDispatchMode during recording crashes
  the process);
* ``_VF``: ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``;
* ``distributed``: the collectives and point-to-point calls of ``torch.distributed`` in
  :data:`DISTRIBUTED` that this torch has (none where ``torch.distributed`` is not
  available); process-group management (``init_process_group``, ``new_group``, ...) and
  queries (``get_rank``, ...) are not recorded.
* ``torch_npu`` (only when ``torch_npu`` is installed): its public ``npu_*`` callables.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import types

import torch
import torch.nn.functional as F
import yaml

DISTRIBUTED = [
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "broadcast", "all_reduce",
    "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
]

TENSOR_DUNDERS = [
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__",
    "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__div__", "__rdiv__", "__idiv__",
    "__floordiv__", "__rfloordiv__", "__ifloordiv__", "__mod__", "__rmod__", "__imod__",
    "__pow__", "__rpow__", "__ipow__", "__matmul__", "__rmatmul__", "__neg__", "__abs__",
    "__and__", "__rand__", "__iand__", "__or__", "__ror__", "__ior__", "__xor__", "__rxor__",
    "__ixor__", "__lshift__", "__rlshift__", "__ilshift__", "__rshift__", "__rrshift__",
    "__irshift__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__getitem__", "__setitem__",
]

TENSOR_EXCLUDE = {
    # metadata, conversion, device and memory management
    "size", "dim", "ndimension", "nelement", "numel", "stride", "storage_offset", "data_ptr",
    "element_size", "is_contiguous", "is_complex", "is_floating_point", "is_signed",
    "is_set_to", "is_pinned", "is_shared", "is_inference", "is_coalesced", "is_nonzero",
    "is_same_size", "get_device", "type", "type_as", "to", "cpu", "cuda", "xpu", "mps", "ipu", "npu",
    "hpu", "mtia", "float", "double", "half", "bfloat16", "int", "long", "short", "char",
    "byte", "bool", "cfloat", "cdouble", "chalf", "numpy", "tolist", "item", "storage",
    "untyped_storage", "storage_type", "pin_memory", "share_memory_", "contiguous", "clone",
    "detach", "detach_", "view", "dim_order", "data", "new", "new_tensor", "new_empty",
    "new_empty_strided", "new_zeros", "new_ones", "new_full", "record_stream", "to_dense",
    "to_sparse", "to_mkldnn", "coalesce", "values", "indices", "crow_indices", "col_indices",
    "ccol_indices", "row_indices", "_values", "_indices", "dense_dim", "sparse_dim",
    "sparse_mask", "sparse_resize_", "sparse_resize_and_clear_", "map_", "map2_", "apply_",
    "module_load", "resize_", "resize_as_", "set_", "share_memory_", "is_meta", "is_cuda",
    "q_scale", "q_zero_point", "q_per_channel_scales", "q_per_channel_zero_points",
    "q_per_channel_axis", "qscheme", "int_repr", "dequantize", "nbytes", "itemsize",
    # autograd and hooks
    "backward", "register_hook", "register_post_accumulate_grad_hook", "retain_grad",
    "requires_grad_", "grad", "is_leaf", "align_to", "refine_names", "rename", "rename_",
    "has_names", "unflatten", "as_subclass", "smm", "dim_order",
}

TORCH_EXCLUDE = {
    "ones", "zeros", "empty", "full", "tensor", "as_tensor", "asarray", "from_numpy",
    "from_file", "frombuffer", "rand", "randn", "randint", "randperm", "normal", "arange",
    "range", "linspace", "logspace", "eye", "empty_strided", "empty_like", "zeros_like",
    "scalar_tensor", "complex", "can_cast", "is_tensor", "is_storage", "is_complex",
    "is_floating_point", "is_nonzero", "is_same_size", "is_signed", "is_grad_enabled",
    "is_inference_mode_enabled", "is_inference", "is_conj", "is_neg", "is_distributed",
    "numel", "result_type", "promote_types", "get_default_dtype", "set_default_dtype",
    "get_default_device", "set_default_device", "set_default_tensor_type", "manual_seed",
    "seed", "initial_seed", "get_rng_state", "set_rng_state", "set_printoptions",
    "set_grad_enabled", "set_num_threads", "get_num_threads", "set_num_interop_threads",
    "get_num_interop_threads", "set_flush_denormal", "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled", "set_deterministic_debug_mode",
    "get_deterministic_debug_mode", "set_float32_matmul_precision",
    "get_float32_matmul_precision", "set_warn_always", "is_warn_always_enabled", "compile",
    "vmap", "cond", "typename", "save", "load", "autocast", "no_grad", "enable_grad",
    "inference_mode", "is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled",
    "clear_autocast_cache", "detach", "detach_", "clone", "sym_int", "sym_float", "sym_max",
    "sym_min", "sym_not", "sym_ite", "sym_sqrt", "sym_sum", "sym_fresh_size", "sym_constrain_range",
    "sym_constrain_range_for_size", "broadcast_shapes", "empty_permuted", "empty_quantized",
    "quantize_per_tensor", "quantize_per_channel", "quantize_per_tensor_dynamic",
    "fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
    "is_vulkan_available", "is_anomaly_enabled", "is_anomaly_check_nan_enabled",
    "set_anomaly_enabled", "lobpcg", "chain_matmul", "align_tensors", "ones_like",
    "full_like", "rand_like", "randn_like", "randint_like", "empty_like", "tril_indices",
    "triu_indices", "hann_window", "hamming_window", "bartlett_window", "blackman_window",
    "kaiser_window", "unique_consecutive", "from_dlpack", "export", "jit", "get_device",
    "resolve_conj", "resolve_neg",
}


def functional_names() -> list[str]:
    out = []
    for name in dir(F):
        if name.startswith("_"):
            continue
        obj = getattr(F, name)
        if inspect.isclass(obj) or isinstance(obj, types.ModuleType) or not callable(obj):
            continue
        mod = getattr(obj, "__module__", "") or ""
        if mod.startswith("typing") or name in {"has_torch_function", "has_torch_function_unary",
                                               "has_torch_function_variadic", "handle_torch_function",
                                               "boolean_dispatch", "assert_int_or_pair", "Callable"}:
            continue
        out.append(name)
    return sorted(out)


def tensor_names() -> list[str]:
    out = [n for n in TENSOR_DUNDERS if hasattr(torch.Tensor, n)]
    for name in dir(torch.Tensor):
        if name.startswith("_") or name in TENSOR_EXCLUDE:
            continue
        obj = inspect.getattr_static(torch.Tensor, name, None)
        if obj is None or isinstance(obj, (property,)) or type(obj).__name__ == "getset_descriptor":
            continue
        if not callable(getattr(torch.Tensor, name)):
            continue
        if name.startswith("is_") or name.startswith("register_"):
            continue
        out.append(name)
    return out


def torch_names() -> list[str]:
    vf = set(dir(torch._C._VariableFunctions))
    out = []
    for name in dir(torch):
        if name.startswith("_") or name in TORCH_EXCLUDE:
            continue
        obj = getattr(torch, name)
        if inspect.isclass(obj) or isinstance(obj, types.ModuleType) or not callable(obj):
            continue
        mod = getattr(obj, "__module__", "") or ""
        if name in vf or mod in ("torch.functional", "torch._refs"):
            if name.startswith(("is_", "set_", "get_")):
                continue
            out.append(name)
    return sorted(out)


def aten_names(torch_list: list[str]) -> list[str]:
    """Names of ``torch_list`` that are ``torch.ops.aten`` operator packets."""
    packet = torch._ops.OpOverloadPacket
    return [name for name in torch_list if isinstance(getattr(torch.ops.aten, name, None), packet)]


def npu_names() -> list[str]:
    """``torch_npu`` custom operators (public callables named ``npu_*``), when torch_npu
    is installed; [] otherwise."""
    if importlib.util.find_spec("torch_npu") is None:
        return []
    import torch_npu

    return sorted(n for n in dir(torch_npu) if n.startswith("npu_") and callable(getattr(torch_npu, n, None)))


def distributed_names() -> list[str]:
    import torch.distributed as dist

    if not dist.is_available():
        return []
    return [name for name in DISTRIBUTED if callable(getattr(dist, name, None))]


def main(argv: list[str]) -> int:
    out = argv[1] if len(argv) > 1 else "msprobe/pytorch/support_wrap_ops.yaml"
    torch_list = torch_names()
    doc = {
        "functional": functional_names(),
        "tensor": tensor_names(),
        "torch": torch_list,
        "_VF": ["lstm", "gru", "rnn_tanh", "rnn_relu"],
        "aten": [],
        "distributed": distributed_names(),
    }
    npu = npu_names()
    if npu:
        doc["torch_npu"] = npu
    header = (f"# Generated by tools/gen_wrap_ops.py from torch {torch.__version__}; edit freely:\n"
              "# delete a name to stop recording that API, add one to record it (unknown names are reported).\n")
    with open(out, "w") as fh:
        fh.write(header)
        text = yaml.safe_dump(doc, default_flow_style=False, sort_keys=False)
        examples = "".join(f"# - {name}\n" for name in aten_names(torch_list))
        fh.write(text.replace("aten: []\n", "aten: []  # opt-in; read msprobe/pytorch/aten_hooks.py first\n" + examples))
    print(out, {k: len(v) for k, v in doc.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

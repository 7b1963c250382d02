"""Generate msprobe/mindspore/support_wrap_ops.yaml from the installed MindSpore.

Usage: ``python tools/gen_ms_wrap_ops.py [OUT.yaml]``

Rules (this project's own; see docs/mindspore.md "API list"):

* ``ops`` (family Functional): public functions of ``mindspore.ops`` (not classes, not
  modules), without helpers that compute nothing on tensor values (dtype/shape queries,
  ``Primitive``/``HookBackward`` factories, seeds, ``deepcopy``...);
* ``tensor`` (family Tensor): arithmetic, comparison and indexing dunders of
  ``mindspore.Tensor`` and its public methods that compute on values; conversion,
  metadata, hook and storage methods are left out (``asnumpy``, ``item``, ``register_hook``,
  ``view``, ``detach``...); value-changing conversions such as ``astype`` are kept;
* ``mint.ops`` (family Mint): public functions of ``mindspore.mint``;
* ``mint.nn.functional`` (family MintFunctional): public functions of
  ``mindspore.mint.nn.functional``;
* ``communication.comm_func`` (family Distributed): the collective functions.
"""
from __future__ import annotations

import inspect
import sys
import types

import mindspore
import yaml
from mindspore import Tensor, mint, ops
from mindspore.mint.nn import functional as mint_f

TENSOR_DUNDERS = [
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__",
    "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__",
    "__ifloordiv__", "__mod__", "__rmod__", "__imod__", "__pow__", "__rpow__", "__ipow__",
    "__matmul__", "__rmatmul__", "__imatmul__", "__neg__", "__abs__", "__and__", "__rand__", "__or__",
    "__ror__", "__xor__", "__rxor__", "__invert__", "__lt__", "__le__", "__gt__", "__ge__",
    "__eq__", "__ne__", "__getitem__", "__setitem__",
]

TENSOR_EXCLUDE = {
    "asnumpy", "numpy", "tolist", "item", "itemset", "shape", "dtype", "size", "ndim", "ndimension",
    "dim", "numel", "nelement", "nbytes", "itemsize", "strides", "stride", "storage_offset",
    "data_ptr", "element_size", "is_contiguous", "is_complex", "is_floating_point", "is_signed",
    "is_persistent_data", "is_init", "has_init", "init_data", "init", "init_flag", "set_init_flag",
    "assign_value", "assign_value_cpp", "set_dtype", "set_cast_dtype", "register_hook", "hook",
    "_offload", "offload", "offload_file_path", "load", "flush_from_cache", "data_sync",
    "contiguous", "copy", "detach", "detach_", "requires_grad_", "retain_grad", "backward",
    "storage", "untyped_storage", "device", "to", "cpu", "npu", "data", "grad", "grad_fn",
    "is_leaf", "slice_num_of_persistent_data", "slice_shape_of_persistent_data",
    "virtual_flag", "param_info", "parent_tensor_", "index_of_parent_", "adapter_flag",
    "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "from_numpy", "convert_bytes_to_tensor",
    "move_to", "_move_to", "get_bytes", "set_const_arg", "const_arg", "view", "tensor",
    "main_grad", "_requires_grad", "T", "H", "mH", "mT", "real", "imag",
}

OPS_EXCLUDE = {
    "deepcopy", "HookBackward", "hook_backward", "print_", "tensor_dump", "TensorDump",
    "dtype", "shape", "rank", "size", "is_tensor", "is_floating_point", "is_complex", "is_nonzero",
    "isconstant", "typeof", "issubclass_", "isinstance_", "dyn_shape", "tuple_to_array",
    "scalar_to_tensor", "depend", "stop_gradient", "stack_fn", "ms_class", "constexpr",
    "prim_attr_register", "custom_info_register", "kernel", "set_seed", "get_seed", "grad",
    "value_and_grad", "vjp", "jvp", "jacfwd", "jacrev", "vmap", "derivative", "jet", "bprop_getters",
    "get_vm_impl_fn", "get_grad", "Custom", "CustomRegOp", "DataType", "AiCPURegOp", "TBERegOp",
    "AkgGpuRegOp", "AkgAscendRegOp", "op_info_register", "absolute_import", "arange", "ones", "zeros",
    "eye", "full", "linspace", "logspace", "range",
}


def _functions(module, exclude=()) -> list[str]:
    out = []
    for name in dir(module):
        if name.startswith("_") or name in exclude:
            continue
        obj = getattr(module, name, None)
        if obj is None or inspect.isclass(obj) or isinstance(obj, types.ModuleType) or not callable(obj):
            continue
        mod = getattr(obj, "__module__", "") or ""
        if mod.startswith("typing"):
            continue
        out.append(name)
    return sorted(out)


def tensor_names() -> list[str]:
    out = [n for n in TENSOR_DUNDERS if hasattr(Tensor, n)]
    for name in dir(Tensor):
        if name.startswith("_") or name in TENSOR_EXCLUDE:
            continue
        obj = inspect.getattr_static(Tensor, name, None)
        if obj is None or isinstance(obj, (property, staticmethod, classmethod)):
            continue
        if type(obj).__name__ in ("getset_descriptor", "member_descriptor"):
            continue
        if not callable(getattr(Tensor, name, None)) or name.startswith(("is_", "register_", "set_")):
            continue
        out.append(name)
    return out


def comm_names() -> list[str]:
    from mindspore.communication import comm_func
    skip = {"absolute_import", "cat", "deprecated", "jit_class"}
    return [n for n in _functions(comm_func, skip)
            if not n.startswith(("get_", "inner_", "dist_comm_"))]


def main(argv: list[str]) -> int:
    out = argv[1] if len(argv) > 1 else "msprobe/mindspore/support_wrap_ops.yaml"
    doc = {
        "ops": _functions(ops, OPS_EXCLUDE),
        "tensor": tensor_names(),
        "mint.ops": _functions(mint, OPS_EXCLUDE),
        "mint.nn.functional": _functions(mint_f, OPS_EXCLUDE),
        "communication.comm_func": comm_names(),
    }
    header = (f"# Generated by tools/gen_ms_wrap_ops.py from mindspore {mindspore.__version__}; edit freely:\n"
              "# delete a name to stop recording that API, add one to record it (unknown names are reported).\n")
    with open(out, "w") as fh:
        fh.write(header)
        yaml.safe_dump(doc, fh, default_flow_style=False, sort_keys=False)
    print(out, {k: len(v) for k, v in doc.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""config.json ``risk_level``: which APIs of the API list are recorded.

Each API is ``CORE``, ``LOW`` or, when in neither list below, ``FOCUS``:

* ``risk_level: "ALL"`` (msprobe's default) records every API of the list;
* ``"FOCUS"`` (upstream mindstudio-probe 26.x's default) leaves out the ``LOW`` ones:
  shape and layout changes, copies, dtype and device conversions, concatenation and
  splitting, and tensor creation; what they output is their input rearranged, or a
  constant, so they rarely start a divergence;
* ``"CORE"`` records only the ``CORE`` ones: matrix products and linear layers,
  convolutions, normalisations, embeddings, attention, and every API of the
  ``Distributed`` and ``NPU`` families (collectives and fused device kernels).

Names are matched without their family prefix (``Functional.linear`` → ``linear``), and an
in-place variant (``addmm_``, ``transpose_``) shares its API's level. Modules are not
affected: ``risk_level`` filters API calls only. The lists are documented in
docs/pytorch-features.md; upstream 26.2.0's CORE list merges ``chain_matmul`` and
``linear`` into one name by a missing comma, so a Linear model records no API at CORE
there, while here ``Functional.linear`` is CORE.

Nothing here imports a deep-learning framework.
"""
from __future__ import annotations

from typing import Final, Literal

__all__ = ["CORE_APIS", "CORE_FAMILIES", "LOW_RISK_APIS", "api_risk", "recorded_at"]

Risk = Literal["CORE", "FOCUS", "LOW"]

#: families whose every API is CORE
CORE_FAMILIES: Final = frozenset({"Distributed", "NPU"})

#: CORE API names, by kind
CORE_APIS: Final = frozenset({
    # matrix products and linear layers
    "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot", "vdot", "inner", "outer", "ger",
    "addmm", "addbmm", "baddbmm", "addmv", "addr", "chain_matmul", "einsum", "tensordot", "kron",
    "linear", "bilinear", "_addmm_activation",
    # convolutions
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
    "convolution", "_convolution",
    # normalisations
    "batch_norm", "instance_norm", "layer_norm", "group_norm", "rms_norm", "local_response_norm",
    "native_batch_norm", "native_layer_norm", "native_group_norm", "_batch_norm_impl_index",
    "batch_norm_elemt", "batch_norm_stats", "batch_norm_update_stats", "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts", "batch_norm_backward_elemt", "batch_norm_backward_reduce",
    # embeddings
    "embedding", "embedding_bag",
    # attention
    "scaled_dot_product_attention", "multi_head_attention_forward",
})

#: LOW-risk API names (left out at FOCUS and CORE)
LOW_RISK_APIS: Final = frozenset({
    # shape and layout
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel", "squeeze", "unsqueeze",
    "expand", "expand_as", "broadcast_to", "repeat", "repeat_interleave", "tile", "t", "transpose", "permute",
    "movedim", "moveaxis", "swapaxes", "swapdims", "contiguous", "atleast_1d", "atleast_2d", "atleast_3d",
    "align_as", "align_to", "unfold",
    # concatenation and splitting
    "cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack", "row_stack",
    "chunk", "unsafe_chunk", "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes",
    "tensor_split", "hsplit", "vsplit", "dsplit", "unbind",
    # copies, dtype and device conversions
    "clone", "detach", "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short",
    "byte", "char", "bool", "cfloat", "cdouble", "cpu", "cuda", "numpy",
    # creation
    "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "arange", "range",
    "linspace", "logspace", "eye", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor",
    "diag", "diagflat", "diag_embed", "triu", "tril", "triu_indices", "tril_indices",
})


def _base_name(name: str) -> str:
    """``name`` without the trailing underscore of an in-place variant (``addmm_`` →
    ``addmm``); dunder names (``__matmul__``) stay as they are."""
    if name.endswith("_") and not name.endswith("__"):
        return name[:-1]
    return name


def api_risk(family: str, name: str) -> Risk:
    """The risk level of API ``name`` of ``family`` (the dump.json prefix: ``Functional``,
    ``Tensor``, ``Torch``, ``Distributed``, ...).

    Example: ``api_risk("Functional", "linear")`` is ``"CORE"``,
    ``api_risk("Tensor", "transpose_")`` is ``"LOW"``, ``api_risk("Functional", "relu")``
    is ``"FOCUS"``.
    """
    if family in CORE_FAMILIES:
        return "CORE"
    base = _base_name(name)
    if base in CORE_APIS:
        return "CORE"
    if base in LOW_RISK_APIS:
        return "LOW"
    return "FOCUS"


def recorded_at(risk_level: str, family: str, name: str) -> bool:
    """True if API ``name`` of ``family`` is recorded at config.json ``risk_level``
    (``ALL``, ``FOCUS`` or ``CORE``).

    Raises:
        ValueError: ``risk_level`` is none of those (config validation rejects it first).
    """
    if risk_level == "ALL":
        return True
    risk = api_risk(family, name)
    if risk_level == "FOCUS":
        return risk != "LOW"
    if risk_level == "CORE":
        return risk == "CORE"
    raise ValueError(f"risk_level: got {risk_level!r}; allowed: ALL, FOCUS, CORE")

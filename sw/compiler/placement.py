"""Where each layer of a network runs: on the fabric when the compiler maps it, else on the CPU.

:func:`place_layer` (one layer) / :func:`plan_network` (every layer) take a quantized or a
float IR layer and an accelerator configuration. A conv or GEMM goes to the fabric exactly
when :func:`~dnnfab.sw.compiler.program.plan_layer` maps it, otherwise the placement
carries the compiler's reason (e.g. ``2048 output channels exceed 255 C-blocks per pixel;
use a config with more columns``). Grouped convolutions are lowered to dense convs whose
weights are zero between groups, each M tile reading only the input-channel blocks of its
groups: exact always, and worth it when the array computes at most
:data:`GROUPED_MAX_WASTE` times the layer's MACs; depthwise convs stay on the CPU.
``dnnfab inspect`` and ``dnnfab run`` print the placement.
"""

from dataclasses import dataclass

import numpy as np

from ...hw.config import AcceleratorConfig
from ..ir.graph import Layer
from .layer import ConvLayer
from .program import compile_layer, plan_layer, UnsupportedLayerError, LayerProgram, LayerPlan

__all__ = ["FABRIC_OPS", "GROUPED_MAX_WASTE", "Placement", "to_conv_layer", "op_label",
           "place_layer", "plan_network"]

#: The ops the accelerator executes; every other layer runs on the host CPU.
FABRIC_OPS = ("conv", "gemm")
#: A grouped conv runs on the fabric when the array's MACs (zero weights between groups,
#: channel padding) are at most this multiple of the layer's own MACs.
GROUPED_MAX_WASTE = 2.0


def to_conv_layer(L, in_shape):
    """The accelerator's view of a QConv/QGemm, or None if it cannot run on the fabric.

    ``in_shape`` is the logical (ONNX) input shape.
    """
    if L.op == "conv":
        w = L.qweight
        if w.ndim == 3:                         # conv1d: [Cout, Cin, k] -> kh = 1
            w = w[:, :, None, :]
        if len(in_shape) == 4:
            hw = (in_shape[2], in_shape[3])
        elif len(in_shape) == 3:
            hw = (1, in_shape[2])
        else:
            return None
        stride, pad, dil = tuple(L.stride), tuple(L.pad), tuple(L.dilation)
        if len(stride) == 1:
            stride, dil = (1,) + stride, (1,) + dil
            pad = (0, pad[0], 0, pad[1])
        return ConvLayer(weight=w, bias=L.bias, m=L.m, n=L.n, zx=L.zx, zy=L.zy, lo=L.lo, hi=L.hi,
                         stride=stride, pad=pad, dilation=dil, in_hw=hw, name=L.name,
                         groups=L.groups)
    if L.op == "gemm":
        rows = int(np.prod(in_shape[:-1]))
        return ConvLayer.gemm(L.qweight.T, bias=L.bias, m=L.m, n=L.n, rows=rows, zx=L.zx, zy=L.zy,
                              lo=L.lo, hi=L.hi, name=L.name)
    return None


@dataclass
class Placement:
    """Where one layer runs: ``where`` is ``"fabric"`` or ``"cpu"``; ``reason`` says why
    not on the fabric (empty on the fabric). ``conv`` / ``program`` are the accelerator's
    view of the layer and its compiled program when it is a conv or GEMM that maps."""

    where: str
    reason: str = ""
    conv: ConvLayer | None = None
    plan: LayerPlan | None = None
    cfg: AcceleratorConfig | None = None

    @property
    def program(self) -> LayerProgram | None:
        """The layer compiled as a program of its own (tests, single-layer tools)."""
        if self.plan is None:
            return None
        return compile_layer(self.conv, self.cfg)


def _is_float_layer(L):
    return isinstance(L, Layer)


def op_label(L):
    """Short op name of a quantized or float layer: ``conv``, ``maxpool``, ``Softmax``, ..."""
    if _is_float_layer(L):
        if L.op == "float":
            return L.attrs.get("op_type", "float")
        return "rescale" if L.op == "qdq" else L.op
    if L.op == "lut":
        return L.op_type or "lut"
    if L.op == "float":
        return L.layer.attrs.get("op_type", "float")
    return L.op


class _FloatView:
    """A float IR conv/GEMM with the fields :func:`to_conv_layer` reads: the geometry of
    the layer with zero weights and a neutral requantizer (placement only)."""

    def __init__(self, L):
        w = L.params["weight"]
        self.op, self.name = L.op, L.name
        self.qweight = np.zeros(w.shape, np.int8)
        cout = w.shape[0]
        self.bias = np.zeros(cout, np.int32)
        self.m = np.full(cout, 1 << 14, np.int32)
        self.n = np.ones(cout, np.int32)
        self.zx = self.zy = 0
        self.lo, self.hi = -128, 127
        if L.op == "conv":
            a = L.attrs
            self.groups = a["groups"]
            self.stride, self.pad, self.dilation = tuple(a["stride"]), tuple(a["pads"]), tuple(a["dilation"])


def _strip_name(msg, name):
    prefix = f"layer {name}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def place_layer(L, in_shape, cfg: AcceleratorConfig = None) -> Placement:
    """Where layer ``L`` runs on an accelerator ``cfg`` and why not on the fabric.

    ``L`` is a layer of a :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph` or of a float
    :class:`~dnnfab.sw.ir.graph.Graph`; ``in_shape`` its (logical, ONNX) input shape. A conv or
    GEMM is on the fabric exactly when :func:`~dnnfab.sw.compiler.program.plan_layer` maps it
    (``plan`` is its tiling, ``program`` the layer compiled on its own);
    the placement of a float layer is that of its quantized version (same geometry).
    """
    cfg = cfg or AcceleratorConfig()
    label = op_label(L)
    if L.op not in FABRIC_OPS:
        return Placement("cpu", f"{label}: the accelerator runs conv and GEMM layers only")
    g = _groups(L) if L.op == "conv" else 1
    if g != 1 and g == int(in_shape[1]) and _cin_per_group(L) == 1:
        return Placement("cpu", f"depthwise conv (groups={g}): left to the CPU (the array "
                                "would multiply mostly zero weights)")
    view = _FloatView(L) if _is_float_layer(L) else L
    conv = to_conv_layer(view, in_shape)
    if conv is None:
        return Placement("cpu", f"{label} with a rank-{len(in_shape)} input: the accelerator "
                                "maps 1-D and 2-D layers only")
    try:
        plan = plan_layer(conv, cfg)
    except UnsupportedLayerError as exc:
        return Placement("cpu", _strip_name(str(exc), L.name), conv)
    if g != 1:
        waste = plan.hw_macs / max(1, conv.macs)
        if waste > GROUPED_MAX_WASTE:
            return Placement("cpu", f"grouped conv (groups={g}): the array would compute "
                                    f"{waste:.1f}x its MACs (zero weights between groups; "
                                    f"fabric limit {GROUPED_MAX_WASTE:g}x)", conv)
    return Placement("fabric", "", conv, plan, cfg)


def _cin_per_group(L):
    w = L.params["weight"] if _is_float_layer(L) else L.qweight
    return int(w.shape[1])


def _groups(L):
    return L.attrs["groups"] if _is_float_layer(L) else L.groups


def plan_network(g, cfg: AcceleratorConfig = None):
    """``{layer name: Placement}`` for every layer of ``g`` (quantized or float graph)."""
    cfg = cfg or AcceleratorConfig()
    return {L.name: place_layer(L, tuple(g.shape(L.inputs[0])) if L.inputs else (), cfg)
            for L in g.layers}



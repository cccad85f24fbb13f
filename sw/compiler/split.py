"""Output-channel splits of a conv or GEMM between the fabric and the CPU, as a graph rewrite.

The scheduler may run the first ``c`` output channels of a layer on the fabric and the rest
on the CPU workers at the same time. :func:`apply_splits` rewrites the quantized graph so
that every executor already understands the result: layer ``L`` becomes

* ``L@fab``: the same layer with weights, bias and requantize rows ``[:c]``;
* ``L@cpu``: the same with rows ``[c:]``;
* ``L`` itself: a pass-through channel concat (:class:`~dnnfab.sw.ir.qgraph.QEltwise`,
  ``identity`` on both inputs) that writes the original output tensor.

Every output channel of a conv or GEMM depends only on its own weight row, bias, ``m`` and
``n`` and the shared input, and both halves keep the layer's zero points, clamp and output
scale, so the concat of the two halves is bit-identical to the unsplit layer (tested). The
halves' names tell the placement which resource runs them (:func:`split_target`).
Grouped convs are not split (a cut would have to fall on a group boundary and the halves
would read different input channels); depthwise ones never reach the fabric anyway.
"""

from __future__ import annotations

import copy

import numpy as np

from ...errors import ConfigError
from ..ir.qgraph import QConv, QEltwise, QGemm, QTensor, QuantizedGraph

__all__ = ["FAB_SUFFIX", "CPU_SUFFIX", "apply_splits", "split_target", "splittable",
           "out_channels"]

FAB_SUFFIX = "@fab"
CPU_SUFFIX = "@cpu"


def out_channels(L) -> int:
    """Output channels of a conv or GEMM layer."""
    return int(L.qweight.shape[0])


def splittable(L) -> bool:
    """True for a conv (groups == 1) or GEMM with at least two output channels."""
    if isinstance(L, QGemm):
        return out_channels(L) >= 2
    if isinstance(L, QConv):
        return L.groups == 1 and out_channels(L) >= 2
    return False


def split_target(name: str) -> str | None:
    """"fabric" / "cpu" for the halves :func:`apply_splits` makes, else None."""
    if name.endswith(FAB_SUFFIX):
        return "fabric"
    if name.endswith(CPU_SUFFIX):
        return "cpu"
    return None


def _rows(L, lo, hi, name, output):
    half = copy.copy(L)
    half.name, half.output = name, output
    half.qweight = np.ascontiguousarray(L.qweight[lo:hi])
    for f in ("bias", "m", "n", "sw", "bias_q"):
        v = getattr(L, f, None)
        if isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == out_channels(L):
            setattr(half, f, np.ascontiguousarray(v[lo:hi]))
    half.cache = {}
    return half


def apply_splits(qg: QuantizedGraph, splits: dict) -> QuantizedGraph:
    """A new graph in which each layer named in ``splits`` ({name: fabric channels c,
    0 < c < Cout}) is split as the module docstring describes; ``qg`` is not changed.
    A bad name or channel count raises :class:`~dnnfab.errors.ConfigError`."""
    if not splits:
        return qg
    by_name = {L.name: L for L in qg.layers}
    for name, c in splits.items():
        L = by_name.get(name)
        if L is None:
            raise ConfigError(f"cannot split {name!r}: the model has no layer of that name")
        if not splittable(L):
            raise ConfigError(f"cannot split {name!r} ({L.op}"
                              f"{', grouped' if getattr(L, 'groups', 1) != 1 else ''}): only "
                              "convs with groups=1 and GEMMs split by output channel")
        if not 0 < int(c) < out_channels(L):
            raise ConfigError(f"cannot split {name!r} at {c} channels: use 1..{out_channels(L) - 1}")
    layers, qtensors, shapes = [], dict(qg.qtensors), dict(qg.shapes)
    for L in qg.layers:
        c = splits.get(L.name)
        if c is None:
            layers.append(L)
            continue
        c, cout = int(c), out_channels(L)
        shp = list(qg.shape(L.output))
        axis = 1                                   # NC(H)(W) for conv, [M, N] for gemm
        ta, tb = L.output + FAB_SUFFIX, L.output + CPU_SUFFIX
        qt = qg.qtensors[L.output]
        for t, n in ((ta, c), (tb, cout - c)):
            s = list(shp)
            s[axis] = n
            shapes[t] = tuple(s)
            qtensors[t] = QTensor(qt.scale, qt.zero_point)
        layers.append(_rows(L, 0, c, L.name + FAB_SUFFIX, ta))
        layers.append(_rows(L, c, cout, L.name + CPU_SUFFIX, tb))
        zy = int(qt.zero_point)
        layers.append(QEltwise(name=L.name, op="concat", inputs=[ta, tb], output=L.output,
                               k=np.array([1, 1], np.int32), z=np.array([zy, zy], np.int32),
                               m=1, n=0, zy=zy, lo=-128, hi=127, axis=axis,
                               identity=(True, True), sy=qt.scale))
    out = QuantizedGraph(qg.name, qg.inputs, qg.outputs, layers, qtensors, shapes,
                         float_graph=qg.float_graph)
    out.reduce_range = qg.reduce_range
    return out


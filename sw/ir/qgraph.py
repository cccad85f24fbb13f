"""The quantized graph as plain data, and the contract's integer arithmetic in one place.

The integer layers (the dataclasses below) hold exactly the integers of the contract
(docs/contract.md); :mod:`dnnfab.sw.quant.ptq` builds them from a float graph, the
compiler (:mod:`dnnfab.sw.compiler`) consumes them as they are, the literal reference
(:mod:`dnnfab.sw.ref.golden`) and the CPU executor (:mod:`dnnfab.sw.cpu.reference`) run
them. :class:`QuantizedGraph` here is data only: executing it is the business of the
layers below (``dnnfab.quantize`` returns :class:`dnnfab.sw.runtime.api.QuantizedNetwork`,
this class plus ``run``/``run_int``/``export``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...errors import ModelError
from .graph import INF, Graph, Layer

ACC_MAX = 2**31 - 1
M_BITS = 15  # m in [2**14, 2**15)


# ====================================================================== arithmetic
def quantize_multiplier(M):
    """Return int (m, n) with m in [2**14, 2**15), 1 <= n <= 62 and m * 2**-n ~= M.

    Raises ModelError when M >= 2**14 (cannot be represented with n >= 1).
    """
    M = float(M)
    if not (M > 0 and math.isfinite(M)):
        raise ModelError(f"requantization multiplier {M!r} is not positive; the layer's scales "
                         "are degenerate (recalibrate with representative data)")
    mant, exp = math.frexp(M)  # M = mant * 2**exp, mant in [0.5, 1)
    m = int(round(mant * 2**M_BITS))
    n = M_BITS - exp
    if m == 2**M_BITS:
        m //= 2
        n -= 1
    if n < 1:
        raise ModelError(f"requantization multiplier {M:.3g} is too large (>= 2^14); the output "
                         "scale is far smaller than the input's -- recalibrate")
    if n > 62:  # |acc * M| < 2**-17: the term is 0 whichever way it is rounded
        m, n = 2**14, 62
    return m, n


def requantize(acc, m, n, zy, lo, hi):
    """The contract's requantize, literally, in int64: works on any broadcastable shapes."""
    acc = np.asarray(acc, np.int64)
    m = np.asarray(m, np.int64)
    n = np.asarray(n, np.int64)
    y = (acc * m + (np.int64(1) << (n - 1))) >> n
    return np.clip(y + zy, lo, hi).astype(np.int8)


def quantize_tensor(x, scale, zp):
    """Float -> int8 like ONNX QuantizeLinear (round half to even, saturate)."""
    q = np.rint(np.asarray(x, np.float32) / np.float32(scale)) + zp
    return np.clip(q, -128, 127).astype(np.int8)


def dequantize_tensor(q, scale, zp):
    return ((q.astype(np.int32) - zp).astype(np.float32) * np.float32(scale)).astype(np.float32)


def act_bounds(act, sy, zy):
    """Integer (lo, hi) of a fused ReLU/Clip for output params (sy, zy)."""
    if not act:
        return -128, 127
    a, b = act[1], act[2]
    lo = -128 if a == -INF else max(-128, min(127, zy + int(np.rint(a / sy))))
    hi = 127 if b == INF else max(-128, min(127, zy + int(np.rint(b / sy))))
    return lo, hi


# ====================================================================== layers
@dataclass
class QTensor:
    """Quantization of one activation tensor: ``real = scale * (q - zero_point)``."""

    scale: np.float32
    zero_point: int


@dataclass
class QConv:
    """Integer convolution (also depthwise and 1-D), per the contract.

    Input and output are int8; the reference's :func:`~dnnfab.sw.cpu.reference.qconv_int`
    takes/returns channel-last (NHWC) arrays. 1-D convs have ``kh == 1`` and H = 1.

    Fields
    ------
    qweight : int8 [Cout, Cin/groups, kh, kw]   symmetric, values in [-127, 127]
    bias    : int32 [Cout]  folded bias' = bias_q - zx * sum(qweight[c])
    m, n    : int32 [Cout]  requantize multiplier m in [2^14, 2^15) and shift n >= 1
    zx, zy  : int            input / output zero points (padding uses the value zx)
    lo, hi  : int            output clamp (fused ReLU/Clip), -128 <= lo <= hi <= 127
    stride  : (sh, sw); pad: (top, left, bottom, right); dilation: (dh, dw); groups: int
    acc_bound : int          proven max |acc| over all int8 inputs (< 2^31)
    sx, sy, sw, bias_q : float/int32 scales and unfolded bias (for export and debugging)
    """

    name: str
    input: str
    output: str
    qweight: np.ndarray
    bias: np.ndarray
    m: np.ndarray
    n: np.ndarray
    zx: int
    zy: int
    lo: int
    hi: int
    stride: tuple
    pad: tuple
    dilation: tuple
    groups: int
    acc_bound: int = 0
    sx: np.float32 = np.float32(1)
    sy: np.float32 = np.float32(1)
    sw: np.ndarray = None
    bias_q: np.ndarray = None
    rank: int = 2
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    op = "conv"

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QGemm:
    """Integer fully connected layer over the last axis: x int8 [M, K] -> y int8 [M, N].

    qweight int8 [N, K]; bias int32 [N] (folded, like :class:`QConv`); m, n int32 [N];
    zx, zy, lo, hi ints; acc_bound; sx, sy, sw [N], bias_q [N] for export.
    """

    name: str
    input: str
    output: str
    qweight: np.ndarray
    bias: np.ndarray
    m: np.ndarray
    n: np.ndarray
    zx: int
    zy: int
    lo: int
    hi: int
    acc_bound: int = 0
    sx: np.float32 = np.float32(1)
    sy: np.float32 = np.float32(1)
    sw: np.ndarray = None
    bias_q: np.ndarray = None
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    op = "gemm"

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QMaxPool:
    """Max pool on int8: exact, same scale/zero point in and out; padding is -128.

    kernel (kh, kw), stride, pad (t, l, b, r), dilation, extra (ceil-mode end padding).
    """

    name: str
    input: str
    output: str
    kernel: tuple
    stride: tuple
    pad: tuple
    dilation: tuple
    extra: tuple = (0, 0)

    op = "maxpool"

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QAvgPool:
    """Average pool: acc = sum over the window of (q - zx) (padding adds 0), then
    y = clamp(zy + requant(acc, m[i, j], n[i, j]), lo, hi) with the multiplier of output
    position (i, j) equal to ``sx / (sy * count[i, j])``. m, n, count: int32 [Ho, Wo]."""

    name: str
    input: str
    output: str
    kernel: tuple
    stride: tuple
    pad: tuple
    dilation: tuple
    extra: tuple
    count_include_pad: int
    count: np.ndarray
    m: np.ndarray
    n: np.ndarray
    zx: int
    zy: int
    lo: int
    hi: int
    is_global: bool = False
    sx: np.float32 = np.float32(1)
    sy: np.float32 = np.float32(1)
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    op = "avgpool"

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QEltwise:
    """Residual add (``op='add'``: one output from all inputs), concat (``op='concat'``:
    each input rescaled, then joined on logical ``axis``) or a single-input rescale
    (``op='rescale'``). For every input i: int32 weight ``k[i]`` and zero point ``z[i]``;
    ``acc = sum_i k[i] * (q_i - z[i])`` (add) or ``k[i] * (q_i - z[i])`` (concat/rescale),
    then ``y = clamp(zy + ((acc*m + 2^(n-1)) >> n), lo, hi)`` with scalar m, n.
    ``identity[i]`` is True when input i passes through unchanged."""

    name: str
    op: str
    inputs: list
    output: str
    k: np.ndarray
    z: np.ndarray
    m: int
    n: int
    zy: int
    lo: int
    hi: int
    axis: int = 1
    identity: tuple = ()
    sy: np.float32 = np.float32(1)
    cache: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass
class QClip:
    """Standalone ReLU/Clip on int8 with unchanged scale: y = clamp(x, lo, hi)."""

    name: str
    input: str
    output: str
    lo: int
    hi: int

    op = "clip"

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QLayout:
    """Data movement on int8 codes: ``op`` is 'reshape' (attr = shape) or 'transpose'
    (attr = perm). Scale and zero point are unchanged."""

    name: str
    op: str
    input: str
    output: str
    attr: tuple

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QLut:
    """Element-wise unary op as a table: y = table[x + 128] (int8 [256]). The table is
    the float op evaluated on every input code and quantized to the output params."""

    name: str
    input: str
    output: str
    table: np.ndarray
    op_type: str = ""

    op = "lut"

    @property
    def inputs(self):
        return [self.input]


@dataclass
class QFloat:
    """CPU float fallback: dequantize the inputs, run the float IR layer, quantize the
    output (round half to even, saturate) with the output's params."""

    name: str
    layer: Layer
    inputs: list
    output: str

    op = "float"


# ====================================================================== graph
class QuantizedGraph:
    """An int8 network: integer layers plus the quantization of every tensor (data only;
    the executors are :func:`dnnfab.sw.cpu.reference.run_reference` and
    :class:`dnnfab.sw.runtime.api.QuantizedNetwork`)."""

    kind = "int8"
    #: weights quantized to 7 bits ([-63, 63]; ``quantize(..., reduce_range=True)``)
    reduce_range = False

    def __init__(self, name, inputs, outputs, layers, qtensors, shapes, float_graph=None):
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.layers = list(layers)
        self.qtensors = dict(qtensors)
        self.shapes = dict(shapes)
        self.float_graph = float_graph

    def __repr__(self):
        return (f"<QuantizedGraph {self.name!r}: {len(self.layers)} layers, "
                f"inputs {[(t.name, t.shape) for t in self.inputs]}>")

    def shape(self, name):
        return self.shapes[name]

    def check_feed(self, feed):
        return Graph.check_feed(self, feed)

    def quantize_inputs(self, feed):
        feed = self.check_feed(feed)
        return {k: quantize_tensor(v, self.qtensors[k].scale, self.qtensors[k].zero_point)
                for k, v in feed.items()}

    def summary(self):
        rows = []
        if self.float_graph is not None:
            rows = self.float_graph.summary()
        return rows



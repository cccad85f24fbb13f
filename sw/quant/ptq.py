"""Post-training int8 quantization: float :class:`Graph` -> :class:`QuantizedGraph`.

The result is a list of integer layers (the dataclasses below) whose fields are exactly
the integers of the contract in docs/contract.md; the hardware compiler consumes them
as they are and :mod:`dnnfab.sw.cpu.reference` executes them (the golden model).

Number formats
--------------
* Activations: int8 per tensor, ``real = s * (q - z)``, z in [-128, 127]. Scales are
  float32. Ranges come from calibration (``minmax`` or ``percentile``), always include 0.
* Weights: int8 symmetric per output channel, q in [-127, 127] (never -128); with
  ``reduce_range=True`` 7-bit, q in [-63, 63]: then every pair of uint8 x int8 products
  stays within int16 (2 * 255 * 63 < 2^15), so onnxruntime's fused int8 kernels on x86
  CPUs without VNNI (which sum such pairs in saturating int16) compute the exported QDQ
  model exactly too. It costs one bit of weight resolution.
* Bias: int32 at scale ``s_x * s_w[c]``; the input zero point is folded offline:
  ``bias'[c] = round(b[c] / (s_x s_w[c])) - z_x * sum(q_w[c])`` (field ``bias``; the
  unfolded value is kept in ``bias_q`` for the QDQ export).
* Requantize (one rule for every layer that changes scale)::

      y = clamp(z_y + ((acc * m + 2**(n-1)) >> n), lo, hi)      # >> arithmetic, int64

  with ``m`` in [2**14, 2**15) and ``n`` >= 1 (``n`` is capped at 62; a multiplier that
  small makes the term 0 anyway). ``lo``/``hi`` encode the fused activation: none ->
  [-128, 127]; ReLU -> lo = max(-128, z_y); Clip(a, b) -> z_y + round(a / s_y) ... .

Exactness trick: the real multiplier is ``M = s_x s_w[c] / s_y``. After rounding it to
``m * 2**-n`` we *move the rounding error into a free scale* -- ``s_w[c]`` for conv/gemm,
``s_y`` for pool/add/concat -- so that the stored float scales reproduce ``m * 2**-n``
(up to float32 rounding, ~1e-7 relative). A QDQ model exported from these scales
(:mod:`dnnfab.sw.frontend.export`) then makes onnxruntime compute the same integers as our 15-bit
fixed-point multiplier, which is what lets the reference agree with onnxruntime on
>= 99.9 % of the output codes. (Models imported with their own QDQ scales keep their
activation scales; only the weight scales move.)

Element-wise ops that combine tensors (add, concat, qdq rescale) first bring every input to
a common integer scale with int32 weights ``k_i = round(2**K * s_i / s_ref)`` (``s_ref``
the largest input scale, K chosen so the sum cannot overflow int32):
``acc = sum_i k_i * (q_i - z_i)``, then the common requantize with ``M = s_ref / (2**K
s_y)``. An input whose scale and zero point equal the output's passes through unchanged.

Average pool: ``acc = sum over the window of (q - z_x)`` (padding contributes 0) and the
multiplier ``s_x / (s_y * count)`` is stored per output position (``count`` differs at the
borders when padding is not counted).

Int32 overflow guard: for conv/gemm ``|acc| <= |bias'| + 128 * sum|q_w[c]|`` is checked per
channel at quantization time (``acc_bound``); a layer that could overflow is rejected with
:class:`~dnnfab.errors.ModelError`.

Ops outside the contract (softmax, LRN, ...): element-wise unary ones become a 256-entry
lookup table (:class:`QLut`, the float function evaluated on every int8 code); others run
in float on the CPU (:class:`QFloat`: dequantize, float op, quantize with round-half-even).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import InputError, ModelError
from ..ir.graph import UNARY_OPS, Graph, pool_counts, run_float_layer
from ..ir.qgraph import (ACC_MAX, QuantizedGraph, QTensor, QConv, QGemm, QMaxPool, QAvgPool,
                         QEltwise, QClip, QLayout, QLut, QFloat, quantize_multiplier, act_bounds,
                         quantize_tensor, dequantize_tensor)

# ====================================================================== calibration
def _calibration_feeds(graph, calibration, rng_seed=0, n_random=8):
    """Normalize ``calibration`` to a list of feed dicts."""
    names = [t.name for t in graph.inputs]
    if calibration is None:
        rng = np.random.default_rng(rng_seed)
        return [{t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}
                for _ in range(n_random)]
    if isinstance(calibration, dict):
        arrays = {k: np.asarray(v, np.float32) for k, v in calibration.items()}
        for k in arrays:
            if k not in names:
                raise InputError(f"calibration input {k!r} is not a model input {names}; "
                                 "use the model's input names")
        return _split_batches(graph, arrays)
    if isinstance(calibration, np.ndarray):
        if len(names) != 1:
            raise InputError(f"the model has inputs {names}; pass calibration as a dict")
        return _split_batches(graph, {names[0]: np.asarray(calibration, np.float32)})
    feeds = []
    for item in calibration:
        if isinstance(item, dict):
            feeds.extend(_split_batches(graph, {k: np.asarray(v, np.float32)
                                                for k, v in item.items()}))
        else:
            if len(names) != 1:
                raise InputError(f"the model has inputs {names}; pass dicts of arrays")
            feeds.extend(_split_batches(graph, {names[0]: np.asarray(item, np.float32)}))
    if not feeds:
        raise InputError("calibration data is empty; pass at least one input sample")
    return feeds


def _split_batches(graph, arrays):
    """Cut arrays of N samples into feeds of the graph's batch size."""
    t0 = graph.inputs[0]
    x0 = arrays.get(t0.name)
    if x0 is None:
        raise InputError(f"calibration data lacks input {t0.name!r}")
    b = t0.shape[0]
    if x0.shape == t0.shape:
        return [arrays]
    if x0.shape[1:] == t0.shape[1:] and x0.shape[0] % b == 0:
        n = x0.shape[0] // b
        return [{k: v[i * b:(i + 1) * b] for k, v in arrays.items()} for i in range(n)]
    if x0.shape == t0.shape[1:] and b == 1:
        return [{k: v[None] for k, v in arrays.items()}]
    raise InputError(f"calibration input {t0.name!r} has shape {list(x0.shape)}, expected "
                     f"[N*{b}, ...{list(t0.shape[1:])}]")


class _Observer:
    def __init__(self, method, percentile):
        self.method = method
        self.pct = percentile
        self.lo, self.hi, self.n = {}, {}, {}

    def __call__(self, name, x):
        x = np.asarray(x)
        if x.dtype.kind != "f" or x.size == 0:
            return
        with np.errstate(invalid="ignore"):
            finite = x if np.isfinite(x).all() else x[np.isfinite(x)]
        if finite.size == 0:
            return
        if self.method == "percentile" and finite.size > 16:
            lo, hi = np.percentile(finite, [100 - self.pct, self.pct])
            self.lo[name] = self.lo.get(name, 0.0) + float(lo)
            self.hi[name] = self.hi.get(name, 0.0) + float(hi)
            self.n[name] = self.n.get(name, 0) + 1
        else:
            lo, hi = float(finite.min()), float(finite.max())
            if self.method == "percentile":  # tiny tensor: treat as min/max, averaged
                self.lo[name] = self.lo.get(name, 0.0) + lo
                self.hi[name] = self.hi.get(name, 0.0) + hi
                self.n[name] = self.n.get(name, 0) + 1
            else:
                self.lo[name] = min(self.lo.get(name, lo), lo)
                self.hi[name] = max(self.hi.get(name, hi), hi)
                self.n[name] = 1

    def range(self, name):
        if name not in self.lo:
            return 0.0, 0.0
        n = self.n[name]
        return self.lo[name] / n, self.hi[name] / n


def qtensor_from_range(lo, hi):
    """Asymmetric int8 params covering [lo, hi] and 0."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    s = (hi - lo) / 255.0
    if not (s > 1e-30 and math.isfinite(s)):
        return QTensor(np.float32(1.0), 0)
    s = np.float32(s)
    z = int(np.clip(np.rint(-128.0 - lo / float(s)), -128, 127))
    return QTensor(s, z)


# ====================================================================== quantizer
def quantize_graph(graph, calibration=None, method="minmax", percentile=99.99,
                   reduce_range=False, graph_class=QuantizedGraph):
    """Quantize a float graph to int8 (see the module docstring).

    calibration: representative inputs -- an array [N, ...] (single-input models), a dict
    {input: array [N, ...]}, or an iterable of arrays/dicts. ``None`` uses 8 standard
    normal samples (only meaningful for smoke tests). method: ``"minmax"`` or
    ``"percentile"`` (``percentile`` of each tensor, averaged over the samples).
    reduce_range: 7-bit weights (q in [-63, 63]) so that onnxruntime's optimized session
    runs the exported QDQ model exactly on CPUs without VNNI as well (see the module
    docstring); the result records it as ``QuantizedGraph.reduce_range``.
    graph_class: the class of the result, :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph` or
    a subclass (``dnnfab.quantize`` passes the runtime's, which adds the executors).
    """
    if not isinstance(graph, Graph):
        raise InputError(f"quantize() needs a graph from dnnfab.load(), got "
                         f"{type(graph).__name__}")
    if method not in ("minmax", "percentile"):
        raise InputError(f"unknown calibration method {method!r}; use 'minmax' or "
                         "'percentile'")
    feeds = _calibration_feeds(graph, calibration)
    obs = _Observer(method, percentile)
    with np.errstate(all="ignore"):
        for feed in feeds:
            graph.run(feed, observer=obs)
    return _Quantizer(graph, obs, reduce_range=reduce_range).build(graph_class)


_SHARES_INPUT_PARAMS = ("maxpool", "clip", "reshape", "transpose")


class _Quantizer:
    def __init__(self, graph, obs, reduce_range=False):
        self.g = graph
        self.obs = obs
        self.reduce_range = bool(reduce_range)
        self.wmax = 63 if reduce_range else 127  # symmetric weight codes in [-wmax, wmax]
        self.qt = {}
        self.prod = graph.producers()
        self.cons = graph.consumers()
        # tensors whose params a QDQ model fixes
        self.fixed = {}
        for layer in graph.layers:
            if layer.op == "qdq":
                p = QTensor(np.float32(layer.attrs["scale"]), int(layer.attrs["zero_point"]))
                self.fixed[layer.output] = p
                src = layer.inputs[0]
                self.fixed.setdefault(src, p)

    def params_for(self, name):
        """Quantization of tensor ``name`` (calibrated unless a QDQ model fixes it)."""
        if name in self.qt:
            return self.qt[name]
        if name in self.fixed:
            p = self.fixed[name]
        else:
            p = qtensor_from_range(*self.obs.range(name))
        self.qt[name] = p
        return p

    def build(self, graph_class=QuantizedGraph):
        g = self.g
        for t in g.inputs:
            self.params_for(t.name)
        layers = []
        for layer in g.layers:
            q = getattr(self, f"q_{layer.op}", self.q_float)(layer)
            layers.append(q)
        shapes = {k: v.shape for k, v in g.tensors.items()}
        q = graph_class(g.name, g.inputs, g.outputs, layers, self.qt, shapes, g)
        q.reduce_range = self.reduce_range
        return q

    # ---------------------------------------------------------------- helpers
    def _weights(self, layer, sx):
        """Per-channel symmetric int8 weights (codes in [-wmax, wmax]) and their float
        scales. A QDQ model's own int8 weights are kept when they fit that range."""
        w = layer.params["weight"].astype(np.float64)
        cout = w.shape[0]
        wf = w.reshape(cout, -1)
        qi = layer.attrs.get("weight_qinfo")
        if qi is not None:
            q, s, z, axis = qi
            q = np.asarray(q)
            fits = not self.reduce_range or \
                np.abs(q.astype(np.int16)).max(initial=0) <= self.wmax
            if q.dtype == np.int8 and not np.any(np.asarray(z)) and axis == 0 and \
                    q.shape[0] == cout and q.size == w.size and fits:
                sw = np.broadcast_to(np.asarray(s, np.float64).reshape(-1), (cout,)).copy()
                return np.clip(q.reshape(w.shape), -127, 127).astype(np.int8), sw
        maxabs = np.abs(wf).max(axis=1)
        b = np.abs(layer.params["bias"].astype(np.float64))
        sw = np.maximum(maxabs / float(self.wmax), b / (float(sx) * 2.0**24))
        sw = np.where(sw > 0, sw, 1.0)
        qw = np.clip(np.rint(w / sw.reshape((-1,) + (1,) * (w.ndim - 1))), -self.wmax, self.wmax)
        return qw.astype(np.int8), sw

    def _mac_layer(self, layer):
        xin = layer.inputs[0]
        px = self.params_for(xin)
        py = self.params_for(layer.output)
        sx, sy = float(px.scale), float(py.scale)
        qw, sw = self._weights(layer, sx)
        cout = qw.shape[0]
        m = np.zeros(cout, np.int32)
        n = np.zeros(cout, np.int32)
        sw_adj = np.zeros(cout, np.float32)
        for c in range(cout):
            m[c], n[c] = quantize_multiplier(sx * sw[c] / sy)
            sw_adj[c] = np.float32(m[c] * 2.0 ** -int(n[c]) * sy / sx)
            if not sw_adj[c] > 0:  # float32 underflow of a dead channel
                sw_adj[c] = np.float32(sw[c]) if sw[c] > 0 else np.float32(1e-30)
        bscale = np.float64(np.float32(sx)) * sw_adj.astype(np.float64)
        bias_q64 = np.rint(layer.params["bias"].astype(np.float64) / bscale)
        wsum = qw.reshape(cout, -1).astype(np.int64).sum(axis=1)
        wabs = np.abs(qw.reshape(cout, -1).astype(np.int64)).sum(axis=1)
        folded = bias_q64 - px.zero_point * wsum
        bound = np.abs(folded) + 128 * wabs
        if np.abs(bias_q64).max(initial=0) > ACC_MAX or bound.max(initial=0) > ACC_MAX:
            c = int(np.argmax(bound))
            raise ModelError(f"layer {layer.name!r}: the int32 accumulator could overflow "
                             f"(channel {c}: bound {int(bound[c])} > 2^31-1); split the layer "
                             "or reduce its fan-in / bias range")
        lo, hi = act_bounds(layer.attrs.get("act"), sy, py.zero_point)
        return dict(qweight=qw, bias=folded.astype(np.int32), m=m, n=n, zx=px.zero_point,
                    zy=py.zero_point, lo=lo, hi=hi, acc_bound=int(bound.max(initial=0)),
                    sx=px.scale, sy=py.scale, sw=sw_adj, bias_q=bias_q64.astype(np.int32))

    # ---------------------------------------------------------------- per op
    def q_conv(self, layer):
        a = layer.attrs
        f = self._mac_layer(layer)
        return QConv(layer.name, layer.inputs[0], layer.output, stride=tuple(a["stride"]),
                     pad=tuple(a["pads"]), dilation=tuple(a["dilation"]), groups=a["groups"],
                     rank=a.get("rank", 2), **f)

    def q_gemm(self, layer):
        f = self._mac_layer(layer)
        return QGemm(layer.name, layer.inputs[0], layer.output, **f)

    def _share(self, layer):
        p = self.params_for(layer.inputs[0])
        if layer.output in self.fixed and self.fixed[layer.output] != p:
            return None  # a QDQ model wants other params here: rescale afterwards
        self.qt[layer.output] = p
        return p

    def q_maxpool(self, layer):
        a = layer.attrs
        self._share_or_fail(layer)
        return QMaxPool(layer.name, layer.inputs[0], layer.output, tuple(a["kernel"]),
                        tuple(a["stride"]), tuple(a["pads"]), tuple(a["dilation"]),
                        tuple(a.get("extra", (0, 0))))

    def _share_or_fail(self, layer):
        if self._share(layer) is None:
            # keep input params: the difference is reconciled by the following qdq rescale
            self.qt[layer.output] = self.params_for(layer.inputs[0])

    def q_clip(self, layer):
        p = self.params_for(layer.inputs[0])
        self.qt[layer.output] = p
        lo, hi = act_bounds(("clip", layer.attrs["lo"], layer.attrs["hi"]), float(p.scale),
                            p.zero_point)
        return QClip(layer.name, layer.inputs[0], layer.output, lo, hi)

    def q_reshape(self, layer):
        self.qt[layer.output] = self.params_for(layer.inputs[0])
        return QLayout(layer.name, "reshape", layer.inputs[0], layer.output,
                       tuple(layer.attrs["shape"]))

    def q_transpose(self, layer):
        self.qt[layer.output] = self.params_for(layer.inputs[0])
        return QLayout(layer.name, "transpose", layer.inputs[0], layer.output,
                       tuple(layer.attrs["perm"]))

    def q_avgpool(self, layer):
        a = layer.attrs
        px = self.params_for(layer.inputs[0])
        xs = self.g.shape(layer.inputs[0])
        h, w = (1, xs[2]) if len(xs) == 3 else xs[2:]
        count = pool_counts(h, w, a)
        py = self.params_for(layer.output)
        if layer.output not in self.fixed:
            # make the most common count's multiplier exact by adjusting s_y
            vals, freq = np.unique(count, return_counts=True)
            c0 = int(vals[np.argmax(freq)])
            m0, n0 = quantize_multiplier(float(px.scale) / (float(py.scale) * c0))
            sy = np.float32(float(px.scale) * 2.0**n0 / (m0 * c0))
            py = QTensor(sy, py.zero_point)
            self.qt[layer.output] = py
        mm = np.zeros(count.shape, np.int32)
        nn = np.zeros(count.shape, np.int32)
        for c in np.unique(count):
            mc, nc = quantize_multiplier(float(px.scale) / (float(py.scale) * int(c)))
            mm[count == c], nn[count == c] = mc, nc
        lo, hi = act_bounds(a.get("act"), float(py.scale), py.zero_point)
        return QAvgPool(layer.name, layer.inputs[0], layer.output, tuple(a["kernel"]),
                        tuple(a["stride"]), tuple(a["pads"]), tuple(a["dilation"]),
                        tuple(a.get("extra", (0, 0))), int(a.get("count_include_pad", 0)),
                        count.astype(np.int32), mm, nn, px.zero_point, py.zero_point, lo, hi,
                        bool(a.get("is_global")), px.scale, py.scale)

    def _eltwise(self, layer, op, axis=1, act=None):
        ins = [self.params_for(t) for t in layer.inputs]
        py = self.params_for(layer.output)
        s_in = np.array([float(p.scale) for p in ins])
        s_ref = float(s_in.max())
        n_terms = len(ins) if op == "add" else 1
        K = int(math.floor(math.log2(ACC_MAX / (255.0 * n_terms)))) if n_terms else 22
        K = min(K, 22)
        k = np.array([int(np.rint(2.0**K * s / s_ref)) for s in s_in], np.int64)
        M = s_ref / (2.0**K * float(py.scale))
        m, n = quantize_multiplier(M)
        if layer.output not in self.fixed:
            # exact multiplier: move the rounding into s_y
            py = QTensor(np.float32(s_ref * 2.0**n / (2.0**K * m)), py.zero_point)
            self.qt[layer.output] = py
        lo, hi = act_bounds(act, float(py.scale), py.zero_point)
        z = np.array([p.zero_point for p in ins], np.int32)
        ident = tuple(bool(p.scale == py.scale and p.zero_point == py.zero_point
                           and kk == 2**K and (m, n) == (2**14, K + 14) and op != "add")
                      for p, kk in zip(ins, k))
        return QEltwise(layer.name, op, list(layer.inputs), layer.output, k.astype(np.int32), z,
                        int(m), int(n), py.zero_point, lo, hi, axis, ident, py.scale)

    def q_add(self, layer):
        return self._eltwise(layer, "add", act=layer.attrs.get("act"))

    def q_concat(self, layer):
        # concat of tensors with the same params passes them through: prefer the params of
        # the inputs when they all agree
        ins = [self.params_for(t) for t in layer.inputs]
        if layer.output not in self.fixed and layer.output not in self.qt and \
                all(p == ins[0] for p in ins):
            self.qt[layer.output] = ins[0]
            q = self._eltwise(layer, "concat", axis=layer.attrs["axis"])
            return q
        return self._eltwise(layer, "concat", axis=layer.attrs["axis"])

    def q_qdq(self, layer):
        return self._eltwise(layer, "rescale")

    def q_float(self, layer):
        for t in layer.inputs:
            self.params_for(t)
        py = self.params_for(layer.output)
        t = layer.attrs.get("op_type")
        if t in UNARY_OPS and len(layer.inputs) == 1 and not layer.params:
            px = self.qt[layer.inputs[0]]
            codes = np.arange(-128, 128, dtype=np.int32)
            x = dequantize_tensor(codes.astype(np.int8), px.scale, px.zero_point)
            with np.errstate(all="ignore"):
                y = run_float_layer(layer, [x])[0]
            table = quantize_tensor(np.nan_to_num(y, nan=0.0, posinf=3e38, neginf=-3e38),
                                    py.scale, py.zero_point)
            return QLut(layer.name, layer.inputs[0], layer.output, table, t)
        return QFloat(layer.name, layer, list(layer.inputs), layer.output)

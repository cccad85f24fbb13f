"""The float graph IR: a list of layers with static shapes, and its numpy semantics.

The front end (:mod:`dnnfab.sw.frontend.onnx_import`) turns an ONNX model into a :class:`Graph`;
the quantizer (:mod:`dnnfab.sw.quant.ptq`) turns a :class:`Graph` into integer layers.

Design
------
* A :class:`Graph` is a topologically ordered list of :class:`Layer`. Tensors are named as
  in the ONNX model (so ``run`` returns the ONNX output names) and every tensor has a
  static shape (:class:`TensorInfo`); the batch size is fixed at import time.
* Layers use a small, closed set of canonical ops. Constants (weights, bias, folded batch
  norm) live in ``Layer.params`` as float32 arrays; structural settings in ``Layer.attrs``.

  ==========  ==========================================================================
  op          meaning (logical layout is always ONNX's: N, C, spatial...)
  ==========  ==========================================================================
  conv        1-D/2-D convolution. params ``weight`` [Cout, Cin/g, kh, kw] (1-D convs are
              stored with kh = 1), ``bias`` [Cout]. attrs ``stride`` (sh, sw), ``pads``
              (top, left, bottom, right), ``dilation`` (dh, dw), ``groups``, ``act``.
  gemm        y = x @ weight.T + bias over the last axis. params ``weight`` [N, K],
              ``bias`` [N]. attrs ``act``.
  maxpool     attrs ``kernel``, ``stride``, ``pads``, ``dilation``, ``extra`` (ceil-mode
              padding at the end, never counted).
  avgpool     attrs as maxpool plus ``count_include_pad``; GlobalAveragePool is an avgpool
              whose kernel is the whole plane. attrs ``act``.
  add         element-wise sum of n >= 2 same-shape tensors (Add/Sum). attrs ``act``.
  concat      attrs ``axis``.
  clip        standalone ReLU/Clip: attrs ``lo``, ``hi`` (float, may be +-inf).
  reshape     attrs ``shape`` (static output shape); Flatten/Squeeze/Unsqueeze too.
  transpose   attrs ``perm``.
  qdq         fake quantization found in a QDQ model: attrs ``scale``, ``zero_point``
              (int8 domain) -- the model's own quantization parameters.
  float       any other ONNX op, run on the CPU in float: attrs ``op_type`` and
              ``onnx_attrs``; constant inputs are in ``params`` under their input index
              (key ``"in<i>"``) and the non-constant inputs are ``inputs``.
  ==========  ==========================================================================

  ``act`` is ``None`` or ``("clip", lo, hi)`` (ReLU is ``("clip", 0.0, inf)``): a fused
  ReLU/Clip applied to the output.
* ``target`` of a layer says where the integer network runs it: ``fabric`` for the ops in
  the integer contract (conv, gemm, pools, add, concat, clip), ``cpu`` for the rest.

The float kernels here compute in float32 with the same channel-last im2col machinery the
integer reference uses (:func:`conv_nhwc`), which keeps one implementation of the
sliding-window geometry for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...errors import InputError, UnsupportedOpError

INF = float("inf")

#: Ops that the integer contract covers (run on the fabric).
FABRIC_OPS = frozenset({"conv", "gemm", "maxpool", "avgpool", "add", "concat", "clip"})


@dataclass
class TensorInfo:
    """Name, static shape and numpy dtype of a tensor."""

    name: str
    shape: tuple
    dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        self.dtype = np.dtype(self.dtype)


@dataclass
class Layer:
    """One node of the IR (see the module docstring for the ops and their fields)."""

    name: str
    op: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    @property
    def output(self):
        return self.outputs[0]

    @property
    def target(self):
        return "fabric" if self.op in FABRIC_OPS else "cpu"

    def describe_op(self):
        """Short human-readable op name for tables, e.g. ``conv3x3/2+relu`` or ``Softmax``."""
        a = self.attrs
        if self.op == "conv":
            kh, kw = self.params["weight"].shape[2:]
            s = f"conv1d{kw}" if a.get("rank") == 1 else f"conv{kh}x{kw}"
            if a["stride"] != (1, 1):
                s += f"/{max(a['stride'])}"
            if a["groups"] > 1:
                s += f" g{a['groups']}"
        elif self.op == "float":
            s = a["op_type"]
        else:
            s = self.op
        act = a.get("act")
        if act:
            s += "+relu" if act[1] == 0.0 and act[2] == INF else "+clip"
        return s


class Graph:
    """A float network: inputs, outputs, ordered layers and the shape of every tensor.

    ``run(feed)`` executes it in numpy float32 and returns ``{output name: array}``.
    """

    kind = "float"

    def __init__(self, name, inputs, outputs, layers, tensors, opset=13, source=None):
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.layers = list(layers)
        self.tensors = dict(tensors)
        self.opset = opset
        self.source = source

    # ------------------------------------------------------------------ inspection
    def __repr__(self):
        return (f"<{type(self).__name__} {self.name!r}: {len(self.layers)} layers, "
                f"inputs {[(t.name, t.shape) for t in self.inputs]}, "
                f"outputs {[(t.name, t.shape) for t in self.outputs]}>")

    def shape(self, name):
        return self.tensors[name].shape

    def consumers(self):
        """Map tensor name -> list of layers reading it."""
        cons = {}
        for layer in self.layers:
            for t in layer.inputs:
                cons.setdefault(t, []).append(layer)
        return cons

    def producers(self):
        return {o: layer for layer in self.layers for o in layer.outputs}

    def summary(self):
        """Per-layer rows: name, op, input/output shapes, MACs, params, target."""
        rows = []
        for layer in self.layers:
            out_shape = self.shape(layer.output)
            in_shapes = [self.shape(t) for t in layer.inputs]
            macs, nparams = layer_cost(layer, in_shapes, out_shape)
            rows.append(dict(name=layer.name, op=layer.describe_op(), inputs=in_shapes,
                             output=out_shape, macs=macs, params=nparams, target=layer.target))
        return rows

    # ------------------------------------------------------------------ execution
    def check_feed(self, feed):
        """Validate ``feed`` against the graph inputs; return {name: float32 array}."""
        if not isinstance(feed, dict):
            if len(self.inputs) == 1:
                feed = {self.inputs[0].name: feed}
            else:
                raise InputError(f"run() needs a dict of inputs {[t.name for t in self.inputs]}; "
                                 "pass {name: array}")
        names = {t.name for t in self.inputs}
        for k in feed:
            if k not in names:
                raise InputError(f"unknown input {k!r}; this model's inputs are "
                                 f"{sorted(names)}")
        out = {}
        for t in self.inputs:
            if t.name not in feed:
                raise InputError(f"missing input {t.name!r} (shape {list(t.shape)}); "
                                 "add it to the feed dict")
            x = feed[t.name]
            if not isinstance(x, np.ndarray):
                raise InputError(f"input {t.name!r} must be a numpy array, got "
                                 f"{type(x).__name__}; wrap it with np.asarray(..., np.float32)")
            if x.dtype != t.dtype:
                if x.dtype.kind == "f" and t.dtype.kind == "f":
                    x = x.astype(t.dtype)
                else:
                    raise InputError(f"input {t.name!r} has dtype {x.dtype}, expected "
                                     f"{t.dtype}; convert with .astype(np.{t.dtype.name})")
            if tuple(x.shape) != t.shape:
                hint = ("; load the model with batch=N for another batch size"
                        if x.ndim == len(t.shape) and tuple(x.shape[1:]) == t.shape[1:] else "")
                raise InputError(f"input {t.name!r} has shape {list(x.shape)}, expected "
                                 f"{list(t.shape)}{hint}")
            out[t.name] = x
        return out

    def run(self, feed, observer=None):
        """Execute in float32. ``observer(tensor_name, array)`` sees every tensor."""
        env = dict(self.check_feed(feed))
        if observer:
            for k, v in env.items():
                observer(k, v)
        for layer in self.layers:
            ys = run_float_layer(layer, [env[t] for t in layer.inputs])
            for name, y in zip(layer.outputs, ys):
                env[name] = y
                if observer:
                    observer(name, y)
        return {t.name: env[t.name] for t in self.outputs}


# ====================================================================== geometry
def pool_out_size(size, k, s, pb, pe, d=1, ceil_mode=False):
    """Output length of a sliding window; returns (out, extra_end_padding)."""
    eff = (k - 1) * d + 1
    span = size + pb + pe - eff
    if ceil_mode:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + pb:  # last window would start in the end padding
            out -= 1
    else:
        out = span // s + 1
    extra = max(0, (out - 1) * s + eff - (size + pb + pe))
    return out, extra


def auto_pads(size, k, s, d, mode):
    """Explicit (begin, end) pads for ONNX auto_pad SAME_UPPER / SAME_LOWER / VALID."""
    if mode in ("VALID", "NOTSET", ""):
        return 0, 0
    out = -(-size // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    if mode == "SAME_UPPER":
        return total // 2, total - total // 2
    return total - total // 2, total // 2


def conv_out_hw(h, w, kh, kw, stride, pads, dilation):
    ho = (h + pads[0] + pads[2] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    wo = (w + pads[1] + pads[3] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    return ho, wo


def layer_cost(layer, in_shapes, out_shape):
    """(MACs, parameter count) of a layer -- used by ``inspect`` and the scheduler."""
    op = layer.op
    nparams = int(sum(np.asarray(p).size for p in layer.params.values()))
    if op == "conv":
        w = layer.params["weight"]
        macs = int(np.prod(out_shape)) * int(np.prod(w.shape[1:]))
    elif op == "gemm":
        macs = int(np.prod(out_shape)) * layer.params["weight"].shape[1]
    elif op in ("maxpool", "avgpool"):
        macs = int(np.prod(out_shape)) * int(np.prod(layer.attrs["kernel"]))
    elif op == "add":
        macs = int(np.prod(out_shape)) * (len(in_shapes) - 1)
    elif op == "float" and layer.attrs["op_type"] == "MatMul":
        macs = int(np.prod(out_shape)) * in_shapes[0][-1]
    else:
        macs = 0
    return macs, nparams


# ====================================================================== kernels
def to_cl(x):
    """Logical [N, C, *spatial] -> channel-last [N, H, W, C] (rank 3 gets H = 1)."""
    if x.ndim == 3:
        return x.transpose(0, 2, 1)[:, None]
    return x.transpose(0, 2, 3, 1)


def from_cl(y, rank):
    """Inverse of :func:`to_cl` for a tensor of logical rank ``rank``."""
    if rank == 3:
        return y[:, 0].transpose(0, 2, 1)
    return y.transpose(0, 3, 1, 2)


def pad_nhwc(x, pads, value):
    t, l, b, r = pads
    if not (t or l or b or r):
        return x
    return np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=value)


def windows_nhwc(xp, kh, kw, stride, dilation, ho, wo):
    """View [N, Ho, Wo, kh, kw, C] of the windows of an already padded NHWC tensor."""
    sh, sw = stride
    dh, dw = dilation
    n, _, _, c = xp.shape
    s = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, shape=(n, ho, wo, kh, kw, c),
        strides=(s[0], s[1] * sh, s[2] * sw, s[1] * dh, s[2] * dw, s[3]), writeable=False)


def conv_nhwc(xp, w, stride, dilation, groups, ho, wo, matmul):
    """Convolution core on a padded NHWC tensor; returns [N, Ho, Wo, Cout] accumulators.

    ``w`` is [Cout, Cin/g, kh, kw] in the compute dtype. ``matmul(a [M, K], b [K, N])``
    does the products (float32 BLAS for float, an exact integer GEMM for int8).
    The im2col K ordering is (kh, kw, Cin): contiguous channel runs are copied.
    Depthwise-style layers (Cin/g == 1) use shifted multiply-accumulate instead.
    """
    cout, cig, kh, kw = w.shape
    n, _, _, cin = xp.shape
    cog = cout // groups
    if cig == 1 and groups == cin:  # depthwise (with channel multiplier cog)
        if cog > 1:
            xp = np.repeat(xp, cog, axis=3)
        win = windows_nhwc(xp, kh, kw, stride, dilation, ho, wo)
        wt = w[:, 0].transpose(1, 2, 0)  # [kh, kw, Cout]
        acc = None
        for i in range(kh):
            for j in range(kw):
                term = win[:, :, :, i, j, :] * wt[i, j]
                acc = term if acc is None else np.add(acc, term, out=acc)
        return acc
    win = windows_nhwc(xp, kh, kw, stride, dilation, ho, wo)
    m = n * ho * wo
    if groups == 1:
        cols = np.ascontiguousarray(win).reshape(m, kh * kw * cin)
        wm = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * cin, cout))
        return matmul(cols, wm).reshape(n, ho, wo, cout)
    out = []
    for g in range(groups):
        cols = np.ascontiguousarray(win[..., g * cig:(g + 1) * cig]).reshape(m, kh * kw * cig)
        wg = np.ascontiguousarray(
            w[g * cog:(g + 1) * cog].transpose(2, 3, 1, 0).reshape(kh * kw * cig, cog))
        out.append(matmul(cols, wg))
    return np.concatenate(out, axis=1).reshape(n, ho, wo, cout)


def pool_windows(x_cl, layer_attrs, pad_value):
    """Padded window view [N, Ho, Wo, kh, kw, C] for pooling a channel-last tensor."""
    kh, kw = layer_attrs["kernel"]
    t, l, b, r = layer_attrs["pads"]
    eb, er = layer_attrs.get("extra", (0, 0))
    xp = pad_nhwc(x_cl, (t, l, b + eb, r + er), pad_value)
    ho = (xp.shape[1] - (kh - 1) * layer_attrs["dilation"][0] - 1) // layer_attrs["stride"][0] + 1
    wo = (xp.shape[2] - (kw - 1) * layer_attrs["dilation"][1] - 1) // layer_attrs["stride"][1] + 1
    return windows_nhwc(xp, kh, kw, layer_attrs["stride"], layer_attrs["dilation"], ho, wo)


def pool_counts(h, w, attrs):
    """Divisor of every average-pool output position, [Ho, Wo] int (ONNX semantics)."""
    kh, kw = attrs["kernel"]
    t, l, b, r = attrs["pads"]
    if attrs.get("count_include_pad"):
        mask = np.zeros((1, h + t + b, w + l + r, 1), np.float32)
        mask[:] = 1.0
        inner = {**attrs, "pads": (0, 0, 0, 0)}
    else:
        mask = np.ones((1, h, w, 1), np.float32)
        inner = attrs
    win = pool_windows(mask, inner, 0.0)
    return np.rint(win.sum(axis=(3, 4))[0, :, :, 0]).astype(np.int64)


def _f32_matmul(a, b):
    return a @ b


def conv_float(x, layer):
    a = layer.attrs
    w = layer.params["weight"]
    xc = to_cl(x)
    kh, kw = w.shape[2:]
    ho, wo = conv_out_hw(xc.shape[1], xc.shape[2], kh, kw, a["stride"], a["pads"], a["dilation"])
    xp = pad_nhwc(xc, a["pads"], 0.0)
    y = conv_nhwc(xp, w, a["stride"], a["dilation"], a["groups"], ho, wo, _f32_matmul)
    y = y + layer.params["bias"]
    return from_cl(apply_act(y, a.get("act")).astype(np.float32, copy=False), x.ndim)


def apply_act(y, act):
    if act:
        y = np.clip(y, act[1], act[2])
    return y


def run_float_layer(layer, xs):
    """Execute one IR layer in float32; returns the list of outputs."""
    op, a = layer.op, layer.attrs
    if op == "conv":
        return [conv_float(xs[0], layer)]
    if op == "gemm":
        y = xs[0] @ layer.params["weight"].T + layer.params["bias"]
        return [apply_act(y, a.get("act")).astype(np.float32, copy=False)]
    if op == "maxpool":
        x = xs[0]
        win = pool_windows(to_cl(x), a, -np.inf)
        return [from_cl(np.ascontiguousarray(win.max(axis=(3, 4))), x.ndim)]
    if op == "avgpool":
        x = xs[0]
        xc = to_cl(x)
        win = pool_windows(xc, a, 0.0)
        cnt = pool_counts(xc.shape[1], xc.shape[2], a)
        y = win.sum(axis=(3, 4), dtype=np.float32) / cnt[None, :, :, None].astype(np.float32)
        return [from_cl(np.ascontiguousarray(apply_act(y, a.get("act"))), x.ndim)]
    if op == "add":
        y = xs[0]
        for x in xs[1:]:
            y = y + x
        return [apply_act(y, a.get("act"))]
    if op == "concat":
        return [np.concatenate(xs, axis=a["axis"])]
    if op == "clip":
        return [np.clip(xs[0], a["lo"], a["hi"])]
    if op == "reshape":
        return [xs[0].reshape(a["shape"])]
    if op == "transpose":
        return [np.ascontiguousarray(xs[0].transpose(a["perm"]))]
    if op == "qdq":
        s, z = a["scale"], a["zero_point"]
        q = np.clip(np.rint(xs[0] / np.float32(s)) + z, -128, 127)
        return [((q - z) * np.float32(s)).astype(np.float32)]
    if op == "float":
        return run_float_op(layer, xs)
    raise UnsupportedOpError(f"layer {layer.name!r}: unknown IR op {op!r}; this is a dnnfab bug, "
                             "please report it")


# ---------------------------------------------------------------- CPU float ops
def _softmax(x, axis, opset, log=False):
    if opset < 13:  # coerce to 2-D at axis
        shp = x.shape
        axis = axis % x.ndim
        x2 = x.reshape(int(np.prod(shp[:axis], dtype=np.int64)), -1)
        return _softmax(x2, 1, 13, log).reshape(shp)
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    if log:
        return (x - m - np.log(s)).astype(np.float32)
    return (e / s).astype(np.float32)


def _lrn(x, size, alpha, beta, bias):
    sq = x * x
    c = x.shape[1]
    lo, hi = (size - 1) // 2, int(math.ceil((size - 1) / 2))
    pad = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    cs = np.cumsum(pad, axis=1, dtype=np.float64)
    cs = np.concatenate([np.zeros_like(cs[:, :1]), cs], axis=1)
    win = cs[:, size:size + c] - cs[:, :c]
    return (x / (bias + alpha / size * win) ** beta).astype(np.float32)


def _erf(x):
    from scipy.special import erf
    return erf(x).astype(np.float32)


def _reduce(fn):
    def run(x, axes, keepdims):
        axes = tuple(range(x.ndim)) if axes is None else tuple(int(a) % x.ndim for a in axes)
        return fn(x, axis=axes, keepdims=bool(keepdims)).astype(np.float32)
    return run


#: Element-wise unary float ops: name -> fn(x, attrs). Quantized as 256-entry lookup
#: tables (exact float evaluation of every int8 code), see :mod:`dnnfab.sw.quant.ptq`.
UNARY_OPS = {
    "Sigmoid": lambda x, a: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": lambda x, a: np.tanh(x),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, x * np.float32(a.get("alpha", 0.01))),
    "Elu": lambda x, a: np.where(x >= 0, x, np.float32(a.get("alpha", 1.0)) * (np.exp(x) - 1)),
    "Selu": lambda x, a: np.float32(a.get("gamma", 1.05070102214813232421875)) * np.where(
        x > 0, x, np.float32(a.get("alpha", 1.67326319217681884765625)) * (np.exp(x) - 1)),
    "HardSigmoid": lambda x, a: np.clip(np.float32(a.get("alpha", 0.2)) * x
                                        + np.float32(a.get("beta", 0.5)), 0, 1),
    "HardSwish": lambda x, a: x * np.clip(x / np.float32(6) + np.float32(0.5), 0, 1),
    "Softplus": lambda x, a: np.log1p(np.exp(x)),
    "Softsign": lambda x, a: x / (1 + np.abs(x)),
    "Exp": lambda x, a: np.exp(x),
    "Log": lambda x, a: np.log(x),
    "Sqrt": lambda x, a: np.sqrt(x),
    "Abs": lambda x, a: np.abs(x),
    "Neg": lambda x, a: -x,
    "Reciprocal": lambda x, a: 1 / x,
    "Erf": lambda x, a: _erf(x),
    "Floor": lambda x, a: np.floor(x),
    "Ceil": lambda x, a: np.ceil(x),
    "Sin": lambda x, a: np.sin(x),
    "Cos": lambda x, a: np.cos(x),
    "Relu": lambda x, a: np.maximum(x, 0),
    "Mish": lambda x, a: x * np.tanh(np.log1p(np.exp(x))),
}

#: Binary element-wise float ops with numpy broadcasting.
BINARY_OPS = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
    "Pow": np.power, "Max": np.maximum, "Min": np.minimum,
}

#: Every ONNX op type the CPU float fallback implements (besides the canonical IR ops).
FLOAT_OPS = (set(UNARY_OPS) | set(BINARY_OPS)
             | {"Softmax", "LogSoftmax", "LRN", "MatMul", "ReduceMean", "ReduceSum",
                "ReduceMax", "ReduceMin", "PRelu", "Pad", "Slice", "Sum", "Mean", "Concat"})


def float_op_inputs(layer, xs):
    """Merge the non-constant inputs ``xs`` with constant inputs kept in params."""
    n = layer.attrs["n_inputs"]
    it = iter(xs)
    return [layer.params[f"in{i}"] if f"in{i}" in layer.params else next(it) for i in range(n)]


def run_float_op(layer, xs):
    t = layer.attrs["op_type"]
    a = layer.attrs["onnx_attrs"]
    args = float_op_inputs(layer, xs)
    opset = layer.attrs.get("opset", 13)
    x = args[0]
    if t in UNARY_OPS:
        y = UNARY_OPS[t](x, a)
    elif t in BINARY_OPS:
        y = BINARY_OPS[t](args[0], args[1])
    elif t in ("Sum", "Mean"):
        y = args[0]
        for v in args[1:]:
            y = y + v
        if t == "Mean":
            y = y / np.float32(len(args))
    elif t in ("Softmax", "LogSoftmax"):
        y = _softmax(x, a.get("axis", 1 if opset < 13 else -1), opset, t == "LogSoftmax")
    elif t == "LRN":
        y = _lrn(x, a["size"], a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0))
    elif t == "MatMul":
        y = np.matmul(args[0], args[1])
    elif t.startswith("Reduce"):
        axes = a.get("axes")
        if axes is None and len(args) > 1 and args[1] is not None and np.size(args[1]):
            axes = list(np.asarray(args[1]).ravel())
        fn = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max,
              "ReduceMin": np.min}[t]
        y = _reduce(fn)(x, axes, a.get("keepdims", 1))
    elif t == "PRelu":
        y = np.where(x >= 0, x, x * args[1])
    elif t == "Pad":
        pads = a.get("pads")
        if pads is None:
            pads = [int(v) for v in np.asarray(args[1]).ravel()]
        value = a.get("value", 0.0)
        if len(args) > 2 and args[2] is not None and np.size(args[2]):
            value = float(np.asarray(args[2]).ravel()[0])
        r = x.ndim
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        width = [(int(pads[i]), int(pads[i + r])) for i in range(r)]
        if mode == "constant":
            y = np.pad(x, width, constant_values=value)
        else:
            y = np.pad(x, width, mode={"reflect": "reflect", "edge": "edge"}[mode])
    elif t == "Slice":
        y = x[tuple(layer.attrs["slices"])]
    elif t == "Concat":
        y = np.concatenate(args, axis=a["axis"])
    else:
        raise UnsupportedOpError(f"node {layer.name!r}: op {t} has no CPU implementation; "
                                 "replace it in the model")
    return [np.ascontiguousarray(np.asarray(y, dtype=np.float32))]

"""Export a :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph` as a QDQ ONNX model.

Every activation tensor ``t`` appears as ``t__q`` (int8, the codes) =
``QuantizeLinear(producer output)`` followed by ``t`` = ``DequantizeLinear(t__q)``, so
float outputs keep their ONNX names and onnxruntime can fuse the usual
``DQ -> op -> Q`` patterns into its integer kernels. Weights are int8 initializers with
per-output-channel ``DequantizeLinear`` (axis 0), biases int32 at scale ``s_x * s_w``.
Fused activations are exported as ``Relu`` (lo == z_y) or ``Clip`` with the float values
of the integer bounds. Ops outside the contract are re-emitted as their ONNX op between
DQ and Q. Opset 13 (per-axis DequantizeLinear).

The scales are those of the quantizer, which chose them so that onnxruntime's float
requantization reproduces the reference's fixed-point multipliers; the agreement test
(tests/sw/test_quantize.py) compares the int8 codes (``int8_outputs=True`` adds
``<output>__q`` graph outputs) with an ``ORT_ENABLE_BASIC`` session, which runs the model
as written (the format's semantics). onnxruntime's default session fuses the patterns into
int8 kernels that, on x86 CPUs without VNNI, sum uint8 x int8 product pairs in saturating
int16 and may then differ by many LSB, unless the graph was quantized with
``reduce_range=True`` (7-bit weights: no pair can saturate); docs/frontend.md section 4.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...errors import ModelError

OPSET = 13


class _Builder:
    def __init__(self, qg):
        self.qg = qg
        self.nodes = []
        self.inits = []
        self.input_names = {t.name for t in qg.inputs}
        self._done_params = set()

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op, ins, outs, name=None, **attrs):
        self.nodes.append(helper.make_node(op, ins, outs, name=name or outs[0], **attrs))
        return outs[0]

    def qparams(self, t):
        if t not in self._done_params:
            p = self.qg.qtensors[t]
            self.init(f"{t}__s", np.array(p.scale, np.float32))
            self.init(f"{t}__z", np.array(p.zero_point, np.int8))
            self._done_params.add(t)
        return f"{t}__s", f"{t}__z"

    def fname(self, t):
        """Name of the dequantized float version of tensor t."""
        return f"{t}__dq" if t in self.input_names else t

    def quantize_out(self, pre, t):
        """pre (float) -> t__q (int8) -> t (float)."""
        s, z = self.qparams(t)
        self.node("QuantizeLinear", [pre, s, z], [f"{t}__q"])
        self.node("DequantizeLinear", [f"{t}__q", s, z], [self.fname(t)])

    def act(self, pre, L, t):
        lo, hi = L.lo, L.hi
        p = self.qg.qtensors[t]
        if lo == -128 and hi == 127:
            return pre
        if lo == max(-128, p.zero_point) and hi == 127:
            return self.node("Relu", [pre], [f"{t}__act"])
        a = self.init(f"{t}__lo", np.array((lo - p.zero_point) * float(p.scale), np.float32))
        b = self.init(f"{t}__hi", np.array((hi - p.zero_point) * float(p.scale), np.float32))
        return self.node("Clip", [pre, a, b], [f"{t}__act"])


def export_qdq(qg, path=None, int8_outputs=False):
    """Build (and optionally save to ``path``) the QDQ ONNX model of ``qg``."""
    b = _Builder(qg)
    for t in qg.inputs:
        b.quantize_out(t.name, t.name)
    for L in qg.layers:
        handler = globals().get(f"_x_{L.op}")
        if handler is None:
            raise ModelError(f"layer {L.name!r}: cannot export op {L.op!r} to ONNX")
        handler(b, L)
    inputs = [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape))
              for t in qg.inputs]
    outputs = [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape))
               for t in qg.outputs]
    # graph outputs that are graph inputs are not meaningful; Identity the DQ'd ones
    if int8_outputs:
        outputs += [helper.make_tensor_value_info(f"{t.name}__q", TensorProto.INT8,
                                                  list(t.shape)) for t in qg.outputs]
    graph = helper.make_graph(b.nodes, f"{qg.name}_qdq", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="dnnfab")
    model.ir_version = 8
    if path is not None:
        onnx.save(model, str(path))
    return model


def _dq_weight(b, L, w, scale, axis):
    wn = b.init(f"{L.name}__w", w.astype(np.int8))
    sn = b.init(f"{L.name}__ws", np.asarray(scale, np.float32))
    zn = b.init(f"{L.name}__wz", np.zeros(np.shape(scale), np.int8))
    return b.node("DequantizeLinear", [wn, sn, zn], [f"{L.name}__wf"], axis=axis)


def _dq_bias(b, L):
    bscale = (np.float32(L.sx) * L.sw.astype(np.float32)).astype(np.float32)
    bn = b.init(f"{L.name}__b", L.bias_q.astype(np.int32))
    sn = b.init(f"{L.name}__bs", bscale)
    zn = b.init(f"{L.name}__bz", np.zeros(bscale.shape, np.int32))
    return b.node("DequantizeLinear", [bn, sn, zn], [f"{L.name}__bf"], axis=0)


def _x_conv(b, L):
    w = L.qweight
    if L.rank == 1:
        w = w[:, :, 0, :]
        attrs = dict(strides=[L.stride[1]], pads=[L.pad[1], L.pad[3]],
                     dilations=[L.dilation[1]], kernel_shape=[w.shape[2]])
    else:
        attrs = dict(strides=list(L.stride), pads=[L.pad[0], L.pad[1], L.pad[2], L.pad[3]],
                     dilations=list(L.dilation), kernel_shape=list(w.shape[2:]))
    wf = _dq_weight(b, L, w, L.sw, 0)
    bf = _dq_bias(b, L)
    y = b.node("Conv", [b.fname(L.input), wf, bf], [f"{L.output}__acc"], name=L.name,
               group=L.groups, **attrs)
    b.quantize_out(b.act(y, L, L.output), L.output)


def _x_gemm(b, L):
    shp = b.qg.shape(L.input)
    bf = _dq_bias(b, L)
    if len(shp) == 2:
        wf = _dq_weight(b, L, L.qweight, L.sw, 0)
        y = b.node("Gemm", [b.fname(L.input), wf, bf], [f"{L.output}__acc"], name=L.name,
                   transB=1)
    else:
        wf = _dq_weight(b, L, L.qweight.T, L.sw, 1)
        mm = b.node("MatMul", [b.fname(L.input), wf], [f"{L.output}__mm"], name=L.name)
        y = b.node("Add", [mm, bf], [f"{L.output}__acc"])
    b.quantize_out(b.act(y, L, L.output), L.output)


def _pool_attrs(L, rank):
    extra = any(L.extra)
    if rank == 1:
        a = dict(kernel_shape=[L.kernel[1]], strides=[L.stride[1]], pads=[L.pad[1], L.pad[3]])
        if L.dilation != (1, 1):
            a["dilations"] = [L.dilation[1]]
    else:
        a = dict(kernel_shape=list(L.kernel), strides=list(L.stride), pads=list(L.pad))
        if L.dilation != (1, 1):
            a["dilations"] = list(L.dilation)
    if extra:
        a["ceil_mode"] = 1
    return a


def _x_maxpool(b, L):
    rank = len(b.qg.shape(L.input)) - 2
    y = b.node("MaxPool", [b.fname(L.input)], [f"{L.output}__f"], name=L.name,
               **_pool_attrs(L, rank))
    b.quantize_out(y, L.output)


def _x_avgpool(b, L):
    rank = len(b.qg.shape(L.input)) - 2
    if L.is_global:
        y = b.node("GlobalAveragePool", [b.fname(L.input)], [f"{L.output}__f"], name=L.name)
    else:
        y = b.node("AveragePool", [b.fname(L.input)], [f"{L.output}__f"], name=L.name,
                   count_include_pad=L.count_include_pad, **_pool_attrs(L, rank))
    b.quantize_out(b.act(y, L, L.output), L.output)


def _x_add(b, L):
    ins = [b.fname(t) for t in L.inputs]
    y = b.node("Add" if len(ins) == 2 else "Sum", ins, [f"{L.output}__f"], name=L.name)
    b.quantize_out(b.act(y, L, L.output), L.output)


def _x_concat(b, L):
    y = b.node("Concat", [b.fname(t) for t in L.inputs], [f"{L.output}__f"], name=L.name,
               axis=L.axis)
    b.quantize_out(y, L.output)


def _x_rescale(b, L):
    b.quantize_out(b.fname(L.inputs[0]), L.output)


def _x_clip(b, L):
    p = b.qg.qtensors[L.output]
    x = b.fname(L.input)
    if L.lo == max(-128, p.zero_point) and L.hi == 127:
        y = b.node("Relu", [x], [f"{L.output}__f"], name=L.name)
    else:
        lo = b.init(f"{L.output}__lo", np.array((L.lo - p.zero_point) * float(p.scale), np.float32))
        hi = b.init(f"{L.output}__hi", np.array((L.hi - p.zero_point) * float(p.scale), np.float32))
        y = b.node("Clip", [x, lo, hi], [f"{L.output}__f"], name=L.name)
    b.quantize_out(y, L.output)


def _x_reshape(b, L):
    s = b.init(f"{L.output}__shape", np.array(L.attr, np.int64))
    y = b.node("Reshape", [b.fname(L.input), s], [f"{L.output}__f"], name=L.name)
    b.quantize_out(y, L.output)


def _x_transpose(b, L):
    y = b.node("Transpose", [b.fname(L.input)], [f"{L.output}__f"], name=L.name,
               perm=list(L.attr))
    b.quantize_out(y, L.output)


def _x_lut(b, L):
    layer = b.qg.float_graph and next((l for l in b.qg.float_graph.layers if l.name == L.name),
                                      None)
    if layer is None:
        raise ModelError(f"layer {L.name!r}: lookup table has no float op to export")
    _emit_float(b, layer, [L.input], L.output)


def _x_float(b, L):
    _emit_float(b, L.layer, L.inputs, L.output)


def _emit_float(b, layer, inputs, out):
    a = layer.attrs
    t = a["op_type"]
    attrs = {k: v for k, v in a["onnx_attrs"].items()}
    ins, it = [], iter(inputs)
    for i in range(a["n_inputs"]):
        key = f"in{i}"
        if key in layer.params:
            v = layer.params[key]
            ins.append("" if v is None else b.init(f"{layer.name}__c{i}", np.asarray(v)))
        else:
            ins.append(b.fname(next(it)))
    pre = f"{out}__f"
    shp_in = b.qg.shape(inputs[0]) if inputs else None
    if t in ("Softmax", "LogSoftmax"):
        opset = a.get("opset", 13)
        axis = attrs.get("axis", 1 if opset < 13 else -1) % len(shp_in)
        if opset < 13 and axis != len(shp_in) - 1:
            flat = b.init(f"{layer.name}__2d", np.array(
                [int(np.prod(shp_in[:axis])), int(np.prod(shp_in[axis:]))], np.int64))
            back = b.init(f"{layer.name}__nd", np.array(shp_in, np.int64))
            r = b.node("Reshape", [ins[0], flat], [f"{out}__r2"])
            s = b.node(t, [r], [f"{out}__sm"], name=layer.name, axis=1)
            b.node("Reshape", [s, back], [pre])
        else:
            b.node(t, ins[:1], [pre], name=layer.name, axis=axis)
    elif t == "Slice":
        starts, ends, axes, steps = [], [], [], []
        for ax, sl in enumerate(a["slices"]):
            if sl == slice(None):
                continue
            axes.append(ax)
            starts.append(0 if sl.start is None else sl.start)
            ends.append(2**62 if sl.stop is None else sl.stop)
            steps.append(1 if sl.step is None else sl.step)
        cs = [b.init(f"{layer.name}__{k}", np.array(v, np.int64))
              for k, v in (("st", starts), ("en", ends), ("ax", axes), ("sp", steps))]
        b.node("Slice", [b.fname(inputs[0])] + cs, [pre], name=layer.name)
    elif t == "Pad" and "pads" in attrs:
        pads = b.init(f"{layer.name}__pads", np.array(attrs.pop("pads"), np.int64))
        value = attrs.pop("value", 0.0)
        cv = b.init(f"{layer.name}__pv", np.array(value, np.float32))
        b.node("Pad", [ins[0], pads, cv], [pre], name=layer.name, **attrs)
    elif t == "ReduceSum" and "axes" in attrs:
        ax = b.init(f"{layer.name}__axes", np.array(attrs.pop("axes"), np.int64))
        b.node(t, [ins[0], ax], [pre], name=layer.name, **attrs)
    elif t in ("ReduceMean", "ReduceMax", "ReduceMin") and len(ins) > 1:
        axes = [int(v) for v in np.asarray(layer.params.get("in1", [])).ravel()]
        if axes:
            attrs["axes"] = axes
        b.node(t, ins[:1], [pre], name=layer.name, **attrs)
    else:
        b.node(t, ins, [pre], name=layer.name, **attrs)
    b.quantize_out(pre, out)

"""ONNX front end: read a model, fold constants, infer static shapes, build the IR.

Entry points: :func:`read_model` (path / bytes / ``ModelProto`` / zoo name -> checked
``ModelProto``) and :func:`import_onnx` (``ModelProto`` -> :class:`~dnnfab.sw.ir.graph.Graph`).

How a model is imported
-----------------------
1. **Inputs.** The real data inputs are the graph inputs that are *not* initializers (old
   exporters list every weight among the inputs, e.g. the ONNX "light" zoo whose data input
   is ``data_0``). Dynamic dimensions: axis 0 becomes ``batch`` (default 1); any other
   dynamic dimension needs ``input_shapes={name: shape}``.
2. **Constant folding.** A node whose inputs are all constant is evaluated at import time
   (numpy for the common ops, ``onnx.reference`` for the rest). This turns the
   ``ConstantOfShape`` weights of the light zoo, ``DequantizeLinear`` of int8 weights,
   ``Shape -> Gather -> Concat -> Reshape`` chains of Keras/tf2onnx exports and transposed
   weights into plain arrays. ``Shape`` of an activation folds too: all shapes are static.
3. **Lowering** each remaining node to the canonical IR ops (:mod:`dnnfab.sw.ir.graph`):
   Conv/Gemm/MatMul with constant weights, pools, Add/Sum, Concat, ReLU/Clip, layout ops
   (Flatten/Reshape/Squeeze/Unsqueeze -> ``reshape``; Transpose), ``Identity``/``Dropout``
   removed. BatchNormalization and Mul/Add/Sub/Div by a per-channel (or scalar) constant
   become a per-channel *affine* ``y = a[c] * x + b[c]``. A QuantizeLinear/DequantizeLinear
   pair on an activation becomes a ``qdq`` layer carrying the model's own scale and zero
   point (uint8 is mapped to int8 by subtracting 128 from the codes and the zero point).
   Other ops with a numpy implementation (:data:`dnnfab.sw.ir.graph.FLOAT_OPS`) become ``float``
   layers run on the CPU; anything else raises :class:`UnsupportedOpError` naming the node.
4. **Passes.** (a) chains of affines merge; (b) an affine right after a conv/gemm whose
   output has no other reader folds into its weights and bias (this is the BN fold, and the
   ``MatMul + Add`` bias); (c) remaining affines become a depthwise 1x1 ``conv`` (rank 3/4)
   or a diagonal ``gemm`` (rank 2), so they still run on the fabric; (d) ReLU/Clip after a
   conv/gemm/add/avgpool with no other reader fuses into its ``act``; (e) dead layers go.

Channel-last Keras exports (a Transpose after the input, another before Flatten) import
as-is: Transpose is an ordinary IR layer and the integer reference handles layout changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import ModelError, UnsupportedOpError
from ..ir.graph import (BINARY_OPS, FLOAT_OPS, INF, UNARY_OPS, Graph, Layer, TensorInfo,
                 auto_pads, conv_out_hw, pool_out_size, run_float_layer)

#: Ops removed on import.
_PASSTHROUGH = {"Identity", "Dropout"}


# ====================================================================== reading
def read_model(src):
    """Return a checked ``onnx.ModelProto`` from a path, bytes, a ModelProto or a zoo name."""
    if isinstance(src, onnx.ModelProto):
        model = src
        origin = "ModelProto"
    elif isinstance(src, (bytes, bytearray)):
        model = _parse(bytes(src), "bytes")
        origin = "bytes"
    elif isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if path.is_file():
            model = _parse(path.read_bytes(), str(path))
            if model.graph is not None:
                _load_external(model, path)
            origin = str(path)
        else:
            model = _from_zoo(str(src))
            origin = f"zoo:{src}"
    else:
        raise ModelError(f"cannot load a {type(src).__name__}; pass a path to an .onnx file, "
                         "bytes, an onnx.ModelProto or a zoo model name")
    _check_model(model, origin)
    return model


def _parse(data, origin):
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError and friends
        raise ModelError(f"{origin}: not a readable ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'parse error'}); "
                         "re-export it or check the file is complete") from None
    return model


def _load_external(model, path):
    try:
        from onnx.external_data_helper import load_external_data_for_model, uses_external_data
        if any(uses_external_data(t) for t in model.graph.initializer):
            load_external_data_for_model(model, str(path.parent))
    except Exception as exc:
        raise ModelError(f"{path}: cannot load its external weight data ({exc}); keep the "
                         "data files next to the model") from None


def _from_zoo(name):
    try:
        from ... import models
    except ImportError:
        models = None
    loader = getattr(models, "load_model", None) if models else None
    if loader is None:
        raise ModelError(f"{name!r}: no such file; pass the path of an .onnx model")
    try:
        return loader(name)
    except (KeyError, LookupError, FileNotFoundError):
        known = ""
        lister = getattr(models, "list_models", None)
        if lister:
            try:
                known = "; zoo models: " + ", ".join(m["name"] for m in lister())
            except Exception:
                known = ""
        raise ModelError(f"{name!r}: no such file or zoo model; pass an .onnx path or a zoo "
                         f"name (see `dnnfab models`){known}") from None


def _check_model(model, origin):
    g = model.graph
    if model.ir_version <= 0 or not g.node or not g.output:
        raise ModelError(f"{origin}: not an ONNX model (no graph nodes or outputs); pass a "
                         "valid .onnx file")


# ====================================================================== import
def import_onnx(model, batch=1, input_shapes=None, name=None):
    """Convert a ``ModelProto`` into a float :class:`~dnnfab.sw.ir.graph.Graph` (see module doc)."""
    imp = _Importer(model, batch, input_shapes or {})
    graph = imp.build(name or model.graph.name or "model")
    _passes(graph)
    return graph


def _opset(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 13


def _attrs(node):
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


class _Importer:
    def __init__(self, model, batch, input_shapes):
        self.model = model
        self.opset = _opset(model)
        self.batch = int(batch)
        self.input_shapes = {k: tuple(v) for k, v in input_shapes.items()}
        self.const = {}
        self.qinfo = {}     # const name -> (int codes, scale, zero_point, axis) of DQ'd consts
        self.shapes = {}    # activation name -> static shape
        self.alias = {}     # removed tensor -> its source
        self.pending_q = {}  # Q output -> (x, scale, zero_point int8 domain)
        self.layers = []
        self._names = set()

    # ---------------------------------------------------------------- helpers
    def src(self, t):
        while t in self.alias:
            t = self.alias[t]
        return t

    def is_const(self, t):
        return t == "" or self.src(t) in self.const

    def cval(self, t):
        return None if t == "" else self.const[self.src(t)]

    def node_name(self, node, i):
        n = node.name or f"{node.op_type}_{i}"
        while n in self._names:
            n += "_"
        self._names.add(n)
        return n

    def add(self, name, op, inputs, output, shape, attrs=None, params=None):
        layer = Layer(name, op, [self.src(t) for t in inputs], [output], attrs or {},
                      params or {})
        self.layers.append(layer)
        self.shapes[output] = tuple(int(d) for d in shape)
        return layer

    # ---------------------------------------------------------------- driver
    def build(self, gname):
        g = self.model.graph
        for init in g.initializer:
            try:
                self.const[init.name] = numpy_helper.to_array(init)
            except Exception as exc:
                raise ModelError(f"initializer {init.name!r} cannot be read ({exc}); "
                                 "re-export the model") from None
        inputs = []
        for vi in g.input:
            if vi.name in self.const:
                continue
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise ModelError(f"input {vi.name!r} is not a tensor; only tensor inputs are "
                                 "supported")
            if tt.elem_type != onnx.TensorProto.FLOAT:
                raise ModelError(f"input {vi.name!r} has element type "
                                 f"{onnx.TensorProto.DataType.Name(tt.elem_type)}; dnnfab needs "
                                 "float32 inputs (add a Cast in the exporter)")
            if vi.name in self.input_shapes:
                shape = self.input_shapes[vi.name]
            else:
                shape = []
                for ax, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value") and d.dim_value > 0:
                        shape.append(d.dim_value)
                    elif ax == 0:
                        shape.append(self.batch)
                    else:
                        raise ModelError(f"input {vi.name!r} has dynamic dimension {ax} "
                                         f"({d.dim_param or '?'}); pass input_shapes="
                                         f"{{{vi.name!r}: (...)}} to dnnfab.load")
            self.shapes[vi.name] = tuple(int(d) for d in shape)
            inputs.append(TensorInfo(vi.name, shape))
        if not inputs:
            raise ModelError("the model has no non-constant input; nothing to run")

        for i, node in enumerate(g.node):
            self.lower(node, i)

        outputs = []
        for vo in g.output:
            t = vo.name
            s = self.src(t)
            if s in self.const:
                raise ModelError(f"output {t!r} is a constant; remove it from the model")
            if s != t:  # output produced through Identity/Dropout: keep the ONNX name
                self.add(f"{t}_identity", "reshape", [s], t, self.shapes[s],
                         {"shape": self.shapes[s]})
            outputs.append(TensorInfo(t, self.shapes[t]))
        tensors = {k: TensorInfo(k, v) for k, v in self.shapes.items()}
        return Graph(gname, inputs, outputs, self.layers, tensors, self.opset, source=self.model)

    # ---------------------------------------------------------------- lowering
    def lower(self, node, idx):
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedOpError(f"node {node.name or idx!r}: op {node.domain}.{op} is not "
                                     "supported; export with standard ONNX ops only")
        ins = list(node.input)
        if op in _PASSTHROUGH:
            if len(node.output) > 1 and any(node.output[1:]) and op == "Dropout":
                for extra in node.output[1:]:
                    if extra:
                        self.const[extra] = np.ones(self.shape_of(ins[0]), bool)
            if self.is_const(ins[0]):
                self.const[node.output[0]] = self.cval(ins[0])
            else:
                self.alias[node.output[0]] = self.src(ins[0])
            return
        if op == "Shape" and not self.is_const(ins[0]):
            a = _attrs(node)
            shp = np.array(self.shapes[self.src(ins[0])], np.int64)
            self.const[node.output[0]] = shp[a.get("start", 0):a.get("end", len(shp))]
            return
        if op == "Size" and not self.is_const(ins[0]):
            self.const[node.output[0]] = np.array(np.prod(self.shapes[self.src(ins[0])]),
                                                  np.int64)
            return
        if all(self.is_const(t) for t in ins):
            self.fold(node, idx)
            return
        name = self.node_name(node, idx)
        handler = getattr(self, f"op_{op}", None)
        if handler is not None:
            handler(node, name, _attrs(node))
        elif op in FLOAT_OPS:
            self.float_op(node, name, _attrs(node))
        else:
            raise UnsupportedOpError(f"node {name!r}: op {op} is not supported (no fabric "
                                     "mapping and no CPU fallback); replace it or remove it "
                                     "from the model")

    def shape_of(self, t):
        s = self.src(t)
        return self.const[s].shape if s in self.const else self.shapes[s]

    def x_in(self, node, name):
        t = node.input[0]
        if self.is_const(t):
            raise UnsupportedOpError(f"node {name!r}: {node.op_type} with a constant data "
                                     "input is not supported; fold it in the exporter")
        return self.src(t)

    # --- constant folding -------------------------------------------------
    def fold(self, node, idx):
        vals = [self.cval(t) for t in node.input]
        a = _attrs(node)
        op = node.op_type
        try:
            outs = _fold_numpy(op, vals, a, self.opset)
            if outs is None:
                outs = _fold_reference(node, vals, self.opset)
        except (UnsupportedOpError, ModelError):
            raise
        except Exception as exc:
            raise ModelError(f"node {node.name or idx!r}: cannot fold constant {op} ({exc}); "
                             "check the model with onnx.checker") from None
        for t, v in zip(node.output, outs):
            if t:
                self.const[t] = np.asarray(v)
        if op == "DequantizeLinear":
            s = np.asarray(vals[1], np.float32)
            z = np.asarray(vals[2]) if len(vals) > 2 and vals[2] is not None else 0
            self.qinfo[node.output[0]] = (vals[0], s, z, a.get("axis", 1))

    # --- shape helpers -----------------------------------------------------
    def _spatial(self, node, name, x_shape, a, kernel):
        """Normalize strides/pads/dilations to 2-D (1-D gets H = 1)."""
        r = len(x_shape) - 2
        if r not in (1, 2):
            raise UnsupportedOpError(f"node {name!r}: {node.op_type} on a rank-{len(x_shape)} "
                                     "tensor is not supported (1-D and 2-D only)")
        strides = list(a.get("strides", [1] * r))
        dil = list(a.get("dilations", [1] * r))
        pads = list(a.get("pads", [0] * (2 * r)))
        mode = a.get("auto_pad", "NOTSET")
        if mode not in ("NOTSET", ""):
            pads = [0] * (2 * r)
            for i in range(r):
                b, e = auto_pads(x_shape[2 + i], kernel[i], strides[i], dil[i], mode)
                pads[i], pads[i + r] = b, e
        if r == 1:
            return (1, strides[0]), (0, pads[0], 0, pads[1]), (1, dil[0]), (1, kernel[0])
        return (tuple(strides), (pads[0], pads[1], pads[2], pads[3]), tuple(dil),
                tuple(kernel))

    # --- canonical ops -------------------------------------------------------
    def op_Conv(self, node, name, a):
        x = self.x_in(node, name)
        if not self.is_const(node.input[1]):
            raise UnsupportedOpError(f"node {name!r}: Conv with non-constant weights is not "
                                     "supported; make the weights initializers")
        w = np.asarray(self.cval(node.input[1]), np.float32)
        xs = self.shapes[x]
        groups = int(a.get("group", 1))
        cout = w.shape[0]
        b = (np.asarray(self.cval(node.input[2]), np.float32).reshape(cout)
             if len(node.input) > 2 and node.input[2] else np.zeros(cout, np.float32))
        stride, pads, dil, k = self._spatial(node, name, xs, a, list(w.shape[2:]))
        if w.ndim == 3:
            w = w[:, :, None, :]
        if xs[1] != w.shape[1] * groups:
            raise ModelError(f"node {name!r}: Conv input has {xs[1]} channels but weights "
                             f"expect {w.shape[1] * groups}; fix the model")
        h, wd = (1, xs[2]) if len(xs) == 3 else xs[2:]
        ho, wo = conv_out_hw(h, wd, k[0], k[1], stride, pads, dil)
        if ho <= 0 or wo <= 0:
            raise ModelError(f"node {name!r}: Conv output would be empty; check the input size")
        shape = (xs[0], cout, wo) if len(xs) == 3 else (xs[0], cout, ho, wo)
        attrs = dict(stride=stride, pads=pads, dilation=dil, groups=groups, act=None,
                     rank=len(xs) - 2)
        wq = self.qinfo.get(self.src(node.input[1]))
        if wq is not None:
            attrs["weight_qinfo"] = wq
        self.add(name, "conv", [x], node.output[0], shape, attrs,
                 {"weight": np.ascontiguousarray(w), "bias": b})

    def op_Gemm(self, node, name, a):
        x = self.x_in(node, name)
        if not self.is_const(node.input[1]) or a.get("transA", 0):
            return self.float_matmul_fallback(node, name, a)
        bm = np.asarray(self.cval(node.input[1]), np.float32)
        w = bm if a.get("transB", 0) else bm.T
        w = w * np.float32(a.get("alpha", 1.0))
        n = w.shape[0]
        bias = np.zeros(n, np.float32)
        if len(node.input) > 2 and node.input[2]:
            if not self.is_const(node.input[2]):
                raise UnsupportedOpError(f"node {name!r}: Gemm with a non-constant C input is "
                                         "not supported")
            c = np.asarray(self.cval(node.input[2]), np.float32) * np.float32(a.get("beta", 1.0))
            if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
                raise UnsupportedOpError(f"node {name!r}: Gemm bias of shape {c.shape} is not "
                                         "per-output; use a [N] bias")
            bias = np.broadcast_to(c.reshape(-1), (n,)).astype(np.float32)
        xs = self.shapes[x]
        if len(xs) != 2 or xs[1] != w.shape[1]:
            raise ModelError(f"node {name!r}: Gemm input shape {list(xs)} does not match weights "
                             f"{list(bm.shape)}; fix the model")
        attrs = {"act": None}
        wq = self.qinfo.get(self.src(node.input[1]))
        if wq is not None and a.get("transB", 0) and a.get("alpha", 1.0) == 1.0:
            attrs["weight_qinfo"] = wq
        self.add(name, "gemm", [x], node.output[0], (xs[0], n), attrs,
                 {"weight": np.ascontiguousarray(w), "bias": bias})

    def op_MatMul(self, node, name, a):
        if self.is_const(node.input[0]) or not self.is_const(node.input[1]) \
                or np.ndim(self.cval(node.input[1])) != 2:
            return self.float_op(node, name, a)
        x = self.src(node.input[0])
        bm = np.asarray(self.cval(node.input[1]), np.float32)
        xs = self.shapes[x]
        if xs[-1] != bm.shape[0]:
            raise ModelError(f"node {name!r}: MatMul shapes {list(xs)} x {list(bm.shape)} do "
                             "not match; fix the model")
        attrs = {"act": None}
        wq = self.qinfo.get(self.src(node.input[1]))
        if wq is not None:
            q, s, z, axis = wq
            attrs["weight_qinfo"] = (np.asarray(q).T, s, z, 0 if axis in (1, -1) else 1)
        self.add(name, "gemm", [x], node.output[0], xs[:-1] + (bm.shape[1],), attrs,
                 {"weight": np.ascontiguousarray(bm.T), "bias": np.zeros(bm.shape[1], np.float32)})

    def float_matmul_fallback(self, node, name, a):
        raise UnsupportedOpError(f"node {name!r}: Gemm with transA or non-constant B is not "
                                 "supported; export a MatMul instead")

    def _pool(self, node, name, a, op):
        x = self.x_in(node, name)
        if len(node.output) > 1 and node.output[1]:
            raise UnsupportedOpError(f"node {name!r}: MaxPool Indices output is not supported")
        xs = self.shapes[x]
        kernel = list(a["kernel_shape"])
        stride, pads, dil, k = self._spatial(node, name, xs, a, kernel)
        h, wd = (1, xs[2]) if len(xs) == 3 else xs[2:]
        ceil = bool(a.get("ceil_mode", 0))
        ho, eh = pool_out_size(h, k[0], stride[0], pads[0], pads[2], dil[0], ceil)
        wo, ew = pool_out_size(wd, k[1], stride[1], pads[1], pads[3], dil[1], ceil)
        attrs = dict(kernel=k, stride=stride, pads=pads, dilation=dil, extra=(eh, ew))
        if op == "avgpool":
            attrs["count_include_pad"] = int(a.get("count_include_pad", 0))
            attrs["act"] = None
        shape = (xs[0], xs[1], wo) if len(xs) == 3 else (xs[0], xs[1], ho, wo)
        self.add(name, op, [x], node.output[0], shape, attrs)

    def op_MaxPool(self, node, name, a):
        self._pool(node, name, a, "maxpool")  # storage_order only affects Indices

    def op_AveragePool(self, node, name, a):
        self._pool(node, name, a, "avgpool")

    def _global(self, node, name, op):
        x = self.x_in(node, name)
        xs = self.shapes[x]
        if len(xs) not in (3, 4):
            raise UnsupportedOpError(f"node {name!r}: {node.op_type} on rank {len(xs)} is not "
                                     "supported")
        k = (1, xs[2]) if len(xs) == 3 else tuple(xs[2:])
        attrs = dict(kernel=k, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), extra=(0, 0))
        if op == "avgpool":
            attrs.update(count_include_pad=0, act=None, is_global=True)
        self.add(name, op, [x], node.output[0], xs[:2] + (1,) * (len(xs) - 2), attrs)

    def op_GlobalAveragePool(self, node, name, a):
        self._global(node, name, "avgpool")

    def op_GlobalMaxPool(self, node, name, a):
        self._global(node, name, "maxpool")

    def op_Relu(self, node, name, a):
        x = self.x_in(node, name)
        self.add(name, "clip", [x], node.output[0], self.shapes[x], {"lo": 0.0, "hi": INF})

    def op_Clip(self, node, name, a):
        x = self.x_in(node, name)
        lo, hi = a.get("min", -INF), a.get("max", INF)
        if len(node.input) > 1 and node.input[1]:
            if not self.is_const(node.input[1]):
                raise UnsupportedOpError(f"node {name!r}: Clip with non-constant min")
            lo = float(self.cval(node.input[1]))
        if len(node.input) > 2 and node.input[2]:
            if not self.is_const(node.input[2]):
                raise UnsupportedOpError(f"node {name!r}: Clip with non-constant max")
            hi = float(self.cval(node.input[2]))
        self.add(name, "clip", [x], node.output[0], self.shapes[x],
                 {"lo": float(lo), "hi": float(hi)})

    def op_BatchNormalization(self, node, name, a):
        x = self.x_in(node, name)
        if any(node.output[1:]):
            raise UnsupportedOpError(f"node {name!r}: BatchNormalization in training mode is "
                                     "not supported; export in eval mode")
        vals = [self.cval(t) for t in node.input[1:5]]
        if any(v is None for v in vals):
            raise UnsupportedOpError(f"node {name!r}: BatchNormalization with non-constant "
                                     "statistics is not supported")
        g, b, mean, var = (np.asarray(v, np.float64) for v in vals)
        scale = g / np.sqrt(var + a.get("epsilon", 1e-5))
        shift = b - mean * scale
        self.affine(name, x, node.output[0], scale, shift)

    def affine(self, name, x, out, scale, shift):
        xs = self.shapes[x]
        if len(xs) < 2:
            raise UnsupportedOpError(f"node {name!r}: per-channel scale on a rank-{len(xs)} "
                                     "tensor is not supported")
        c = xs[1]
        scale = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (c,)).copy()
        shift = np.broadcast_to(np.asarray(shift, np.float64).reshape(-1), (c,)).copy()
        self.add(name, "affine", [x], out, xs, {}, {"scale": scale, "shift": shift})

    def _channel_const(self, c, xs):
        """If constant ``c`` broadcast against shape ``xs`` is per-channel (axis 1) or a
        scalar and does not grow the output, return it as a flat [C] (or [1]) vector."""
        c = np.asarray(c)
        if c.ndim > len(xs):
            return None
        full = (1,) * (len(xs) - c.ndim) + c.shape
        if any(fd not in (1, xd) for fd, xd in zip(full, xs)):
            return None
        nontriv = [i for i, d in enumerate(full) if d != 1]
        if not nontriv:
            return c.reshape(1).astype(np.float64)
        if nontriv == [1] and len(xs) >= 2:
            return c.reshape(-1).astype(np.float64)
        return None

    def _binary(self, node, name, a, op):
        x0, x1 = node.input[0], node.input[1]
        c0, c1 = self.is_const(x0), self.is_const(x1)
        if not c0 and not c1:
            if op == "Add" and self.shape_of(x0) == self.shape_of(x1):
                return self.add(name, "add", [x0, x1], node.output[0], self.shape_of(x0),
                                {"act": None})
            return self.float_op(node, name, a)
        xt, ct = (x0, x1) if c1 else (x1, x0)
        xs = self.shapes[self.src(xt)]
        v = self._channel_const(self.cval(ct), xs)
        if v is None:
            return self.float_op(node, name, a)
        x = self.src(xt)
        const_first = c0
        if op == "Add":
            return self.affine(name, x, node.output[0], 1.0, v)
        if op == "Mul":
            return self.affine(name, x, node.output[0], v, 0.0)
        if op == "Sub":
            if const_first:
                return self.affine(name, x, node.output[0], -1.0, v)
            return self.affine(name, x, node.output[0], 1.0, -v)
        if op == "Div" and not const_first:
            return self.affine(name, x, node.output[0], 1.0 / v, 0.0)
        return self.float_op(node, name, a)

    def op_Add(self, node, name, a):
        self._binary(node, name, a, "Add")

    def op_Mul(self, node, name, a):
        self._binary(node, name, a, "Mul")

    def op_Sub(self, node, name, a):
        self._binary(node, name, a, "Sub")

    def op_Div(self, node, name, a):
        self._binary(node, name, a, "Div")

    def op_Sum(self, node, name, a):
        ins = list(node.input)
        if len(ins) == 1:
            self.alias[node.output[0]] = self.src(ins[0])
            return
        shapes = {self.shape_of(t) for t in ins}
        if any(self.is_const(t) for t in ins) or len(shapes) != 1:
            return self.float_op(node, name, a)
        self.add(name, "add", ins, node.output[0], shapes.pop(), {"act": None})

    def op_Concat(self, node, name, a):
        ins = [t for t in node.input if t]
        if any(self.is_const(t) for t in ins):
            return self.float_op(node, name, a)
        shapes = [self.shapes[self.src(t)] for t in ins]
        axis = a["axis"] % len(shapes[0])
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        self.add(name, "concat", ins, node.output[0], out, {"axis": axis})

    def _reshape_to(self, node, name, shape):
        x = self.x_in(node, name)
        shape = tuple(int(d) for d in shape)
        if int(np.prod(shape)) != int(np.prod(self.shapes[x])):
            raise ModelError(f"node {name!r}: cannot reshape {list(self.shapes[x])} to "
                             f"{list(shape)}; fix the model")
        self.add(name, "reshape", [x], node.output[0], shape, {"shape": shape})

    def op_Reshape(self, node, name, a):
        x = self.x_in(node, name)
        if not self.is_const(node.input[1]):
            raise UnsupportedOpError(f"node {name!r}: Reshape to a computed shape that does not "
                                     "fold to a constant")
        tgt = [int(d) for d in np.asarray(self.cval(node.input[1])).ravel()]
        xs = self.shapes[x]
        if not a.get("allowzero", 0):
            tgt = [xs[i] if d == 0 else d for i, d in enumerate(tgt)]
        if -1 in tgt:
            known = int(np.prod([d for d in tgt if d != -1]))
            tgt[tgt.index(-1)] = int(np.prod(xs)) // max(known, 1)
        self._reshape_to(node, name, tgt)

    def op_Flatten(self, node, name, a):
        xs = self.shapes[self.x_in(node, name)]
        ax = a.get("axis", 1) % (len(xs) + 1) if a.get("axis", 1) < 0 else a.get("axis", 1)
        self._reshape_to(node, name, (int(np.prod(xs[:ax])), int(np.prod(xs[ax:]))))

    def _axes(self, node, a):
        if "axes" in a:
            return [int(v) for v in a["axes"]]
        if len(node.input) > 1 and node.input[1]:
            return [int(v) for v in np.asarray(self.cval(node.input[1])).ravel()]
        return None

    def op_Squeeze(self, node, name, a):
        xs = self.shapes[self.x_in(node, name)]
        axes = self._axes(node, a)
        if axes is None:
            axes = [i for i, d in enumerate(xs) if d == 1]
        axes = {ax % len(xs) for ax in axes}
        self._reshape_to(node, name, [d for i, d in enumerate(xs) if i not in axes])

    def op_Unsqueeze(self, node, name, a):
        xs = list(self.shapes[self.x_in(node, name)])
        axes = sorted(ax % (len(xs) + len(self._axes(node, a))) for ax in self._axes(node, a))
        for ax in axes:
            xs.insert(ax, 1)
        self._reshape_to(node, name, xs)

    def op_Transpose(self, node, name, a):
        x = self.x_in(node, name)
        xs = self.shapes[x]
        perm = tuple(int(p) for p in a.get("perm", range(len(xs) - 1, -1, -1)))
        self.add(name, "transpose", [x], node.output[0], [xs[p] for p in perm], {"perm": perm})

    def op_QuantizeLinear(self, node, name, a):
        x = self.x_in(node, name)
        s = np.asarray(self.cval(node.input[1]))
        zt = node.input[2] if len(node.input) > 2 else ""
        z = np.asarray(self.cval(zt)) if zt else np.array(0, np.uint8)
        if s.size != 1 or not self.is_const(node.input[1]):
            raise UnsupportedOpError(f"node {name!r}: per-axis quantization of an activation is "
                                     "not supported; use per-tensor scales for activations")
        if z.dtype not in (np.int8, np.uint8):
            raise UnsupportedOpError(f"node {name!r}: QuantizeLinear to {z.dtype} is not "
                                     "supported; use int8 or uint8")
        z8 = int(z.ravel()[0]) - (128 if z.dtype == np.uint8 else 0)
        self.pending_q[node.output[0]] = (x, float(s.ravel()[0]), z8)

    def op_DequantizeLinear(self, node, name, a):
        t = node.input[0]
        if t not in self.pending_q:
            raise UnsupportedOpError(f"node {name!r}: DequantizeLinear of a tensor that is not "
                                     "a QuantizeLinear output; feed float inputs")
        x, s, z = self.pending_q[t]
        s2 = float(np.asarray(self.cval(node.input[1])).ravel()[0])
        zt = node.input[2] if len(node.input) > 2 else ""
        z2 = np.asarray(self.cval(zt)) if zt else np.array(0, np.uint8)
        z2 = int(z2.ravel()[0]) - (128 if z2.dtype == np.uint8 else 0)
        if not np.isclose(s, s2) or z != z2:
            raise UnsupportedOpError(f"node {name!r}: Q/DQ pair with different parameters is "
                                     "not supported")
        self.add(name, "qdq", [x], node.output[0], self.shapes[x],
                 {"scale": np.float32(s), "zero_point": z})

    def op_Slice(self, node, name, a):
        x = self.x_in(node, name)
        xs = self.shapes[x]
        if self.opset < 10:
            starts, ends = a["starts"], a["ends"]
            axes = a.get("axes", list(range(len(starts))))
            steps = [1] * len(starts)
        else:
            get = [self.cval(t) if t else None for t in list(node.input[1:]) + [""] * 4]
            if any(t and not self.is_const(t) for t in node.input[1:]):
                raise UnsupportedOpError(f"node {name!r}: Slice with computed bounds")
            starts, ends = list(get[0].ravel()), list(get[1].ravel())
            axes = list(get[2].ravel()) if get[2] is not None else list(range(len(starts)))
            steps = list(get[3].ravel()) if get[3] is not None else [1] * len(starts)
        sl = [slice(None)] * len(xs)
        for s, e, ax, st in zip(starts, ends, axes, steps):
            sl[int(ax) % len(xs)] = slice(int(max(min(s, 2**62), -2**62)),
                                          int(max(min(e, 2**62), -2**62)), int(st))
        shape = np.empty(xs, np.bool_)[tuple(sl)].shape
        self.add(name, "float", [x], node.output[0], shape,
                 {"op_type": "Slice", "onnx_attrs": {}, "n_inputs": 1, "slices": sl,
                  "opset": self.opset})

    def float_op(self, node, name, a):
        """Any FLOAT_OPS op: constants go to params, the output shape comes from a dry run."""
        op = node.op_type
        if op not in FLOAT_OPS:
            raise UnsupportedOpError(f"node {name!r}: op {op} is not supported (no fabric "
                                     "mapping and no CPU fallback); replace it in the model")
        if op in BINARY_OPS and len(node.input) != 2:
            raise UnsupportedOpError(f"node {name!r}: {op} with {len(node.input)} inputs is not "
                                     "supported; use two inputs")
        params, xs = {}, []
        for i, t in enumerate(node.input):
            if self.is_const(t):
                params[f"in{i}"] = (np.asarray(self.cval(t), np.float32) if t and
                                    np.asarray(self.cval(t)).dtype.kind == "f"
                                    else (self.cval(t) if t else None))
            else:
                xs.append(self.src(t))
        attrs = {"op_type": op, "onnx_attrs": a, "n_inputs": len(node.input),
                 "opset": self.opset}
        layer = Layer(name, "float", xs, [node.output[0]], attrs, params)
        with np.errstate(all="ignore"):
            dry = run_float_layer(layer, [np.zeros(self.shapes[t], np.float32) for t in xs])
        self.add(name, "float", xs, node.output[0], dry[0].shape, attrs, params)


def _fold_numpy(op, v, a, opset):
    """Fast numpy constant folding of common ops; None -> use onnx.reference."""
    if op == "Constant":
        if "value" in a:
            return [a["value"]]
        for k in ("value_float", "value_int"):
            if k in a:
                return [np.array(a[k], np.float32 if k == "value_float" else np.int64)]
        for k in ("value_floats", "value_ints"):
            if k in a:
                return [np.array(a[k], np.float32 if k == "value_floats" else np.int64)]
        return None
    if op == "ConstantOfShape":
        val = a.get("value", np.zeros(1, np.float32))
        return [np.full(tuple(int(d) for d in v[0]), val.ravel()[0], dtype=val.dtype)]
    if op == "Unsqueeze":
        axes = a.get("axes") if "axes" in a else [int(t) for t in v[1].ravel()]
        x = v[0]
        rank = x.ndim + len(axes)
        for ax in sorted(ax % rank for ax in axes):
            x = np.expand_dims(x, ax)
        return [x]
    if op == "Transpose":
        return [np.transpose(v[0], a.get("perm"))]
    if op in BINARY_OPS and len(v) == 2:
        r = BINARY_OPS[op](v[0], v[1])
        if op == "Div" and v[0].dtype.kind in "iu":
            r = np.trunc(r)
        return [np.asarray(r).astype(np.result_type(v[0], v[1]))]
    if op == "DequantizeLinear":
        q, s = v[0], np.asarray(v[1], np.float32)
        z = v[2] if len(v) > 2 and v[2] is not None else np.zeros((), q.dtype)
        axis = a.get("axis", 1)
        if s.size > 1:
            shp = [1] * q.ndim
            shp[axis] = -1
            s = s.reshape(shp)
            z = np.asarray(z).reshape(shp) if np.size(z) > 1 else z
        return [((q.astype(np.int64) - np.asarray(z).astype(np.int64)) * s).astype(np.float32)]
    if op == "Sqrt":
        return [np.sqrt(v[0])]
    if op == "Identity":
        return [v[0]]
    return None


def _fold_reference(node, vals, opset):
    from onnx.reference import ReferenceEvaluator
    names = [f"i{i}" for i in range(len(vals))]
    n2 = onnx.NodeProto()
    n2.CopyFrom(node)
    del n2.input[:]
    n2.input.extend([nm if v is not None else "" for nm, v in zip(names, vals)])
    del n2.output[:]
    outs = [f"o{i}" for i in range(len(node.output))]
    n2.output.extend(outs)
    inputs = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(v.dtype), None)
              for nm, v in zip(names, vals) if v is not None]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs]
    g = helper.make_graph([n2], "fold", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    ev = ReferenceEvaluator(m)
    return ev.run(None, {nm: v for nm, v in zip(names, vals) if v is not None})


# ====================================================================== passes
def _passes(g):
    _merge_affines(g)
    _fold_affines(g)
    _lower_affines(g)
    _fuse_acts(g)
    _dead_code(g)


def _sole_reader(g, tensor, cons, outputs):
    c = cons.get(tensor, [])
    return c[0] if len(c) == 1 and tensor not in outputs else None


def _merge_affines(g):
    outputs = {t.name for t in g.outputs}
    changed = True
    while changed:
        changed = False
        cons, prod = g.consumers(), g.producers()
        for layer in g.layers:
            if layer.op != "affine":
                continue
            p = prod.get(layer.inputs[0])
            if p is not None and p.op == "affine" and \
                    _sole_reader(g, p.output, cons, outputs) is layer:
                # y = a2 (a1 x + b1) + b2
                a1, b1 = p.params["scale"], p.params["shift"]
                a2, b2 = layer.params["scale"], layer.params["shift"]
                p.params = {"scale": a1 * a2, "shift": b1 * a2 + b2}
                p.outputs = list(layer.outputs)
                g.layers.remove(layer)
                changed = True
                break


def _fold_affines(g):
    outputs = {t.name for t in g.outputs}
    cons, prod = g.consumers(), g.producers()
    for layer in list(g.layers):
        if layer.op != "affine":
            continue
        p = prod.get(layer.inputs[0])
        if p is None or p.op not in ("conv", "gemm") or p.attrs.get("act") or \
                _sole_reader(g, p.output, cons, outputs) is not layer:
            continue
        if p.op == "gemm" and len(g.shape(p.output)) != 2:
            continue
        a, b = layer.params["scale"], layer.params["shift"]
        w = p.params["weight"].astype(np.float64)
        p.params["weight"] = (w * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        p.params["bias"] = (p.params["bias"] * a + b).astype(np.float32)
        p.attrs.pop("weight_qinfo", None)
        p.outputs = list(layer.outputs)
        g.layers.remove(layer)
        cons, prod = g.consumers(), g.producers()


def _lower_affines(g):
    for i, layer in enumerate(g.layers):
        if layer.op != "affine":
            continue
        xs = g.shape(layer.inputs[0])
        a = layer.params["scale"].astype(np.float32)
        b = layer.params["shift"].astype(np.float32)
        c = xs[1]
        if len(xs) in (3, 4):
            w = a.reshape(c, 1, 1, 1)
            g.layers[i] = Layer(layer.name, "conv", layer.inputs, layer.outputs,
                                dict(stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1),
                                     groups=c, act=None, from_affine=True),
                                {"weight": w, "bias": b})
        elif len(xs) == 2:
            g.layers[i] = Layer(layer.name, "gemm", layer.inputs, layer.outputs,
                                {"act": None, "from_affine": True},
                                {"weight": np.diag(a).astype(np.float32), "bias": b})
        else:
            raise UnsupportedOpError(f"node {layer.name!r}: per-channel scale on rank "
                                     f"{len(xs)} is not supported")


def _fuse_acts(g):
    outputs = {t.name for t in g.outputs}
    changed = True
    while changed:
        changed = False
        cons, prod = g.consumers(), g.producers()
        for layer in g.layers:
            if layer.op != "clip":
                continue
            p = prod.get(layer.inputs[0])
            if p is None or _sole_reader(g, p.output, cons, outputs) is not layer:
                continue
            if p.op in ("conv", "gemm", "add", "avgpool"):
                old = p.attrs.get("act") or ("clip", -INF, INF)
                p.attrs["act"] = ("clip", max(old[1], layer.attrs["lo"]),
                                  min(old[2], layer.attrs["hi"]))
            elif p.op == "clip":
                p.attrs = {"lo": max(p.attrs["lo"], layer.attrs["lo"]),
                           "hi": min(p.attrs["hi"], layer.attrs["hi"])}
            else:
                continue
            p.outputs = list(layer.outputs)
            g.layers.remove(layer)
            changed = True
            break


def _dead_code(g):
    live = {t.name for t in g.outputs}
    keep = []
    for layer in reversed(g.layers):
        if any(o in live for o in layer.outputs):
            keep.append(layer)
            live.update(layer.inputs)
    g.layers = keep[::-1]
    used = live | {t.name for t in g.inputs}
    g.tensors = {k: v for k, v in g.tensors.items() if k in used}

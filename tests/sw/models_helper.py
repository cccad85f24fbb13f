"""Test helpers: the ONNX "light" zoo models, weight randomization, small builder models.

``light_path(name)`` -- path of ``onnx/backend/test/data/light/light_<name>.onnx``.
``randomized(name)`` -- that model with every ``ConstantOfShape`` weight (all 0.02 in the
    stored files, which makes every logit identical) replaced by random initializers with
    sensible magnitudes (He-scaled conv/fc weights, BN statistics near identity), so
    numerical comparisons actually test something.
``ort_run(model, feed, outputs=None, optimized=False)`` -- run a ModelProto in onnxruntime
    (2 threads). Default: ``ORT_ENABLE_BASIC``, where a QDQ model runs as written
    (DequantizeLinear -> float op -> QuantizeLinear, the format's semantics: the oracle
    the reference is compared with); ``optimized=True``: onnxruntime's default session,
    whose fused int8 kernels saturate on x86 CPUs without VNNI (see ``ORT_INT8_SATURATES``).
``ORT_INT8_SATURATES`` -- True on CPUs where onnxruntime's uint8 x int8 kernels sum
    product pairs in saturating int16 (x86 with AVX2 but no VNNI/AMX; ``int8_cpu_class``).
``with_outputs(model, names)`` -- copy of a model exposing intermediate tensors as outputs.
``mk(...)`` helpers -- compact onnx.helper wrappers for the hand-built test models.
"""

from __future__ import annotations

import functools
import os
import platform

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512"]
#: the three with 50-140M-parameter fully connected layers (slow to randomize)
BIG_FC_MODELS = {"bvlc_alexnet", "vgg19", "zfnet512"}


def light_path(name):
    return os.path.join(LIGHT_DIR, f"light_{name}.onnx")


@functools.lru_cache(maxsize=None)
def _light_bytes(name):
    with open(light_path(name), "rb") as f:
        return f.read()


def light(name):
    m = onnx.ModelProto()
    m.ParseFromString(_light_bytes(name))
    return m


def real_inputs(model):
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


@functools.lru_cache(maxsize=None)
def _randomized_bytes(name, seed):
    m = light(name)
    g = m.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    readers = {}
    for node in g.node:
        for idx, t in enumerate(node.input):
            readers.setdefault(t, []).append((node, idx))
    rng = np.random.default_rng(seed)
    new_nodes, new_inits = [], []
    for node in g.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            new_nodes.append(node)
            continue
        shape = tuple(int(d) for d in inits[node.input[0]])
        out = node.output[0]
        role_node, idx = readers.get(out, [(None, 0)])[0]
        while role_node is not None and role_node.op_type == "Unsqueeze":
            role_node, idx = readers.get(role_node.output[0], [(None, 0)])[0]
        op = role_node.op_type if role_node is not None else ""
        if op in ("Conv", "Gemm", "MatMul") and idx == 1:
            fan_in = int(np.prod(shape[1:])) if op == "Conv" else (
                shape[1] if op == "Gemm" and len(shape) == 2 else shape[0])
            if op == "Gemm" and any(a.name == "transB" and a.i == 0 for a in role_node.attribute):
                fan_in = shape[0]
            a = np.float32(np.sqrt(6.0 / max(fan_in, 1)))  # He-uniform: cheap for 100M weights
            val = rng.random(shape, dtype=np.float32) * (2 * a) - a
        elif op == "BatchNormalization":
            val = {1: rng.uniform(0.5, 1.5, shape), 2: rng.normal(0, 0.1, shape),
                   3: rng.normal(0, 0.1, shape), 4: rng.uniform(0.5, 1.5, shape)}[idx]
        elif op == "Mul":
            val = rng.uniform(0.5, 1.5, shape)
        else:  # biases, Add constants
            val = rng.normal(0, 0.05, shape)
        new_inits.append(numpy_helper.from_array(np.asarray(val, np.float32), out))
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    return m.SerializeToString()


def randomized(name, seed=0):
    m = onnx.ModelProto()
    m.ParseFromString(_randomized_bytes(name, seed))
    return m


_SESS = {}


def ort_session(model, optimized=False):
    data = model.SerializeToString()
    key = (hash(data), bool(optimized))
    if key not in _SESS:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.log_severity_level = 3
        if not optimized:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        _SESS[key] = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return _SESS[key]


def ort_run(model, feed, outputs=None, optimized=False):
    s = ort_session(model, optimized)
    names = outputs or [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feed)))


def cpu_flags():
    """The x86 feature flags of /proc/cpuinfo (empty set elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def int8_cpu_class():
    """How onnxruntime's CPU (MLAS) uint8 x int8 GEMM kernels add products on this CPU:

    * ``"vnni"`` -- x86 with AVX512-VNNI, AVX-VNNI or AMX: 4-term dot products into int32
      (``vpdpbusd``), exact;
    * ``"avx2"`` -- x86 with AVX2 (or AVX512BW) but none of those: pairs of u8*s8 products
      summed in **saturating int16** (``vpmaddubsw``); wrong when ``|a1*w1 + a2*w2| >
      32767``, impossible with 7-bit weights (2 * 255 * 63 < 2^15);
    * ``"widening"`` -- other CPUs (x86 without AVX2, ARM, ...): operands widened to 16
      bits or dot products into int32, exact;
    * ``None`` -- x86 without /proc/cpuinfo (flags unknown).
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "widening"
    flags = cpu_flags()
    if not flags:
        return None
    if flags & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        return "vnni"
    return "avx2" if "avx2" in flags else "widening"


def bare_u8s8_matmul_is_exact():
    """Whether a bare onnxruntime ``MatMulInteger`` uint8 x int8 computes a random
    32x64x16 product with extreme values exactly (used only by the tests, to check
    :func:`int8_cpu_class` against the runtime's behaviour)."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (32, 64)).astype(np.uint8)
    w = rng.integers(-128, 128, (64, 16)).astype(np.int8)
    a[0], w[:, 0], w[:, 1] = 255, 127, -128
    m = model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
              [vi("a", [32, 64], TensorProto.UINT8)], [vi("y", None, TensorProto.INT32)],
              [init("w", w)])
    got = ort_run(m, {"a": a}, optimized=True)["y"]
    return bool(np.array_equal(got, a.astype(np.int64) @ w.astype(np.int64)))


def with_outputs(model, names):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(helper.make_empty_tensor_value_info(n))
    return m


# ---------------------------------------------------------------- builder helpers
def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model(nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "test", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def rand_w(rng, *shape, fan_in=None):
    fan_in = fan_in or int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


# ================================================================ hand-built op cases
def _conv_case(rng, cin=8, cout=16, k=3, hw=12, bn=False, act="relu", **conv_attrs):
    groups = conv_attrs.get("group", 1)
    w = rand_w(rng, cout, cin // groups, *([k, k] if isinstance(k, int) else k))
    b = rng.normal(0, 0.1, cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **conv_attrs)]
    inits = [init("w", w), init("b", b)]
    last = "c"
    if bn:
        nodes.append(helper.make_node("BatchNormalization", ["c", "g", "beta", "mu", "var"],
                                      ["bn"], epsilon=1e-3))
        inits += [init("g", rng.uniform(0.5, 1.5, cout).astype(np.float32)),
                  init("beta", rng.normal(0, 0.1, cout).astype(np.float32)),
                  init("mu", rng.normal(0, 0.1, cout).astype(np.float32)),
                  init("var", rng.uniform(0.5, 1.5, cout).astype(np.float32))]
        last = "bn"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif act == "relu6":
        inits += [init("lo", np.float32(0)), init("hi", np.float32(6))]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    elif act == "leaky":
        nodes.append(helper.make_node("LeakyRelu", [last], ["y"], alpha=0.1))
    else:
        nodes[-1].output[0] = "y"
    xshape = [1, cin, hw, hw]
    return model(nodes, [vi("x", xshape)], [vi("y", None)], inits)


def _conv1d_case(rng):
    w = rand_w(rng, 6, 4, 5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2], strides=[2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[3], strides=[2])]
    return model(nodes, [vi("x", [1, 4, 40])], [vi("y", None)], [init("w", w)])


def _gemm_case(rng, variant):
    if variant == "gemm":
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1, alpha=0.5, beta=2.0),
                 helper.make_node("Relu", ["g"], ["y"])]
        inits = [init("w", rand_w(rng, 10, 20)), init("b", rng.normal(0, .1, 10).astype(np.float32))]
        return model(nodes, [vi("x", [2, 20])], [vi("y", None)], inits)
    if variant == "gemm_notrans_bn":
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
                 helper.make_node("BatchNormalization", ["g", "s", "bb", "mu", "var"], ["y"])]
        inits = [init("w", rand_w(rng, 20, 10, fan_in=20)),
                 init("b", rng.normal(0, .1, (1, 10)).astype(np.float32)),
                 init("s", rng.uniform(.5, 1.5, 10).astype(np.float32)),
                 init("bb", rng.normal(0, .1, 10).astype(np.float32)),
                 init("mu", rng.normal(0, .1, 10).astype(np.float32)),
                 init("var", rng.uniform(.5, 1.5, 10).astype(np.float32))]
        return model(nodes, [vi("x", [1, 20])], [vi("y", None)], inits)
    if variant == "matmul_add":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
                 helper.make_node("Add", ["mm", "b"], ["a"]),
                 helper.make_node("Softmax", ["a"], ["y"], axis=-1)]
        inits = [init("w", rand_w(rng, 24, 7, fan_in=24)),
                 init("b", rng.normal(0, .1, 7).astype(np.float32))]
        return model(nodes, [vi("x", [1, 24])], [vi("y", None)], inits)
    if variant == "matmul3d":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
                 helper.make_node("Add", ["mm", "b"], ["y"])]
        inits = [init("w", rand_w(rng, 16, 12, fan_in=16)),
                 init("b", rng.normal(0, .1, 12).astype(np.float32))]
        return model(nodes, [vi("x", [1, 5, 16])], [vi("y", None)], inits)
    raise KeyError(variant)


def _pool_case(rng, op, **attrs):
    w = rand_w(rng, 8, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["y"], **attrs)]
    return model(nodes, [vi("x", [1, 3, 13, 13])], [vi("y", None)], [init("w", w)])


def _residual_case(rng):
    """conv-relu, conv, Add(residual), Sum of three, BN after the add (-> depthwise 1x1),
    Concat, Mul/Sub/Div by per-channel constants, GlobalAveragePool, Flatten, Gemm."""
    c = 8
    inits = [init("w1", rand_w(rng, c, c, 3, 3)), init("w2", rand_w(rng, c, c, 3, 3)),
             init("w3", rand_w(rng, c, c, 1, 1)), init("fc", rand_w(rng, 5, 2 * c)),
             init("g", rng.uniform(.5, 1.5, c).astype(np.float32)),
             init("be", rng.normal(0, .1, c).astype(np.float32)),
             init("mu", rng.normal(0, .1, c).astype(np.float32)),
             init("va", rng.uniform(.5, 1.5, c).astype(np.float32)),
             init("mul", rng.uniform(.5, 1.5, (c, 1, 1)).astype(np.float32)),
             init("sub", rng.normal(0, .2, (1, c, 1, 1)).astype(np.float32)),
             init("div", np.float32(1.7))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), n("Relu", ["a"], ["ar"]),
             n("Conv", ["ar", "w2"], ["b"], pads=[1, 1, 1, 1]),
             n("Add", ["b", "x"], ["s"]), n("Relu", ["s"], ["sr"]),
             n("Conv", ["sr", "w3"], ["d"]),
             n("Sum", ["d", "sr", "x"], ["e"]),
             n("BatchNormalization", ["e", "g", "be", "mu", "va"], ["f"]),
             n("Mul", ["f", "mul"], ["f2"]), n("Sub", ["f2", "sub"], ["f3"]),
             n("Div", ["f3", "div"], ["f4"]), n("Relu", ["f4"], ["f5"]),
             n("Concat", ["f5", "sr"], ["cat"], axis=1),
             n("GlobalAveragePool", ["cat"], ["gap"]), n("Flatten", ["gap"], ["fl"]),
             n("Gemm", ["fl", "fc"], ["y"], transB=1)]
    return model(nodes, [vi("x", [1, c, 10, 10])], [vi("y", None)], inits)


def _layout_case(rng):
    """Reshape / Transpose (channel shuffle) / Squeeze / Unsqueeze / Dropout / Identity."""
    n = helper.make_node
    inits = [init("w", rand_w(rng, 12, 12, 1, 1)), init("s1", np.array([1, 3, 4, 6, 6], np.int64)),
             init("s2", np.array([1, 12, 6, 6], np.int64)), init("ax", np.array([0], np.int64))]
    nodes = [n("Conv", ["x", "w"], ["c"]), n("Relu", ["c"], ["r"]),
             n("Reshape", ["r", "s1"], ["r5"]), n("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             n("Reshape", ["t5", "s2"], ["sh"]), n("Dropout", ["sh"], ["dr"]),
             n("Identity", ["dr"], ["id"]), n("Squeeze", ["id", "ax"], ["sq"]),
             n("Unsqueeze", ["sq", "ax"], ["y"])]
    return model(nodes, [vi("x", [1, 12, 6, 6])], [vi("y", None)], inits)


def _float_ops_case(rng):
    """CPU float ops: LRN, Sigmoid, Tanh, Selu, Elu, HardSigmoid, Mul of two tensors,
    non-constant MatMul, Softmax."""
    n = helper.make_node
    inits = [init("w", rand_w(rng, 8, 4, 3, 3)), init("sh", np.array([1, 8, 36], np.int64))]
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             n("LRN", ["c"], ["l"], size=3, alpha=1e-3, beta=0.75, bias=1.0),
             n("Sigmoid", ["l"], ["sg"]), n("Tanh", ["l"], ["th"]), n("Mul", ["sg", "th"], ["m"]),
             n("Selu", ["m"], ["se"]), n("Elu", ["se"], ["el"]),
             n("HardSigmoid", ["el"], ["hs"]),
             n("Reshape", ["hs", "sh"], ["r"]),
             n("Transpose", ["r"], ["rt"], perm=[0, 2, 1]),
             n("MatMul", ["r", "rt"], ["mm"]),
             n("Softmax", ["mm"], ["y"], axis=-1)]
    return model(nodes, [vi("x", [1, 4, 6, 6])], [vi("y", None)], inits)


def _keras_case(rng):
    """Channel-last Keras/tf2onnx style: NHWC input, Transpose in, conv body, Transpose out,
    Reshape via Shape/Gather/Concat (folded), MatMul + Add, Softmax; dynamic batch."""
    n = helper.make_node
    inits = [init("w", rand_w(rng, 6, 3, 3, 3)), init("w2", rand_w(rng, 6, 1, 3, 3)),
             init("b2", rng.normal(0, .1, 6).astype(np.float32)),
             init("fc", rand_w(rng, 6 * 4 * 4, 4, fan_in=96)),
             init("fb", rng.normal(0, .1, 4).astype(np.float32)),
             init("idx0", np.array([0], np.int64)), init("m1", np.array([-1], np.int64))]
    nodes = [n("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             n("Conv", ["xt", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
             n("Relu", ["c"], ["r"]),
             n("Conv", ["r", "w2", "b2"], ["dw"], group=6, auto_pad="SAME_LOWER"),
             n("Relu", ["dw"], ["dr"]),
             n("Transpose", ["dr"], ["back"], perm=[0, 2, 3, 1]),
             n("Shape", ["back"], ["shp"]), n("Gather", ["shp", "idx0"], ["bs"], axis=0),
             n("Concat", ["bs", "m1"], ["newshape"], axis=0),
             n("Reshape", ["back", "newshape"], ["flat"]),
             n("MatMul", ["flat", "fc"], ["mm"]), n("Add", ["mm", "fb"], ["logits"]),
             n("Softmax", ["logits"], ["y"], axis=-1)]
    return model(nodes, [vi("x", ["N", 8, 8, 3])], [vi("y", None)], inits)


def _light_style_case(rng):
    """Old-exporter style (opset 9): weights from ConstantOfShape, initializers listed among
    the graph inputs, Dropout, Softmax with coerced axis."""
    n = helper.make_node
    wshape = np.array([4, 3, 3, 3], np.int64)
    inits = [init("w_shape", wshape), init("b", rng.normal(0, .1, 4).astype(np.float32))]
    nodes = [n("ConstantOfShape", ["w_shape"], ["w"],
               value=numpy_helper.from_array(np.array([0.05], np.float32))),
             n("Conv", ["data_0", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["r"]), n("Dropout", ["r"], ["d"], ratio=0.5),
             n("Softmax", ["d"], ["prob"], axis=1)]
    inputs = [vi("w_shape", [4], TensorProto.INT64), vi("data_0", [1, 3, 5, 5]),
              vi("b", [4])]
    return model(nodes, inputs, [vi("prob", None)], inits, opset=9)


def _dilated_case(rng):
    return _conv_case(rng, cin=4, cout=6, k=3, hw=15, act="relu6", dilations=[2, 3],
                      pads=[2, 3, 2, 3], strides=[1, 2])


CASES = {
    "conv_bn_relu": lambda r: _conv_case(r, bn=True, pads=[1, 1, 1, 1]),
    "conv_stride_pads": lambda r: _conv_case(r, k=5, strides=[2, 2], pads=[2, 1, 0, 2]),
    "conv_dilated_relu6": _dilated_case,
    "conv_auto_pad_upper": lambda r: _conv_case(r, k=4, strides=[2, 2], auto_pad="SAME_UPPER"),
    "conv_auto_pad_lower": lambda r: _conv_case(r, k=4, strides=[3, 3], auto_pad="SAME_LOWER"),
    "conv_auto_pad_valid": lambda r: _conv_case(r, k=3, auto_pad="VALID", act=None),
    "conv_depthwise": lambda r: _conv_case(r, cin=8, cout=8, group=8, pads=[1, 1, 1, 1]),
    "conv_depthwise_mult": lambda r: _conv_case(r, cin=4, cout=8, group=4, pads=[1, 1, 1, 1],
                                                strides=[2, 2]),
    "conv_grouped": lambda r: _conv_case(r, cin=8, cout=12, group=4, pads=[1, 1, 1, 1]),
    "conv_leaky": lambda r: _conv_case(r, act="leaky", pads=[1, 1, 1, 1]),
    "conv1d": _conv1d_case,
    "gemm": lambda r: _gemm_case(r, "gemm"),
    "gemm_notrans_bn": lambda r: _gemm_case(r, "gemm_notrans_bn"),
    "matmul_add_softmax": lambda r: _gemm_case(r, "matmul_add"),
    "matmul_3d": lambda r: _gemm_case(r, "matmul3d"),
    "maxpool": lambda r: _pool_case(r, "MaxPool", kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1]),
    "maxpool_ceil": lambda r: _pool_case(r, "MaxPool", kernel_shape=[2, 2], strides=[2, 2],
                                         ceil_mode=1),
    "avgpool_pad_excl": lambda r: _pool_case(r, "AveragePool", kernel_shape=[3, 3],
                                             strides=[2, 2], pads=[1, 1, 1, 1]),
    "avgpool_pad_incl": lambda r: _pool_case(r, "AveragePool", kernel_shape=[3, 3],
                                             strides=[1, 1], pads=[1, 1, 1, 1],
                                             count_include_pad=1),
    "avgpool_ceil": lambda r: _pool_case(r, "AveragePool", kernel_shape=[3, 3],
                                         strides=[2, 2], ceil_mode=1),
    "global_avgpool": lambda r: _pool_case(r, "GlobalAveragePool"),
    "global_maxpool": lambda r: _pool_case(r, "GlobalMaxPool"),
    "residual_bn_concat": _residual_case,
    "layout_ops": _layout_case,
    "float_ops": _float_ops_case,
    "keras_channel_last": _keras_case,
    "light_style": _light_style_case,
}


def case(name, seed=0):
    return CASES[name](np.random.default_rng(seed))


def input_feed(graph_or_model, seed=1, n=None):
    """Standard normal data for every real input (batch 1 for dynamic dims)."""
    rng = np.random.default_rng(seed)
    feed = {}
    if hasattr(graph_or_model, "inputs") and not isinstance(graph_or_model, onnx.ModelProto):
        for t in graph_or_model.inputs:
            shape = t.shape if n is None else (n,) + tuple(t.shape[1:])
            feed[t.name] = rng.standard_normal(shape).astype(np.float32)
        return feed
    for i in real_inputs(graph_or_model):
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
        if n is not None:
            shape[0] = n
        feed[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


_CLASS = int8_cpu_class()
#: onnxruntime's optimized session may compute int8 GEMMs with saturated int16 pair sums
ORT_INT8_SATURATES = (_CLASS == "avx2") if _CLASS is not None else \
    not bare_u8s8_matmul_is_exact()

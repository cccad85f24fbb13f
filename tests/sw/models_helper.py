"""Test helpers: the ONNX "light" zoo models, weight randomization, small builder models.

``light_path(name)`` -- path of ``onnx/backend/test/data/light/light_<name>.onnx``.
``randomized(name)`` -- that model with every ``ConstantOfShape`` weight (all 0.02 in the
    stored files, which makes every logit identical) replaced by random initializers with
    sensible magnitudes (He-scaled conv/fc weights, BN statistics near identity), so
    numerical comparisons actually test something.
``ort_run(model, feed, outputs=None)`` -- run a ModelProto in onnxruntime (2 threads).
``with_outputs(model, names)`` -- copy of a model exposing intermediate tensors as outputs.
``mk(...)`` helpers -- compact onnx.helper wrappers for the hand-built test models.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512"]


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
            val = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif op == "BatchNormalization":
            val = {1: rng.uniform(0.5, 1.5, shape), 2: rng.normal(0, 0.1, shape),
                   3: rng.normal(0, 0.1, shape), 4: rng.uniform(0.5, 1.5, shape)}[idx]
        elif op == "Mul":
            val = rng.uniform(0.5, 1.5, shape)
        else:  # biases, Add constants
            val = rng.normal(0, 0.05, shape)
        new_inits.append(numpy_helper.from_array(val.astype(np.float32), out))
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    return m.SerializeToString()


def randomized(name, seed=0):
    m = onnx.ModelProto()
    m.ParseFromString(_randomized_bytes(name, seed))
    return m


_SESS = {}


def ort_session(model):
    data = model.SerializeToString()
    key = hash(data)
    if key not in _SESS:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.log_severity_level = 3
        _SESS[key] = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return _SESS[key]


def ort_run(model, feed, outputs=None):
    s = ort_session(model)
    names = outputs or [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feed)))


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

"""ONNX import + float execution agree with onnxruntime.

* the nine ONNX "light" zoo models as stored (ConstantOfShape weights, initializers among
  the inputs, opset 9): outputs and the pre-softmax logits;
* the same models with randomized weights (so the values mean something);
* hand-built models covering every supported op (models_helper.CASES), including
  channel-last Keras-style transposes, depthwise/grouped/dilated convs, auto_pad, ceil-mode
  pools, BN folding, Dropout/Identity removal;
* QDQ models produced by onnxruntime's own quantizer (int8 and uint8 activations).
"""

import os
import tempfile

import numpy as np
import onnx
import pytest

import dnnfab
from dnnfab.sw.ir.graph import Graph

from . import models_helper as mh

RTOL = 1e-4


def assert_close(got, ref, rtol=RTOL, atol_rel=1e-5):
    atol = atol_rel * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def _softmax_inputs(g):
    return [L.inputs[0] for L in g.layers
            if L.op == "float" and L.attrs["op_type"] == "Softmax"]


@pytest.mark.parametrize("name", mh.LIGHT_MODELS)
def test_light_zoo_as_stored(name):
    m = mh.light(name)
    g = dnnfab.load(m)
    assert isinstance(g, Graph)
    # the real input is the graph input that is not an initializer
    assert [t.name for t in g.inputs] == [i.name for i in mh.real_inputs(m)]
    assert g.inputs[0].shape == (1, 3, 224, 224)
    feed = mh.input_feed(g)
    logits = _softmax_inputs(g)
    ref = mh.ort_run(mh.with_outputs(m, logits), feed)
    out = {}
    y = g.run(feed, observer=lambda n, a: out.__setitem__(n, a) if n in logits else None)
    if not logits:  # densenet121 ends in a conv: compare the output itself
        logits = list(y)
        out = y
    for k in logits:
        assert_close(out[k], ref[k])
    for k in y:
        # all stored weights are 0.02, so every logit is equal in exact arithmetic and the
        # softmax output only reflects float rounding (squeezenet: 1e10-sized logits);
        # compare the logits above and check the outputs are distributions here
        assert y[k].shape == ref[k].shape
        np.testing.assert_allclose(y[k].sum(), ref[k].sum(), rtol=1e-4)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in mh.BIG_FC_MODELS else n
    for n in mh.LIGHT_MODELS])
def test_light_zoo_randomized(name):
    m = mh.randomized(name)
    g = dnnfab.load(m)
    feed = mh.input_feed(g)
    y = g.run(feed)
    ref = mh.ort_run(m, feed)
    for k in y:
        assert np.abs(ref[k]).max() > 0
        assert_close(y[k], ref[k])


@pytest.mark.parametrize("name", sorted(mh.CASES))
def test_builder_models_float(name):
    m = mh.case(name)
    g = dnnfab.load(m)
    feed = mh.input_feed(g)
    y = g.run(feed)
    ref = mh.ort_run(m, feed)
    assert set(y) == {o.name for o in m.graph.output}
    for k in y:
        assert y[k].shape == ref[k].shape
        assert_close(y[k], ref[k])


def test_bn_folded_and_relu_fused():
    g = dnnfab.load(mh.case("conv_bn_relu"))
    assert [L.op for L in g.layers] == ["conv"]
    assert g.layers[0].attrs["act"] == ("clip", 0.0, float("inf"))


def test_bn_after_add_becomes_depthwise_conv():
    g = dnnfab.load(mh.case("residual_bn_concat"))
    dw = [L for L in g.layers if L.op == "conv" and L.attrs.get("from_affine")]
    assert len(dw) == 1  # BN + Mul + Sub + Div merged into one per-channel affine
    assert dw[0].attrs["groups"] == dw[0].params["weight"].shape[0]
    assert dw[0].attrs["act"] is not None  # and the ReLU fused into it


def test_dropout_identity_removed_and_ops_lowered():
    g = dnnfab.load(mh.case("layout_ops"))
    assert {L.op for L in g.layers} <= {"conv", "reshape", "transpose"}


def test_keras_dynamic_batch():
    m = mh.case("keras_channel_last")
    g = dnnfab.load(m)
    assert g.inputs[0].shape == (1, 8, 8, 3)
    g3 = dnnfab.load(m, batch=3)
    feed = mh.input_feed(g3)
    assert feed["x"].shape == (3, 8, 8, 3)
    y = g3.run(feed)
    ref = mh.ort_run(m, feed)
    assert_close(y["y"], ref["y"])


def test_load_from_path_and_bytes(tmp_path):
    m = mh.case("gemm")
    p = tmp_path / "g.onnx"
    onnx.save(m, str(p))
    feed = mh.input_feed(m)
    a = dnnfab.load(str(p)).run(feed)["y"]
    b = dnnfab.load(m.SerializeToString()).run(feed)["y"]
    c = dnnfab.load(p).run(feed)["y"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_summary_counts_macs_and_targets():
    g = dnnfab.load(mh.case("conv_stride_pads"))  # 8->16 ch, 5x5, stride 2 on 12x12
    rows = g.summary()
    assert len(rows) == 1
    r = rows[0]
    ho, wo = r["output"][2:]
    assert r["macs"] == 16 * ho * wo * 8 * 5 * 5
    assert r["params"] == 16 * 8 * 5 * 5 + 16
    assert r["target"] == "fabric"
    fl = dnnfab.load(mh.case("float_ops")).summary()
    assert {r["op"]: r["target"] for r in fl}["LRN"] == "cpu"


# ---------------------------------------------------------------- QDQ models
def _ort_qdq(case, activation_type):
    ortq = pytest.importorskip("onnxruntime.quantization")

    class Reader(ortq.CalibrationDataReader):
        def __init__(self, feeds):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    m = mh.case(case)
    g = dnnfab.load(m)
    feeds = [mh.input_feed(g, seed=s) for s in range(6)]
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        onnx.save(m, src)
        import logging
        logging.getLogger().setLevel(logging.ERROR)
        ortq.quantize_static(src, dst, Reader(feeds), quant_format=ortq.QuantFormat.QDQ,
                             per_channel=True, activation_type=activation_type,
                             weight_type=ortq.QuantType.QInt8)
        return onnx.load(dst), feeds


@pytest.mark.parametrize("act", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("case", ["residual_bn_concat", "conv_depthwise", "maxpool"])
def test_qdq_model_imports_with_own_scales(case, act):
    from onnxruntime.quantization import QuantType
    qm, feeds = _ort_qdq(case, getattr(QuantType, act))
    g = dnnfab.load(qm)
    qdq = [L for L in g.layers if L.op == "qdq"]
    assert qdq, "Q/DQ pairs must survive import as qdq layers"
    feed = mh.input_feed(g, seed=42)
    y = g.run(feed)
    # the QDQ model's semantics (ORT_ENABLE_BASIC: DequantizeLinear -> float op ->
    # QuantizeLinear), not a fused int8 kernel that saturates on CPUs without VNNI
    ref = mh.ort_run(qm, feed)
    for k in y:
        # fake-quantized values: identical except (rarely) one quantization step
        step = max(L.attrs["scale"] for L in qdq)
        d = np.abs(y[k] - ref[k])
        assert d.max() <= step * 1.01
        assert (d <= 1e-5 * max(1, np.abs(ref[k]).max())).mean() >= 0.99
    # the quantizer keeps the model's activation scales
    q = dnnfab.quantize(g, calibration=feeds)
    for L in qdq:
        p = q.qtensors[L.output]
        assert np.isclose(p.scale, L.attrs["scale"]) and p.zero_point == L.attrs["zero_point"]
    yq = q.run(feed)
    for k in y:
        assert np.abs(yq[k] - ref[k]).max() <= 2.01 * step

"""The CPU workers (dnnfab.sw.cpu.workers / engines / profile).

* every engine the selector can pick on this machine, on random single-layer graphs, is
  bit-identical to the literal contract (sw/ref/golden): dense / grouped / depthwise /
  first-layer convs, GEMMs with K long enough that int16 pair sums saturate and across
  the 1024 float32 chunk and the u8u8 limits' neighbourhood, pools, add, concat; values
  -128/127, weights +-127, zero points at the ends; at 1, 2 and 3 threads with every
  layer split into slices;
* the u8s8 code path (fold of the +128 shift) on weights where it is exact on any CPU
  (|w| <= 63), posing a VNNI machine;
* the selector as a pure function of the CPU features (VNNI / ARM dot product present or
  absent, K limits, the float32 bound, options), and its agreement with what onnxruntime
  does here (u8s8 saturates where the selector says it does);
* the pool: same outputs as run_reference on randomized zoo models (residual, Inception
  branches, ShuffleNet, DenseNet concats) and the bundled models (1-D convs) for 1-4
  threads and any split, with the run-time fusions (shuffle, residual add); run_layer /
  run_layers into an Env; no thread left after close() or garbage collection; an
  exception in a task reaches the caller naming the layer;
* the profile: measured, cached on disk, reloaded, re-measured.
"""

import gc
import json
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnfab
from dnnfab.errors import DnnfabError
from dnnfab.sw.cpu import engines as E
from dnnfab.sw.cpu import kernels as K
from dnnfab.sw.cpu import reference as R
from dnnfab.sw.cpu import workers as W
from dnnfab.sw.cpu.options import Options
from dnnfab.sw.cpu.profile import (CpuProfile, layer_signature, PASSES, MAX_ROUNDS,
                                   MIN_MEASURE_S, rounds_for)
from dnnfab.sw.ir.graph import TensorInfo
from dnnfab.sw.ir.qgraph import QAvgPool, QConv, QEltwise, QGemm, QMaxPool, QuantizedGraph
from dnnfab.sw.ref import golden as G

from . import models_helper as mh
from .test_reference_props import SETTINGS, _clamp, _int8, _requant_params, _weights

pytestmark = pytest.mark.skipif(not K.AVAILABLE, reason="numba not installed (a dependency)")

HERE = E.CpuFeatures.detect()
VNNI = E.CpuFeatures("x86_64", frozenset({"avx2", "avx512_vnni"}))
AVX2 = E.CpuFeatures("x86_64", frozenset({"avx2", "fma"}))
ARM_DOT = E.CpuFeatures("aarch64", frozenset({"asimd", "asimddp"}))
ARM = E.CpuFeatures("aarch64", frozenset({"asimd"}))


def _cl_to_lg(x):
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _graph(L, in_shapes, out_shape):
    """A QuantizedGraph of the single layer ``L`` (logical shapes)."""
    ins = [TensorInfo(n, tuple(s)) for n, s in in_shapes.items()]
    shapes = dict(in_shapes)
    shapes[L.output] = tuple(out_shape)
    return QuantizedGraph("one", ins, [TensorInfo(L.output, tuple(out_shape))], [L], {}, shapes)


def _run_workers(qg, feed, threads, options=None, features=None, split=True):
    """Run a graph on the workers (by default with every layer split into slices)."""
    mp = _split_all() if split else None
    try:
        # (layer by layer: a small graph would otherwise run as one NetPlan, which
        # tests/sw/test_netplan.py covers)
        with W.CpuWorkers(qg, threads=threads, options=(options or Options()).replace(net_plan=False),
                          features=features) as w:
            out = w.run(feed)
            report = w.engine_report()
    finally:
        if mp is not None:
            mp.undo()
    return out, report


# ---------------------------------------------------------------- engines vs the contract
@st.composite
def conv_layer(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["dense", "dense", "first", "grouped", "depthwise", "wide"]))
    g = 1
    if kind == "first":
        cin, cout = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    elif kind == "grouped":
        g = draw(st.integers(2, 4))
        cin, cout = g * draw(st.integers(1, 4)), g * draw(st.integers(1, 3))
    elif kind == "depthwise":
        g = cin = cout = draw(st.integers(2, 10))
    elif kind == "wide":  # long K: 3x3 over many channels, int16 pairs would saturate
        cin, cout = draw(st.sampled_from([128, 256])), draw(st.integers(2, 9))
    else:
        cin, cout = draw(st.integers(5, 24)), draw(st.integers(1, 24))
    kh, kw = draw(st.sampled_from([(1, 1), (3, 3), (1, 3), (5, 5), (2, 2)]))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers((kh - 1) * dh + 1, 12 if kind != "wide" else (kh - 1) * dh + 3))
    w = draw(st.integers((kw - 1) * dw + 1, 12 if kind != "wide" else (kw - 1) * dw + 3))
    n = draw(st.integers(1, 2))
    zx = int(draw(st.sampled_from([-128, 127, 0, int(rng.integers(-128, 128))])))
    zy = int(draw(st.sampled_from([-128, 127, 0, int(rng.integers(-128, 128))])))
    qw = _weights(rng, (cout, cin // g, kh, kw))
    if draw(st.booleans()):  # worst case: every weight +-127, every input at an extreme
        qw[:] = np.where(rng.random(qw.shape) < 0.8, 127, -127).astype(np.int8)
    m, nn = _requant_params(rng, cout, (cin // g) * kh * kw)
    bias = rng.integers(-2**20, 2**20, cout).astype(np.int32)
    lo, hi = _clamp(rng, zy)
    L = QConv("c", "x", "y", qw, bias, m, nn, zx, zy, lo, hi, (sh, sw), pads, (dh, dw), g)
    x = _int8(rng, (n, h, w, cin))
    if draw(st.booleans()):
        x[:] = np.where(rng.random(x.shape) < 0.7, 127, -128).astype(np.int8)
    return x, L


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("engine", ["auto", "ort", "numpy", "no-numba"])
@SETTINGS
@given(case=conv_layer())
def test_conv_engines_equal_contract(threads, engine, case):
    x, L = case
    want = G.qconv_int_slow(x, L)
    qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
    opts = Options(numba=False) if engine == "no-numba" else Options(gemm_engine=engine)
    got, rep = _run_workers(qg, {"x": _cl_to_lg(x)}, threads, opts)
    np.testing.assert_array_equal(got["y"], _cl_to_lg(want), err_msg=str(rep))
    depthwise = 1 < L.groups == L.qweight.shape[0] and L.qweight.shape[1] == 1
    if engine == "numpy" and not depthwise:
        assert rep["c"]["engine"] == "blas-f32"
    if engine == "no-numba" and depthwise:
        assert rep["c"]["engine"] in ("ort-f32-conv", "blas-f32")
    if engine == "ort":
        assert rep["c"]["engine"] in (("numba-dw", "numba-lut", "numba-affine") if depthwise else
                                      ("ort-u8s8",) if HERE.int8_dot else ("ort-u8u8",))
    if engine == "auto":
        assert rep["c"]["engine"] in ("numba-dw", "numba-lut", "numba-affine", "numba-gemm",
                                      "ort-u8u8", "ort-u8s8")


def _split_all():
    """Every layer cut into as many slices as there are threads (``undo()`` restores)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(W, "SPLIT_MIN_MACS", 0)
    mp.setattr(W, "SPLIT_MIN_ELEMS", 0)
    mp.setattr(W, "BAND_MIN_ROWS", 1)
    mp.setattr(W, "HANDOFF_MIN_WORK", 0)     # and every task may go to any thread
    return mp


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), threads=st.integers(1, 3), stride=st.integers(1, 2))
def test_depthwise_1x1_table_equals_contract(seed, threads, stride):
    """A 1x1 depthwise conv (an unfoldable BatchNorm) runs in float64 where that is exact
    (``numba-affine``), else as a per-channel table (half the cases: huge multipliers)."""
    rng = np.random.default_rng(seed)
    c, h, w = int(rng.integers(1, 40)), int(rng.integers(1, 12)), int(rng.integers(1, 12))
    qw = _weights(rng, (c, 1, 1, 1))
    m, nn = _requant_params(rng, c, 1)
    zx = int(rng.choice([-128, 127, 0, 9]))
    zy = int(rng.choice([-128, 127, -3]))
    lo, hi = _clamp(rng, zy)
    if rng.random() < 0.5:          # beyond float64's exact range: the table
        m = np.full(c, 2**31 - 1, np.int64)
        nn = np.full(c, 40, np.int64)
    bias = rng.integers(-2**20, 2**20, c).astype(np.int32)
    if rng.random() < 0.3:
        bias[:] = rng.choice([-2**20, 2**20 - 1])
    L = QConv("c", "x", "y", qw, bias, m, nn, zx, zy,
              lo, hi, (stride, stride), (0, 0, 0, 0), (1, 1), c)
    x = _int8(rng, (1, h, w, c))
    want = G.qconv_int_slow(x, L)
    qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
    got, rep = _run_workers(qg, {"x": _cl_to_lg(x)}, threads)
    if c > 1:
        exact_f = K.scale_rq_params(qw[:, 0, 0, 0], bias, m, nn) is not None
        assert rep["c"]["engine"] == ("numba-affine" if exact_f else "numba-lut")
    np.testing.assert_array_equal(got["y"], _cl_to_lg(want))


@st.composite
def gemm_layer(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # 2 already saturates an int16 pair; 1024/1025 the float32 chunk edge; 4608 a long K
    k = draw(st.sampled_from([2, 3, 64, 1023, 1024, 1025, 2100, 4608]))
    nout = draw(st.integers(1, 12))
    rows = draw(st.integers(1, 4))
    zx = int(draw(st.sampled_from([-128, 127, int(rng.integers(-128, 128))])))
    zy = int(draw(st.sampled_from([-128, 127, int(rng.integers(-128, 128))])))
    qw = _weights(rng, (nout, k))
    x = _int8(rng, (rows, k))
    if draw(st.booleans()):  # the saturating worst case: a = 255, w = 127 everywhere
        qw[:] = 127 * (1 - 2 * draw(st.integers(0, 1)))
        x[:] = 127
    m, n = _requant_params(rng, nout, k)
    bias = rng.integers(-2**20, 2**20, nout).astype(np.int32)
    lo, hi = _clamp(rng, zy)
    return x, QGemm("f", "x", "y", qw, bias, m, n, zx, zy, lo, hi)


@pytest.mark.parametrize("engine", ["auto", "ort", "numpy"])
@SETTINGS
@given(case=gemm_layer(), threads=st.integers(1, 3))
def test_gemm_engines_equal_contract(engine, case, threads):
    x, L = case
    want = G.qgemm_int_slow(x, L)
    qg = _graph(L, {"x": x.shape}, want.shape)
    got, rep = _run_workers(qg, {"x": x}, threads, Options(gemm_engine=engine))
    np.testing.assert_array_equal(got["y"], want)
    small = x.shape[0] * x.shape[1] * L.qweight.shape[0] <= E.NUMBA_GEMM_MAX_MACS
    assert rep["f"]["engine"] == ("blas-f32" if engine == "numpy" else
                                  "numba-gemm" if engine == "auto" and small else
                                  E.select_gemm_engine(x.shape[1], HERE, wmax=E._wmax(L)).engine)


@SETTINGS
@given(case=gemm_layer(), threads=st.integers(1, 2), posed=st.booleans(),
       wlim=st.sampled_from([63, 64]))
def test_u8s8_path_exact_where_no_pair_can_saturate(case, threads, posed, wlim):
    """The u8s8 engine with weights within +-64: no u8*s8 pair sum exceeds int16
    (2 * 255 * 64 < 2^15), so the selector takes it on every CPU, this one (plain AVX2,
    saturating pair sums) included, and it is exact; also on a posed VNNI machine."""
    x, L = case
    L.qweight = np.clip(L.qweight, -wlim, wlim)
    if posed is False and L.qweight.size > 1:    # the worst case: pairs at the limit
        L.qweight.reshape(-1)[::2] = wlim
        x[::2] = 127
    want = G.qgemm_int_slow(x, L)
    qg = _graph(L, {"x": x.shape}, want.shape)
    got, rep = _run_workers(qg, {"x": x}, threads, Options(gemm_engine="ort"),
                            features=VNNI if posed else HERE)
    assert rep["f"]["engine"] == "ort-u8s8"
    np.testing.assert_array_equal(got["y"], want)


def test_selector_u8s8_by_weight_range():
    """wmax <= 64 allows u8s8 without int8 dot products; 65 does not."""
    assert E.select_gemm_engine(576, AVX2, wmax=64).engine == "ort-u8s8"
    assert "no int16 pair sum saturates" in E.select_gemm_engine(576, AVX2, wmax=64).reason
    assert E.select_gemm_engine(576, AVX2, wmax=65).engine == "ort-u8u8"
    assert E.select_gemm_engine(576, ARM, wmax=127).engine == "ort-u8u8"
    assert E.select_gemm_engine(E.U8U8_MAX_K + 1, AVX2, wmax=10).engine == "ort-u8s8"
    assert E.select_gemm_engine(E.U8S8_MAX_K + 1, AVX2, wmax=10).engine == "blas-f32"
    assert E.select_gemm_engine(576, AVX2, Options(gemm_engine="numpy"), wmax=1).engine == "blas-f32"


def test_u8s8_conv_path_exact_with_7bit_weights():
    rng = np.random.default_rng(3)
    for g, cin, cout, k in [(1, 16, 8, 3), (4, 16, 8, 1), (2, 8, 6, 3), (1, 256, 8, 3)]:
        qw = np.clip(_weights(rng, (cout, cin // g, k, k)), -64, 64)
        m, nn = _requant_params(rng, cout, cin // g * k * k)
        L = QConv("c", "x", "y", qw, rng.integers(-2**16, 2**16, cout).astype(np.int32), m, nn,
                  127, -128, -128, 127, (1, 1), (1, 0, 1, 2), (1, 1), g)
        x = _int8(rng, (1, 9, 7, cin))
        want = G.qconv_int_slow(x, L)
        qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
        for feats in (VNNI, HERE):
            got, rep = _run_workers(qg, {"x": _cl_to_lg(x)}, 2, Options(gemm_engine="ort"),
                                    features=feats)
            assert rep["c"]["engine"] == "ort-u8s8"
            np.testing.assert_array_equal(got["y"], _cl_to_lg(want))


@st.composite
def pool_layer(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["max", "avg", "global"]))
    c, h, w, n = (draw(st.integers(1, 9)), draw(st.integers(1, 11)), draw(st.integers(1, 11)),
                  draw(st.integers(1, 2)))
    x = _int8(rng, (n, h, w, c))
    if kind == "global":
        kh, kw, s, pads, extra = h, w, (1, 1), (0, 0, 0, 0), (0, 0)
    else:
        kh, kw = draw(st.integers(1, min(h, 3))), draw(st.integers(1, min(w, 3)))
        s = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        pads = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)),
                draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)))
        extra = (draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    if kind == "max":
        return x, QMaxPool("p", "x", "y", (kh, kw), s, pads, (1, 1), extra)
    _, ho, wo = G.pool_geom(QMaxPool("p", "x", "y", (kh, kw), s, pads, (1, 1), extra), x)
    count = rng.integers(1, kh * kw + 1, (ho, wo)).astype(np.int32)
    m = rng.integers(2**14, 2**15, (ho, wo)).astype(np.int32)
    nn = rng.integers(12, 20, (ho, wo)).astype(np.int32)
    zx = int(draw(st.sampled_from([-128, 127, 3])))
    zy = int(draw(st.sampled_from([-128, 127, -4])))
    lo, hi = _clamp(rng, zy)
    return x, QAvgPool("p", "x", "y", (kh, kw), s, pads, (1, 1), extra, 0, count, m, nn, zx,
                       zy, lo, hi, is_global=kind == "global")


@SETTINGS
@given(case=pool_layer(), threads=st.integers(1, 3), numba=st.booleans())
def test_pool_engines_equal_contract(case, threads, numba):
    x, L = case
    want = R.qmaxpool_int(x, L) if L.op == "maxpool" else G.qavgpool_int_slow(x, L)
    qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
    got, rep = _run_workers(qg, {"x": _cl_to_lg(x)}, threads, options=Options(numba=numba))
    numba = numba and K.AVAILABLE
    if L.op == "maxpool":
        assert rep["p"]["engine"] == ("numba-max" if numba else "numpy-max")
    elif numba:
        assert rep["p"]["engine"] == "numba-pool"
    np.testing.assert_array_equal(got["y"], _cl_to_lg(want))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), op=st.sampled_from(["add", "concat", "rescale"]),
       threads=st.integers(1, 3), rank=st.sampled_from([2, 4]))
def test_eltwise_engines_equal_contract(seed, op, threads, rank):
    rng = np.random.default_rng(seed)
    nin = 1 if op == "rescale" else (2 if op == "add" else int(rng.integers(2, 4)))
    shape = (1, 5, 4, 3) if rank == 4 else (2, 7)
    shapes = [list(shape) for _ in range(nin)]
    if op == "concat":
        for s in shapes:
            s[1] = int(rng.integers(1, 6))
    xs = [_int8(rng, tuple(s)) for s in shapes]
    k = rng.integers(2**10, 2**15, nin).astype(np.int32)
    z = rng.choice(np.array([-128, 127, 0, 5]), nin).astype(np.int32)
    zy = int(rng.choice([-128, 127, 0]))
    lo, hi = _clamp(rng, zy)
    ident = tuple(bool(rng.integers(0, 2)) for _ in range(nin)) if op == "concat" else ()
    if ident:
        lo, hi = -128, 127
    L = QEltwise("e", op, [f"x{i}" for i in range(nin)], "y", k, z, int(rng.integers(2**14, 2**15)),
                 int(rng.integers(14, 18)), zy, lo, hi, axis=1, identity=ident)
    parts = G.qeltwise_int_slow(xs, L)
    if op == "add":
        want = parts
    else:
        parts = [x if ident and ident[i] else p for i, (x, p) in enumerate(zip(xs, parts))]
        want = parts[0] if op == "rescale" else np.concatenate(parts, axis=1)
    qg = _graph(L, {f"x{i}": x.shape for i, x in enumerate(xs)}, want.shape)
    got, rep = _run_workers(qg, {f"x{i}": x for i, x in enumerate(xs)}, threads)
    assert rep["e"]["engine"] == "numba-lut"
    np.testing.assert_array_equal(got["y"], want)


# ---------------------------------------------------------------- the selector
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 7), threads=st.integers(1, 3),
       zx=st.sampled_from([-128, 127, 0, None]), extreme=st.booleans())
def test_lrn_engine_equals_reference_and_float_formula(seed, size, threads, zx, extreme):
    """Quantized LRN (numba-lrn, sliced over pixel rows) == the reference's table kernel ==
    its numpy fallback, bit for bit; within one output code of ONNX's float formula on the
    dequantized input (the window sum of squares is exact in the integer form)."""
    from dnnfab.sw.ir.graph import Layer, _lrn
    from dnnfab.sw.ir.qgraph import QFloat, QTensor, dequantize_tensor, quantize_tensor
    rng = np.random.default_rng(seed)
    c, h, w = int(rng.integers(1, 40)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
    zx = int(rng.integers(-128, 128)) if zx is None else zx
    attrs = {"size": size, "alpha": float(10 ** rng.uniform(-5, -1)),
             "beta": float(rng.uniform(0.5, 1.0)), "bias": float(rng.uniform(0.5, 2.0))}
    lay = Layer("l", "float", ["x"], ["y"], {"op_type": "LRN", "onnx_attrs": attrs,
                                             "n_inputs": 1})
    L = QFloat("l", lay, ["x"], "y")
    x = _int8(rng, (1, c, h, w))
    if extreme:
        x[:] = np.where(rng.random(x.shape) < 0.7, 127, -128).astype(np.int8)
    sx = np.float32(10 ** rng.uniform(-3, 0))
    qg = _graph(L, {"x": x.shape}, x.shape)
    xf = dequantize_tensor(x, sx, zx)
    yf = _lrn(xf, size, attrs["alpha"], attrs["beta"], attrs["bias"])
    sy = np.float32(max(float(np.abs(yf).max()), 1e-6) / 100)
    zy = int(rng.integers(-20, 20))
    qg.qtensors = {"x": QTensor(sx, zx), "y": QTensor(sy, zy)}
    want = R.run_reference(qg, {"x": x})["y"]
    assert np.array_equal(R.run_reference(qg, {"x": x}, options=Options(numba=False))["y"], want)
    got, rep = _run_workers(qg, {"x": x}, threads)
    assert rep["l"]["engine"] == "numba-lrn"
    np.testing.assert_array_equal(got["y"], want)
    close = quantize_tensor(yf, sy, zy).astype(int)
    assert np.abs(close - want).max() <= 1


def test_selector_u8s8_only_with_int8_dot_products():
    for feats, eng in [(VNNI, "ort-u8s8"), (AVX2, "ort-u8u8"), (ARM_DOT, "ort-u8s8"),
                       (ARM, "ort-u8u8"), (E.CpuFeatures("x86_64", frozenset()), "ort-u8u8"),
                       (E.CpuFeatures("riscv64", frozenset({"v"})), "ort-u8u8"),
                       (E.CpuFeatures("x86_64", frozenset({"avx_vnni"})), "ort-u8s8"),
                       (E.CpuFeatures("x86_64", frozenset({"amx_int8"})), "ort-u8s8")]:
        c = E.select_gemm_engine(576, feats)
        assert c.engine == eng, (feats, c)
        assert c.reason and "\n" not in c.reason
    assert "saturating int16" in E.select_gemm_engine(576, AVX2).reason


def test_selector_k_limits_and_options():
    assert E.U8U8_MAX_K == 33025 and 255 * 255 * E.U8U8_MAX_K < 2**31 <= 255 * 255 * (E.U8U8_MAX_K + 1)
    assert 255 * 128 * E.U8S8_MAX_K < 2**31 <= 255 * 128 * (E.U8S8_MAX_K + 1)
    assert E.select_gemm_engine(E.U8U8_MAX_K, AVX2).engine == "ort-u8u8"
    assert E.select_gemm_engine(E.U8U8_MAX_K + 1, AVX2).engine == "blas-f32"
    assert E.select_gemm_engine(E.U8U8_MAX_K + 1, VNNI).engine == "ort-u8s8"
    assert E.select_gemm_engine(E.U8S8_MAX_K + 1, VNNI).engine == "blas-f32"
    assert E.select_gemm_engine(64, VNNI, Options(gemm_engine="numpy")).engine == "blas-f32"
    assert E.select_gemm_engine(64, AVX2, ort=False).engine == "blas-f32"


def _conv(cout, cig, k, g=1, wval=None):
    rng = np.random.default_rng(0)
    w = _weights(rng, (cout, cig, k, k)) if wval is None else np.full((cout, cig, k, k), wval, np.int8)
    one = np.ones(cout, np.int32)
    return QConv("c", "x", "y", w, one, one * 2**14, one * 20, 0, 0, -128, 127, (1, 1),
                 (0, 0, 0, 0), (1, 1), g)


def test_selector_small_layers_on_numba():
    small = _conv(8, 3, 3)
    assert E.select_engine(small, (1, 3, 8, 8), AVX2).engine == "numba-gemm"
    assert E.select_engine(small, (1, 3, 8, 8), AVX2, Options(gemm_engine="ort")).engine == "ort-u8u8"
    assert E.select_engine(small, (1, 3, 8, 8), AVX2, Options(numba=False)).engine == "ort-u8u8"
    assert E.select_engine(small, (1, 3, 64, 64), AVX2).engine == "ort-u8u8"   # 2.2 M MACs
    fc = QGemm("f", "x", "y", np.full((10, 64), 127, np.int8), *([np.ones(10, np.int32)] * 3),
               0, 0, -128, 127)
    assert E.select_engine(fc, (1, 64), AVX2).engine == "numba-gemm"
    assert E.select_engine(fc, (4096, 64), AVX2).engine == "ort-u8u8"
    fc.qweight = np.full((10, 64), -64, np.int8)           # 7-bit weights: u8s8 is exact
    assert E.select_engine(fc, (4096, 64), AVX2).engine == "ort-u8s8"


def test_selector_conv_kinds():
    shape = (1, 3, 32, 32)
    assert E.select_engine(_conv(8, 3, 3), shape, AVX2).engine == "ort-u8u8"
    assert E.select_engine(_conv(8, 3, 3), shape, VNNI).engine == "ort-u8s8"
    assert E.select_engine(_conv(16, 32, 3), (1, 32, 16, 16), AVX2).engine == "ort-u8u8"
    assert E.select_engine(_conv(16, 8, 1, g=4), (1, 32, 64, 64), VNNI).engine == "ort-u8s8"
    dw = _conv(16, 1, 3, g=16)
    assert E.select_engine(dw, (1, 16, 8, 8), AVX2).engine == "numba-dw"
    off = Options(numba=False)
    assert E.select_engine(dw, (1, 16, 8, 8), AVX2, off).engine == "ort-f32-conv"
    assert E.select_engine(dw, (1, 16, 8, 8), AVX2, off, ort=False).engine == "blas-f32"
    # float32 only where 128 * sum|w| <= 2^24: a 363x363 depthwise kernel of 127s is not
    huge = _conv(4, 1, 363, g=4, wval=127)
    assert 128 * 363 * 363 * 127 > 2**24 and not E.f32_conv_exact(huge.qweight)
    assert E.select_engine(huge, (1, 4, 400, 400), AVX2, off).engine == "blas-f32"
    assert E.f32_conv_exact(_conv(4, 1, 3, g=4, wval=127).qweight)
    assert E.select_engine(_conv(16, 32, 3), (1, 32, 8, 8), AVX2,
                           Options(gemm_engine="numpy")).engine == "blas-f32"


def test_selector_agrees_with_onnxruntime_here():
    """Where the selector refuses u8s8 for saturation (x86 without VNNI), onnxruntime's
    u8s8 MatMulInteger really gets a random product wrong; where it allows it, right."""
    if not HERE.x86 or not HERE.flags:
        pytest.skip("x86 with /proc/cpuinfo only")
    exact = mh.bare_u8s8_matmul_is_exact()
    if "avx2" in HERE.flags or HERE.int8_dot:
        assert exact == HERE.int8_dot


# ---------------------------------------------------------------- the pool on networks
def _zoo(name, seed=5):
    g = dnnfab.load(mh.randomized(name))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, seed=seed, n=1))
    return q, q.quantize_inputs(mh.input_feed(g, seed=1))


@pytest.fixture(scope="module")
def zoo():
    return {name: _zoo(name) for name in ("squeezenet", "inception_v1", "shufflenet")}


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "shufflenet"])
def test_pool_equals_reference_any_thread_count_and_split(zoo, name, monkeypatch):
    q, fq = zoo[name]
    want = R.run_reference(q, fq, options=Options())
    for threads, split in [(1, False), (2, False), (2, True), (3, True), (4, False), (2, "all")]:
        with monkeypatch.context() as mp:
            if split:
                mp.setattr(W, "SPLIT_MIN_MACS", 0)
                mp.setattr(W, "SPLIT_MIN_ELEMS", 0)
                mp.setattr(W, "BAND_MIN_ROWS", 1)
            if split == "all":      # every task handed off (none kept by its thread)
                mp.setattr(W, "HANDOFF_MIN_WORK", 0)
            with W.CpuWorkers(q, threads=threads) as w:
                assert w.threads == threads
                got = w.run(fq)
                got2 = w.run(fq)            # a second run on the same sessions
                rep = w.engine_report()
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{name} {threads} {split}")
            np.testing.assert_array_equal(got2[k], want[k])
        assert set(rep) == {L.name for L in q.layers}
        assert all(r["engine"] and r["reason"] for r in rep.values())
        if split and threads > 1:
            assert sum(r["slices"] > 1 for r in rep.values()) > len(rep) // 3


def test_small_tasks_stay_on_their_thread(zoo, monkeypatch):
    """A ready task below HANDOFF_MIN_WORK runs on the thread that made it ready: with the
    limit above every layer, a 2-thread run never touches the pool thread; with 0, tasks
    do reach it. The outputs are the same."""
    q, fq = zoo["squeezenet"]
    want = R.run_reference(q, fq)
    seen = {}
    for limit in (2**62, 0):
        monkeypatch.setattr(W, "HANDOFF_MIN_WORK", limit)
        names = set()
        with W.CpuWorkers(q, threads=2) as w:
            for p in w._step_progs.values():
                def bind(env, _b=p.bind):
                    stages, fin = _b(env)

                    def tag(fn):
                        def t():
                            names.add(threading.current_thread().name)
                            return fn()
                        return t
                    return [[tag(f) for f in st] for st in stages], fin
                p.bind = bind
            for _ in range(3):
                got = w.run(fq)
                for k in want:
                    np.testing.assert_array_equal(got[k], want[k])
        seen[limit] = names
    assert seen[2**62] == {threading.current_thread().name}
    assert any(n.startswith("dnnfab-cpu-") for n in seen[0])


def test_pool_densenet_and_resnet_with_numpy_engine():
    for name in ("densenet121", "resnet50"):
        q, fq = _zoo(name)
        want = R.run_reference(q, fq, options=Options())
        for opts in (Options(gemm_engine="numpy"), Options()):
            if name == "densenet121" and opts.gemm_engine == "auto":
                continue
            with W.CpuWorkers(q, threads=2, options=opts) as w:
                got = w.run(fq)
                rep = w.engine_report()
            engines = {r["engine"] for r in rep.values()}
            assert ("blas-f32" in engines) == (opts.gemm_engine == "numpy")
            if name == "densenet121":   # its 62 BatchNorms in float64 (the figure in docs/cpu.md)
                assert sum(r["engine"] == "numba-affine" for r in rep.values()) == 62
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"{name} {opts}")
            if name == "resnet50":  # every residual add fused into the conv before it
                adds = [L.name for L in q.layers if L.op == "add"]
                assert adds and all("fused_into" in rep[a] for a in adds)
                assert any(rep[rep[a]["fused_into"]]["split"] == "channels" for a in adds)


def test_shufflenet_shuffles_and_adds_fused_in_run(zoo):
    q, fq = zoo["shufflenet"]
    want = R.run_reference(q, fq)
    folded = {}
    # a block-diagonal GEMM (u8s8 with VNNI, blas-f32) takes the shuffle into its weight
    # columns; a grouped session (u8u8 on plain AVX2) permutes in the requantize
    for feats, opts in ((None, Options(pool="threads")), (AVX2, Options(pool="threads")),
                        (None, Options(pool="threads", gemm_engine="numpy"))):
        with W.CpuWorkers(q, threads=2, options=opts, features=feats) as w:
            rep = w.engine_report()
            assert len(w._steps) < len(q.layers) - 40
            got = w.run(fq)
            ops = {L.name: L.op for L in q.layers}
            shuffled = [p for p in w._step_progs.values()
                        if isinstance(p, W._FusedConvProg) and "transpose" in
                        {ops[n] for n in p.fused}]
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{feats} {opts}")
        assert shuffled
        for p in shuffled:
            assert (p.src is None) == (p.base.mode in ("dense", "blockdiag"))
        folded[(feats, opts.gemm_engine)] = {p.src is None for p in shuffled}
        fused = {r["fused_into"] for r in rep.values() if "fused_into" in r}
        assert fused and all(rep[c]["fused"] for c in fused)
        assert all("fused_into" in rep[L.name] for L in q.layers if L.op == "transpose")
    assert folded[(AVX2, "auto")] == {False} and folded[(None, "numpy")] == {True}


def test_run_layer_and_run_layers_into_env(zoo):
    q, fq = zoo["inception_v1"]
    slow = R.Env(q)
    mine = R.Env(q)
    for t in q.inputs:
        slow.put(t.name, fq[t.name], "lg")
        mine.put(t.name, fq[t.name], "lg")
    half = len(q.layers) // 2
    with W.CpuWorkers(q, threads=2) as w:
        for L in q.layers[:half]:
            w.run_layer(mine, L)
        w.run_layers(mine, q.layers[half:])
    for L in q.layers:
        R.run_layer(q, slow, L, Options())
    for k in slow.v:
        np.testing.assert_array_equal(mine.lg(k), slow.lg(k), err_msg=k)


def _pool_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dnnfab-cpu-")]


def test_no_thread_left_after_close_or_gc(zoo):
    q, fq = zoo["squeezenet"]
    before = len(_pool_threads())
    w = W.CpuWorkers(q, threads=4)
    assert len(_pool_threads()) == before + 3   # the caller is the fourth
    w.run(fq)
    w.close()
    w.close()                                   # idempotent
    assert len(_pool_threads()) == before
    with pytest.raises(DnnfabError, match="closed"):
        w.run(fq)
    with W.CpuWorkers(q, threads=3) as w2:
        w2.run(fq)
    assert len(_pool_threads()) == before
    w3 = W.CpuWorkers(q, threads=3)
    w3.run(fq)
    del w3
    gc.collect()
    assert len(_pool_threads()) == before
    w4 = W.CpuWorkers(q, threads=1)             # one thread: everything inline
    assert len(_pool_threads()) == before
    w4.close()


def test_task_exception_names_the_layer(zoo):
    q, fq = zoo["squeezenet"]
    conv = next(L for L in q.layers if L.op == "conv" and L.qweight.shape[1] > 8)
    env = R.Env(q)
    n, c, h, wd = q.shape(conv.input)
    env.put(conv.input, np.zeros((n, h, wd, c + 3), np.int8), "cl")   # wrong channel count
    with W.CpuWorkers(q, threads=2) as w:
        with pytest.raises(W.CpuTaskError) as exc:
            w.run_layer(env, conv)
        assert exc.value.layer == conv.name
        msg = str(exc.value)
        assert repr(conv.name) in msg and "\n" not in msg
        assert exc.value.__cause__ is not None
        assert isinstance(exc.value, DnnfabError)
        # the pool survives a failed run
        out = w.run(fq)
    want = R.run_reference(q, fq)
    for k in want:
        np.testing.assert_array_equal(out[k], want[k])


def test_workers_reject_foreign_layers_and_float_inputs(zoo):
    q, fq = zoo["squeezenet"]
    q2, _ = zoo["shufflenet"]
    with W.CpuWorkers(q, threads=1) as w:
        with pytest.raises(DnnfabError, match="not a layer"):
            w.run_layer(R.Env(q), q2.layers[0])
        with pytest.raises(DnnfabError, match="int8"):
            w.run({k: v.astype(np.float32) for k, v in fq.items()})
    with pytest.raises(DnnfabError, match="at least 1"):
        W.CpuWorkers(q, threads=0)


def test_default_threads_from_options(zoo):
    q, _ = zoo["squeezenet"]
    with W.CpuWorkers(q, options=Options(workers=3)) as w:
        assert w.threads == 3
    with W.CpuWorkers(q) as w:
        assert w.threads == E.default_workers()
    assert Options.from_env({"DNNFAB_WORKERS": "2"}).workers == 2


# ---------------------------------------------------------------- the profile
def test_profile_measured_cached_and_remeasured(tmp_path, zoo):
    q, fq = zoo["squeezenet"]
    path = tmp_path / "prof.json"
    prof = CpuProfile(path)
    res = prof.measure(q, threads=(1, 2), repeats=2, feed_q=fq)
    assert set(res) == {L.name for L in q.layers}
    assert all(set(v) == {1, 2} and min(v.values()) > 0 for v in res.values())
    data = json.loads(path.read_text())
    assert data["version"] == 2 and prof.machine in data["machines"]
    with W.CpuWorkers(q, threads=2) as w:
        rep = w.engine_report()
    again = CpuProfile(path)                      # read back from disk
    for L in q.layers:
        sig = layer_signature(q, L, rep[L.name]["engine"])
        for t in (1, 2):
            assert again.latency_ms(sig, t) > 0
            e = again.entry(sig, t)
            # the median and the fastest of the same runs
            assert 0 < e["min_ms"] <= e["ms"] == again.latency_ms(sig, t, "median")
            assert e["min_ms"] == again.latency_ms(sig, t, "min")
            assert e["engine"] == rep[L.name]["engine"] and e["reason"]
    assert again.latency_ms("no such layer", 2) is None
    # cached: measuring again changes nothing; remeasure replaces every entry
    entries = {s: json.dumps(again._data[s], sort_keys=True) for s in again.signatures()}
    again.measure(q, threads=(1, 2), repeats=2, feed_q=fq)
    assert {s: json.dumps(again._data[s], sort_keys=True) for s in again.signatures()} == entries
    again.remeasure(q, threads=(2,), repeats=3, feed_q=fq)
    # each entry: PASSES x ``repeats`` rounds over the network, each of its layers once
    count = {}
    for L in q.layers:
        count[layer_signature(q, L, rep[L.name]["engine"])] = \
            count.get(layer_signature(q, L, rep[L.name]["engine"]), 0) + 1
    # (at least PASSES x repeats rounds, more to span MIN_MEASURE_S; the same number for all)
    for t, reps in (("2", 3), ("1", 2)):
        rounds = {again._data[s][t]["runs"] / count[s] for s in again.signatures()}
        assert len(rounds) == 1 and next(iter(rounds)) >= reps * PASSES, rounds
        n = int(next(iter(rounds)))
        assert n == next(iter(rounds)) and n <= MAX_ROUNDS
    assert rounds_for(1.0, 5) == 5 * PASSES and rounds_for(1e-3, 5) == int(MIN_MEASURE_S / 1e-3) + 1
    assert rounds_for(1e-9, 5) == MAX_ROUNDS
    other = CpuProfile(path, features=VNNI)       # another machine: its own entries
    assert other.signatures() == []
    # the pool reads the profile: a layer it measured no faster on 2 threads stays whole
    with W.CpuWorkers(q, threads=2) as w:
        static = w.engine_report()
    with W.CpuWorkers(q, threads=2, profile=again) as w:
        guided = w.engine_report()
        got = w.run(fq)
    for L in q.layers:
        sig = layer_signature(q, L, static[L.name]["engine"])
        slower = again.latency_ms(sig, 2) >= again.latency_ms(sig, 1)
        if static[L.name]["slices"] > 1 and slower:
            assert guided[L.name]["slices"] == 1 and "profile" in guided[L.name]["note"]
        else:
            assert guided[L.name]["slices"] == static[L.name]["slices"]
    want = R.run_reference(q, fq)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


# ---------------------------------------------------------------- the benchmark script
@pytest.mark.xdist_group("realtime")   # its helper process polls: not beside real-time runs
def test_bench_cpu_script_small(tmp_path):
    """scripts/bench_cpu.py runs through its own command line (small form) and writes the
    fields the issue names; the workers' result is bit-exact."""
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, "scripts/bench_cpu.py", "--models",
                           "digits-cnn,squeezenet", "--repeat", "1", "--pause", "0", "--json",
                           "--out", str(out)],
                          cwd=repo, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["results"]
    assert [r["model"] for r in rows] == ["digits-cnn", "squeezenet"]   # a zoo case too
    for row in rows:
        for key in ("workers_ms_1t", "workers_ms_2t", "ort_int8_ms_1t", "ort_int8_ms_2t",
                    "speedup_2t_vs_1t", "ratio_vs_ort_int8_2t", "workers_ms_2t_processes",
                    "ratio_vs_ort_int8_2t_processes"):
            assert row[key] > 0, key
        assert row["bit_exact"] and row["engine"]
        pools = (row["pool_2t"], row["pool_2t_profiled"], row["pool_2t_processes"])
        # digits-cnn runs as one small-network plan, whatever the pool; squeezenet does not
        assert row["net_plan"] == (row["model"] == "digits-cnn")
        if row["net_plan"]:
            assert pools == ("plan",) * 3 and row["processes_mode"] == "plan"
            assert row["workers_ms_1t_layers"] > 0      # the layer-by-layer run beside it
            continue
        # the 2-thread columns are the thread pool, the processes column the helpers
        assert pools == ("threads", "threads", "processes")
        # the helper process prepared and calibrated before the timed rounds
        assert row["processes_ready"] and \
            row["processes_mode"] in ("helpers", "native", "caller")
        assert set(row["processes_calibration_ms"]) == {"helpers", "native", "caller"}
    assert data["machine"]["u8s8_exact"] == HERE.int8_dot
    assert data["machine_scaling"]["before"]["scaling"] > 0


@pytest.mark.parametrize("name", ["digits-cnn", "eeg-seizure"])
def test_pool_equals_reference_on_bundled_models(name):
    """The bundled models (2-D convs and 1-D convs on [N, C, 1, L]) on real data."""
    from dnnfab.models import datasets
    g = dnnfab.load(name)
    if name == "digits-cnn":
        x = datasets.digits_split()[2][:3]
        cal = datasets.digits_split()[0][:64]
    else:
        cal = datasets.eeg_model_input(datasets.eeg_windows(24, seed=datasets.EEG_TRAIN_SEED)[0])
        x = cal[:3]
    q = dnnfab.quantize(g, calibration=cal)
    for i in range(len(x)):
        fq = q.quantize_inputs({g.inputs[0].name: x[i:i + 1]})
        want = R.run_reference(q, fq)
        for threads in (1, 2):
            for split, plan in ((False, False), (True, False), (False, True)):
                mp = _split_all() if split else None
                try:
                    with W.CpuWorkers(q, threads=threads, options=Options(net_plan=plan)) as w:
                        assert (w._plan is not None) == plan, w._plan_reason
                        got = w.run(fq)
                finally:
                    if mp is not None:
                        mp.undo()
                for k in want:
                    np.testing.assert_array_equal(got[k], want[k],
                                                  err_msg=f"{name} {threads} {split} {plan}")

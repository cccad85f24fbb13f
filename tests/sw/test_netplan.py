"""The small-network plan (dnnfab.sw.cpu.netplan.NetPlan) against the contract.

* single layers from the workers' strategies, dense convs through the plan's numba dot
  product and through each exact onnxruntime engine of this machine (dense / grouped / depthwise / first-layer /
  long-K convs with every padding, stride and dilation; GEMMs with K up to 4608; max,
  average and global pools), values and weights at the extremes, zero points at the ends:
  bit-identical to the literal contract (sw/ref/golden);
* random chains conv -> pool -> conv -> pool -> reshape -> gemm -> gemm, batch 1-2:
  bit-identical to run_reference;
* the bundled models through CpuWorkers (tests/sw/test_workers.py runs them with the
  plan on and off); what the plan refuses, and why.
"""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dnnfab.sw.cpu import engines as E
from dnnfab.sw.cpu import kernels as K
from dnnfab.sw.cpu import netplan as NP
from dnnfab.sw.cpu import reference as R
from dnnfab.sw.cpu import workers as W
from dnnfab.sw.cpu.options import Options
from dnnfab.sw.ir.graph import TensorInfo
from dnnfab.sw.ir.qgraph import QAvgPool, QConv, QEltwise, QGemm, QLayout, QMaxPool, QuantizedGraph
from dnnfab.sw.ref import golden as G

from .test_reference_props import SETTINGS, _clamp, _int8, _requant_params, _weights
from .test_workers import _cl_to_lg, _graph, conv_layer, gemm_layer, pool_layer

pytestmark = pytest.mark.skipif(not K.AVAILABLE, reason="numba not installed (a dependency)")


HERE = E.CpuFeatures.detect()
#: the plan's dense-conv GEMMs: its numba dot product, or an exact onnxruntime engine of
#: this machine (u8s8 only with int8 dot products)
GEMMS = [None, "ort-u8u8"] + (["ort-u8s8"] if HERE.int8_dot else [])


def _plan(qg, engine=None):
    gemm = None if engine is None else (lambda L, w_kn: W._matmul_session(w_kn, engine))
    plan, why = NP.NetPlan.build(qg, Options(), gemm=gemm)
    assert plan is not None, why
    return plan


@pytest.mark.parametrize("engine", GEMMS)
@SETTINGS
@given(case=conv_layer())
def test_plan_conv_equals_contract(engine, case):
    x, L = case
    want = G.qconv_int_slow(x, L)
    qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
    plan = _plan(qg, engine)
    got = plan.run({"x": _cl_to_lg(x)})
    np.testing.assert_array_equal(got["y"], _cl_to_lg(want))
    uses_ort = any(fn is K.im2col_u8 for fn, _ in plan.steps)
    assert uses_ort == (engine is not None and L.groups == 1)


@SETTINGS
@given(case=gemm_layer())
def test_plan_gemm_equals_contract(case):
    x, L = case
    want = G.qgemm_int_slow(x, L)
    got = _plan(_graph(L, {"x": x.shape}, want.shape)).run({"x": x})
    np.testing.assert_array_equal(got["y"], want)


@SETTINGS
@given(case=pool_layer())
def test_plan_pool_equals_contract(case):
    x, L = case
    want = R.qmaxpool_int(x, L) if L.op == "maxpool" else G.qavgpool_int_slow(x, L)
    qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
    got = _plan(qg).run({"x": _cl_to_lg(x)})
    np.testing.assert_array_equal(got["y"], _cl_to_lg(want))


def _conv(rng, name, src, dst, cin, cout, k, extreme, pads=None, stride=(1, 1)):
    qw = _weights(rng, (cout, cin, k[0], k[1]))
    if extreme:
        qw[:] = np.where(rng.random(qw.shape) < 0.8, 127, -127).astype(np.int8)
    m, nn = _requant_params(rng, cout, cin * k[0] * k[1])
    zx, zy = (int(rng.choice([-128, 127, 0, rng.integers(-128, 128)])) for _ in range(2))
    lo, hi = _clamp(rng, zy)
    if pads is None:
        pads = (int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1))) * 2
    return QConv(name, src, dst, qw, rng.integers(-2**20, 2**20, cout).astype(np.int32), m, nn,
                 zx, zy, lo, hi, stride, pads, (1, 1), 1)


@st.composite
def chain(draw):
    """conv -> maxpool -> conv -> (global) average pool -> reshape -> gemm -> gemm."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 2))
    c0, c1, c2 = (draw(st.integers(1, 40)) for _ in range(3))
    h, w = draw(st.integers(5, 12)), draw(st.integers(7, 16))
    one_d = draw(st.booleans())                         # [N, C, 1, L], as eeg-seizure
    if one_d:
        h = 1
    k1 = (1, draw(st.sampled_from([1, 3, 7]))) if one_d else draw(st.sampled_from([(1, 1), (3, 3), (5, 5)]))
    extreme = draw(st.booleans())
    layers = [_conv(rng, "c1", "x", "a", c0, c1, k1, extreme,
                    stride=(1 if one_d else draw(st.integers(1, 2)), draw(st.integers(1, 2))))]
    shapes = {"x": (n, c0, h, w)}
    x_cl = np.zeros((n, h, w, c0), np.int8)
    a = G.qconv_int_slow(x_cl, layers[0])
    shapes["a"] = _cl_to_lg(a).shape
    pk = tuple(2 if d >= 2 else 1 for d in a.shape[1:3])
    p1 = QMaxPool("p1", "a", "b", pk, pk, (0, 0, 0, 0), (1, 1),
                  tuple(int(d % p) for d, p in zip(a.shape[1:3], pk)))
    b = R.qmaxpool_int(a, p1)
    layers.append(p1)
    shapes["b"] = _cl_to_lg(b).shape
    k2 = (1, 3) if one_d else (3, 3)
    c2l = _conv(rng, "c2", "b", "c", c1, c2, k2, extreme, pads=(0, 1, 0, 1) if one_d else (1, 1, 1, 1))
    layers.append(c2l)
    cc = G.qconv_int_slow(b, c2l)
    shapes["c"] = _cl_to_lg(cc).shape
    # a network the plan takes (at most PLAN_MAX_MACS; e.g. 2 x 12 x 11 x 27 x 5 x 5 x 40 is
    # more, and the workers' layer-parallel pool runs such a network instead)
    assume(a.size * c0 * k1[0] * k1[1] + cc.size * c1 * k2[0] * k2[1] <= NP.PLAN_MAX_MACS // 2)
    _, hc, wc, _ = cc.shape
    m = rng.integers(2**14, 2**15, (1, 1)).astype(np.int32)
    nn = rng.integers(14, 22, (1, 1)).astype(np.int32)
    zy = int(rng.integers(-128, 128))
    lo, hi = _clamp(rng, zy)
    layers.append(QAvgPool("gap", "c", "d", (hc, wc), (1, 1), (0, 0, 0, 0), (1, 1), (0, 0), 0,
                           np.full((1, 1), hc * wc, np.int32), m, nn, int(rng.integers(-128, 128)),
                           zy, lo, hi, is_global=True))
    shapes["d"] = (n, c2, 1, 1)
    layers.append(QLayout("flat", "reshape", "d", "e", (n, c2)))
    shapes["e"] = (n, c2)
    for name, src, dst, kin in (("f1", "e", "f", c2), ("f2", "f", "y", None)):
        nout = draw(st.integers(1, 20))
        kin = kin or shapes[src][1]
        qw = _weights(rng, (nout, kin))
        mg, ng = _requant_params(rng, nout, kin)
        zx2, zy2 = (int(rng.integers(-128, 128)) for _ in range(2))
        lo2, hi2 = _clamp(rng, zy2)
        layers.append(QGemm(name, src, dst, qw, rng.integers(-2**16, 2**16, nout).astype(np.int32),
                            mg, ng, zx2, zy2, lo2, hi2))
        shapes[dst] = (n, nout)
    qg = QuantizedGraph("chain", [TensorInfo("x", shapes["x"])], [TensorInfo("y", shapes["y"]),
                        TensorInfo("c", shapes["c"])], layers, {}, shapes)
    x = _int8(rng, shapes["x"])
    if extreme:
        x[:] = np.where(rng.random(x.shape) < 0.7, 127, -128).astype(np.int8)
    return qg, x


@pytest.mark.parametrize("engine", GEMMS)
@SETTINGS
@given(case=chain())
def test_plan_chain_equals_reference(engine, case):
    qg, x = case
    want = R.run_reference(qg, {"x": x})
    plan = _plan(qg, engine)
    for _ in range(2):                  # the buffers are bound once: a second run too
        got = plan.run({"x": x})
        assert set(got) == {"y", "c"}
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    got["y"][:] = 0                     # the outputs are the caller's, not the buffers
    np.testing.assert_array_equal(plan.run({"x": x})["y"], want["y"])
    # through the workers, whatever the thread count and pool
    for threads, pool in ((1, "threads"), (2, "processes")):
        with W.CpuWorkers(qg, threads=threads, options=Options(pool=pool)) as w:
            assert w._plan is not None and w._pp[0] is None
            np.testing.assert_array_equal(w.run({"x": x})["y"], want["y"])
            assert "small-network plan" in w.engine_report()["c1"]["plan"]


def test_plan_refusals_name_the_reason():
    rng = np.random.default_rng(1)
    x = _int8(rng, (1, 5, 5, 4))
    L = _conv(rng, "c", "x", "y", 4, 6, (3, 3), False)
    want = G.qconv_int_slow(x, L)
    qg = _graph(L, {"x": _cl_to_lg(x).shape}, _cl_to_lg(want).shape)
    assert NP.NetPlan.build(qg, Options(numba=False)) == (None, "numba is missing or turned off")
    big = _conv(rng, "c", "x", "y", 64, 64, (3, 3), False)
    qg_big = _graph(big, {"x": (1, 64, 40, 40)}, (1, 64, 40, 40))
    plan, why = NP.NetPlan.build(qg_big, Options())
    assert plan is None and f"more than {NP.PLAN_MAX_MACS} MACs" in why
    add = QEltwise("s", "add", ["x", "x"], "y", np.array([3, 5]), np.array([0, 1]), 2**14, 16, 0, -128, 127)
    qg_add = _graph(add, {"x": (1, 4, 5, 5)}, (1, 4, 5, 5))
    plan, why = NP.NetPlan.build(qg_add, Options())
    assert plan is None and "op 'add'" in why
    with W.CpuWorkers(qg_add, threads=1) as w:
        assert w._plan is None and "plan" not in w.engine_report()["s"]
    with W.CpuWorkers(qg, threads=1, options=Options(net_plan=False)) as w:
        assert w._plan is None
    assert Options.from_env({"DNNFAB_NET_PLAN": "0"}).net_plan is False

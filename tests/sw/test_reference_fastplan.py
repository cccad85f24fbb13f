"""The compiled executor (reference.FastPlan, used by run_reference without an observer)
and its integer requantize (reference.Requant32) are bit-identical to the plain
layer-by-layer reference and to the literal contract formula.

* every tensor the plan produces equals the layer-by-layer executor's, on randomized
  ShuffleNet and SqueezeNet (fused channel shuffles, onnxruntime float depthwise/first
  convs, table add/concat) with both GEMM engines, and on all hand-built op models;
* Requant32 equals ``ir.qgraph.requantize`` on random parameters (n in [1, 44], narrow
  and single-value clamps, biases near the int32 limits, int32 and float32 accumulators).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dnnfab
from dnnfab.sw.cpu import reference as R
from dnnfab.sw.cpu.options import Options
from dnnfab.sw.ir.qgraph import requantize

from . import models_helper as mh


def _tensors_both_ways(q, feed, opts):
    """({name: logical int8} from the layer-by-layer executor, same from the FastPlan)."""
    fq = q.quantize_inputs(feed)
    slow = R.Env(q)
    fast = R.Env(q)
    for t in q.inputs:
        slow.put(t.name, fq[t.name], "lg")
        fast.put(t.name, fq[t.name], "lg")
    for L in q.layers:
        R.run_layer(q, slow, L, opts)
    R.fast_plan(q, opts).run(fast)
    return ({k: slow.lg(k) for k in slow.v}, {k: fast.lg(k) for k in fast.v})


def _assert_plan_equal(q, feed, opts=None):
    opts = opts or Options.from_env()
    slow, fast = _tensors_both_ways(q, feed, opts)
    for t in q.outputs:
        assert t.name in fast
    for k, v in fast.items():
        np.testing.assert_array_equal(v, slow[k], err_msg=k)
    out_fast = R.run_reference(q, q.quantize_inputs(feed), options=opts)
    out_slow = R.run_reference(q, q.quantize_inputs(feed), fast=False, options=opts)
    for k in out_slow:
        np.testing.assert_array_equal(out_fast[k], out_slow[k])
    return slow, fast


@pytest.mark.parametrize("numba", [True, False], ids=["numba", "no-numba"])
@pytest.mark.parametrize("engine", ["auto", "numpy"])
@pytest.mark.parametrize("name", ["shufflenet", "squeezenet"])
def test_fast_plan_equals_layer_by_layer_on_randomized_zoo(name, engine, numba):
    if numba and not R._K.AVAILABLE:
        pytest.skip("numba not installed (a dependency)")
    # numba=False: the plan without the fused kernels (numba missing or DNNFAB_NUMBA=0)
    opts = Options(gemm_engine=engine, numba=numba)
    g = dnnfab.load(mh.randomized(name))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, seed=5, n=2))
    for seed, gain in ((1, 1.0), (2, 6.0)):  # gain 6: many saturated codes
        feed = {k: v * np.float32(gain) for k, v in mh.input_feed(g, seed=seed).items()}
        slow, fast = _assert_plan_equal(q, feed, opts)
    plan = R.fast_plan(q, opts)
    if name == "shufflenet":  # the channel shuffles were fused into their convs
        assert len(plan.steps) < len(q.layers) - 40
        assert len(fast) < len(slow)
        if numba:  # ... and every residual add into the conv producing one of its inputs
            adds = [L for L in q.layers if L.op == "add"]
            assert adds and all(not set(L.inputs) <= set(fast) for L in adds)
            assert len(plan.steps) <= len(q.layers) - 40 - len(adds)


@pytest.mark.parametrize("name", sorted(mh.CASES))
def test_fast_plan_equals_layer_by_layer_on_op_models(name):
    g = dnnfab.load(mh.case(name))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, seed=5, n=4 * g.inputs[0].shape[0]))
    _assert_plan_equal(q, mh.input_feed(g, seed=3))


def test_fast_plan_is_cached_and_can_be_disabled():
    g = dnnfab.load(mh.case("residual_bn_concat"))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, seed=5, n=4))
    assert R.fast_plan(q) is R.fast_plan(q)
    feed = mh.input_feed(g, seed=3)
    a = q.run_int(feed, options=Options(fast_plan=False))
    b = q.run_int(feed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nlo=st.integers(1, 44), clamp=st.integers(0, 3),
       big_bias=st.booleans())
def test_requant32_equals_contract(seed, nlo, clamp, big_bias):
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 12))
    rows = int(rng.integers(1, 40))
    m = rng.integers(2**14, 2**15, c)
    m[0] = 2**14
    n = np.clip(nlo + rng.integers(0, 4, c), 1, 44)
    zy = int(rng.integers(-128, 128))
    if clamp == 0:
        lo, hi = -128, 127
    elif clamp == 1:
        lo, hi = max(-128, zy), 127  # ReLU
    elif clamp == 2:
        lo = int(rng.integers(-128, 128))
        hi = int(rng.integers(lo, 128))
    else:
        lo = hi = int(rng.integers(-128, 128))
    bias = rng.integers(-2**30, 2**30, c) if big_bias else rng.integers(-2**16, 2**16, c)
    room = 2**31 - 1 - int(np.abs(bias).max())
    acc = rng.integers(-room, room + 1, (rows, c))
    acc >>= rng.integers(0, 31, (rows, c))  # all magnitudes
    acc[0] = room
    acc[-1] = -room
    rq = R.Requant32(m, n, zy, lo, hi, bias)
    if clamp in (0, 1) and n.min() >= 15 and not big_bias:
        assert rq.ok  # multipliers <= 1 with a full or ReLU clamp never fall back
    if not rq.ok:
        return
    exact = requantize(acc + bias, m, n, zy, lo, hi)
    np.testing.assert_array_equal(rq(acc.astype(np.int32)), exact)
    np.testing.assert_array_equal(rq(acc.astype(np.int32)[None]), exact[None])
    small = acc >> 8  # float32 accumulators (exact integers < 2^24), as the float convs give
    np.testing.assert_array_equal(rq(small.astype(np.float32)),
                                  requantize(small + bias, m, n, zy, lo, hi))


@pytest.mark.parametrize("name", ["conv_depthwise", "conv_depthwise_mult", "conv_grouped",
                                  "maxpool", "conv_bn_relu"])
def test_fast_plan_without_float_convs(name, monkeypatch):
    """The numpy fallbacks the plan uses when a layer cannot go to the float Conv (and
    numba's fused kernels are not there)."""
    monkeypatch.setattr(R.FastPlan, "_float_conv_step", lambda self, *a, **k: None)
    g = dnnfab.load(mh.case(name))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, seed=5, n=4 * g.inputs[0].shape[0]))
    _assert_plan_equal(q, mh.input_feed(g, seed=3), Options(numba=False))


def test_fast_plan_shufflenet_without_float_convs(monkeypatch):
    monkeypatch.setattr(R.FastPlan, "_float_conv_step", lambda self, *a, **k: None)
    g = dnnfab.load(mh.randomized("shufflenet"))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, seed=5, n=1))
    _assert_plan_equal(q, mh.input_feed(g, seed=1), Options(numba=False))

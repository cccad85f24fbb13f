"""Property tests: the fast integer kernels equal the slow loop implementations exactly.

Random shapes (groups incl. depthwise, strides, pads, dilations), random integer
parameters (weights including +-127, zero points at -128/127, multipliers across the
whole [2^14, 2^15) x [1, 40] range, fused clamps) and int8 inputs including -128/127.
Both GEMM engines (numpy float32 BLAS and onnxruntime MatMulInteger) are checked.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dnnfab.sw.cpu import reference as R
from dnnfab.sw.cpu.options import Options
from dnnfab.sw.ref import golden as G
from dnnfab.sw.ir.qgraph import QAvgPool, QConv, QEltwise, QGemm, QMaxPool, requantize

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ENGINES = ["numpy", "ort"]


def _int8(rng, shape, extremes=True):
    x = rng.integers(-128, 128, shape).astype(np.int8)
    if extremes and x.size >= 4:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 8), replace=False)
        flat[idx] = rng.choice(np.array([-128, 127], np.int8), size=idx.size)
    return x


def _weights(rng, shape):
    w = rng.integers(-127, 128, shape).astype(np.int8)
    flat = w.reshape(-1)
    idx = rng.choice(flat.size, size=max(1, flat.size // 6), replace=False)
    flat[idx] = rng.choice(np.array([-127, 127], np.int8), size=idx.size)
    return w


def _requant_params(rng, cout, k_elems):
    m = rng.integers(2**14, 2**15, cout).astype(np.int32)
    # choose n so that outputs span the int8 range but also saturate sometimes
    base = int(np.ceil(np.log2(max(1, 128 * 127 * np.sqrt(k_elems))))) + 14 - 7
    n = np.clip(base + rng.integers(-3, 4, cout), 1, 40).astype(np.int32)
    return m, n


def _clamp(rng, zy):
    kind = rng.integers(0, 3)
    if kind == 0:
        return -128, 127
    if kind == 1:
        return max(-128, zy), 127  # ReLU
    lo = int(rng.integers(-128, 0))
    return lo, int(rng.integers(lo, 128))


@st.composite
def conv_case(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise", "depthwise_mult"]))
    g = 1
    cin = draw(st.integers(1, 6))
    if kind == "grouped":
        g = draw(st.integers(2, 3))
        cin = g * draw(st.integers(1, 3))
        cout = g * draw(st.integers(1, 3))
    elif kind == "depthwise":
        g = cin = draw(st.integers(2, 6))
        cout = cin
    elif kind == "depthwise_mult":
        g = cin = draw(st.integers(2, 4))
        cout = cin * draw(st.integers(2, 3))
    else:
        cout = draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers((kh - 1) * dh + 1, 9))
    w = draw(st.integers((kw - 1) * dw + 1, 9))
    n = draw(st.integers(1, 2))
    zx = int(draw(st.sampled_from([-128, 127, 0, int(rng.integers(-128, 128))])))
    zy = int(draw(st.sampled_from([-128, 127, 0, int(rng.integers(-128, 128))])))
    qw = _weights(rng, (cout, cin // g, kh, kw))
    m, nn = _requant_params(rng, cout, (cin // g) * kh * kw)
    bias = rng.integers(-2**20, 2**20, cout).astype(np.int32)
    lo, hi = _clamp(rng, zy)
    L = QConv("c", "x", "y", qw, bias, m, nn, zx, zy, lo, hi, (sh, sw), pads, (dh, dw), g)
    x = _int8(rng, (n, h, w, cin))
    return x, L


@pytest.mark.parametrize("engine", ENGINES)
@SETTINGS
@given(case=conv_case())
def test_qconv_fast_equals_slow(engine, case):
    x, L = case
    L.cache.clear()
    fast = R.qconv_int(x, L, Options(gemm_engine=engine))
    slow = G.qconv_int_slow(x, L)
    assert fast.dtype == np.int8 and fast.shape == slow.shape
    np.testing.assert_array_equal(fast, slow)


@st.composite
def gemm_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # K up to 2100 crosses the 1024 float32 chunk boundary of the numpy engine
    k = draw(st.sampled_from([1, 3, 17, 64, 1023, 1024, 1025, 2100]))
    nout = draw(st.integers(1, 9))
    mrows = draw(st.integers(1, 5))
    zx = int(draw(st.sampled_from([-128, 127, int(rng.integers(-128, 128))])))
    zy = int(draw(st.sampled_from([-128, 127, int(rng.integers(-128, 128))])))
    qw = _weights(rng, (nout, k))
    if draw(st.booleans()):  # worst case magnitudes
        qw[:] = 127 * (1 - 2 * draw(st.integers(0, 1)))
    m, n = _requant_params(rng, nout, k)
    bias = rng.integers(-2**24, 2**24, nout).astype(np.int32)
    lo, hi = _clamp(rng, zy)
    x = _int8(rng, (mrows, k))
    if draw(st.booleans()):
        x[:] = draw(st.sampled_from([-128, 127]))
    return x, QGemm("g", "x", "y", qw, bias, m, n, zx, zy, lo, hi)


@pytest.mark.parametrize("engine", ENGINES)
@SETTINGS
@given(case=gemm_case())
def test_qgemm_fast_equals_slow(engine, case):
    x, L = case
    L.cache.clear()
    fast = R.qgemm_int(x, L, Options(gemm_engine=engine))
    np.testing.assert_array_equal(fast, G.qgemm_int_slow(x, L))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 62),
       extreme=st.sampled_from([None, -2**31 + 1, 2**31 - 1]))
def test_requantize_fast_equals_exact(seed, n, extreme):
    rng = np.random.default_rng(seed)
    acc = rng.integers(-2**31 + 1, 2**31, (7, 5)).astype(np.int64)
    acc[0, 0] = 0
    if extreme is not None:
        acc[1] = extreme
    m = rng.integers(2**14, 2**15, 5).astype(np.int64)
    nn = np.full(5, n, np.int64)
    if 15 <= n <= 45:
        # exact ties of the rounding rule: m = 2^14 and acc = odd * 2^(n-15)
        m[0] = 2**14
        odd = 2 * int(rng.integers(0, 2 ** max(0, 45 - n))) + 1
        acc[2:4, 0] = [odd * 2 ** (n - 15), -odd * 2 ** (n - 15)]
        acc[2:4, 0] = np.clip(acc[2:4, 0], -2**31 + 1, 2**31 - 1)
    zy = int(rng.integers(-128, 128))
    lo, hi = -128, 127
    exact = requantize(acc, m, nn, zy, lo, hi)
    fast = R.requantize_fast(acc.astype(np.int32), R._mult64(m, nn), zy, lo, hi)
    np.testing.assert_array_equal(fast, exact)
    # the precomputed form, with the bias split off the accumulator
    bias = rng.integers(-2**20, 2**20, 5)
    lo2, hi2 = sorted(int(v) for v in rng.integers(-128, 128, 2))
    acc2 = np.clip(acc, -2**31 + 2**20, 2**31 - 2**20)
    exact2 = requantize(acc2, m, nn, zy, lo2, hi2)
    rq = R.Requant(m, nn, zy, lo2, hi2, bias)
    np.testing.assert_array_equal(rq((acc2 - bias).astype(np.int32)), exact2)
    np.testing.assert_array_equal(rq((acc2 - bias).astype(np.float64)), exact2)


@st.composite
def pool_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)),
            draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)))
    h, w = draw(st.integers(kh, 8)), draw(st.integers(kw, 8))
    c = draw(st.integers(1, 4))
    x = _int8(rng, (1, h, w, c))
    return rng, x, (kh, kw), (sh, sw), pads


@SETTINGS
@given(case=pool_case(), include_pad=st.booleans())
def test_qavgpool_fast_equals_slow(case, include_pad):
    from dnnfab.sw.ir.graph import pool_counts
    rng, x, k, s, pads = case
    attrs = dict(kernel=k, stride=s, pads=pads, dilation=(1, 1), extra=(0, 0),
                 count_include_pad=int(include_pad))
    cnt = pool_counts(x.shape[1], x.shape[2], attrs)
    m = rng.integers(2**14, 2**15, cnt.shape).astype(np.int32)
    n = rng.integers(14, 20, cnt.shape).astype(np.int32)
    zx, zy = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
    L = QAvgPool("p", "x", "y", k, s, pads, (1, 1), (0, 0), int(include_pad), cnt, m, n,
                 zx, zy, -128, 127)
    np.testing.assert_array_equal(R.qavgpool_int(x, L), G.qavgpool_int_slow(x, L))


@SETTINGS
@given(case=pool_case())
def test_qmaxpool_is_exact_max(case):
    _, x, k, s, pads = case
    L = QMaxPool("p", "x", "y", k, s, pads, (1, 1))
    y = R.qmaxpool_int(x, L)
    # direct definition: max over the in-bounds window elements
    for oy in range(y.shape[1]):
        for ox in range(y.shape[2]):
            y0, x0 = oy * s[0] - pads[0], ox * s[1] - pads[1]
            win = x[:, max(0, y0):y0 + k[0], max(0, x0):x0 + k[1], :]
            np.testing.assert_array_equal(y[:, oy, ox, :], win.max(axis=(1, 2)))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_in=st.integers(1, 4),
       op=st.sampled_from(["add", "concat"]))
def test_qeltwise_fast_equals_slow(seed, n_in, op):
    rng = np.random.default_rng(seed)
    if op == "add":
        n_in = max(2, n_in)
    xs = [_int8(rng, (1, 3, 4, 5)) for _ in range(n_in)]
    k = rng.integers(1, 2**20, n_in).astype(np.int32)
    z = rng.integers(-128, 128, n_in).astype(np.int32)
    m, n = int(rng.integers(2**14, 2**15)), int(rng.integers(20, 40))
    zy = int(rng.integers(-128, 128))
    L = QEltwise("e", op, [f"x{i}" for i in range(n_in)], "y", k, z, m, n, zy, -128, 127)
    fast = R.qeltwise_int(xs, L)
    slow = G.qeltwise_int_slow(xs, L)
    if op == "add":
        np.testing.assert_array_equal(fast, slow)
    else:
        for a, b in zip(fast, slow):
            np.testing.assert_array_equal(a, b)

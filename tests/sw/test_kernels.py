"""The fused numba kernels (dnnfab.sw.cpu.kernels) equal the literal contract and the slow
loop implementations exactly, through the same plumbing FastPlan uses.

* RequantK (requant_rows): random m in [2^14, 2^15), n in [1, 44], accumulators and biases
  near the int32 limits, int32/float32/float64 accumulators, narrow clamps, a permutation
  of the output channels;
* RequantK.add (requant_add): conv requantize + residual add vs requantize followed by
  qeltwise_int_slow, the conv on either side of the add;
* FastPlan._dw_step (dwconv): random depthwise convs (stride, dilation, asymmetric pads,
  zero points -128/127) vs qconv_int_slow;
* FastPlan._avgpool_step (avgpool): random pools incl. padding and ceil-mode extra rows,
  and global pooling, vs qavgpool_int_slow;
* lut1 / lut2 vs np.take;
* the float64 requantize kernels (``*_f``, the CPU workers' form) vs the int64 ones.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnfab.sw.cpu import kernels as K
from dnnfab.sw.cpu import reference as R
from dnnfab.sw.ref import golden as G
from dnnfab.sw.ir.qgraph import QAvgPool, QConv, QEltwise, requantize

from .test_reference_props import SETTINGS, _clamp, _int8, _requant_params, _weights

pytestmark = pytest.mark.skipif(not K.AVAILABLE, reason="numba not installed (a dependency)")


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(["int32", "float32", "float64"]),
       permute=st.booleans())
def test_requant_kernel_equals_contract(seed, dtype, permute):
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 9))
    rows = int(rng.integers(1, 40))
    m = rng.integers(2**14, 2**15, c)
    n = rng.integers(1, 45, c)
    lim = 2**24 if dtype == "float32" else 2**31 - 1     # float32 holds integers < 2^24
    acc = rng.integers(-lim, lim + 1, (rows, c), dtype=np.int64)
    acc[0] = lim
    acc[-1] = -lim
    bias = rng.integers(-2**31, 2**31, c) if dtype != "float32" else rng.integers(-2**23, 2**23, c)
    if rng.integers(0, 2):
        bias //= 2**20                                     # small biases: ties reachable
    # exact ties of the rounding inside the output range, (acc + bias) * m = odd * 2^(n-1)
    # with a small result: needs m = m_odd * 2^t with small m_odd (e.g. m = 2^14)
    for j in range(0, c, 2):
        m_odd = 2 * int(rng.integers(0, 16)) + 1
        t = 14 - (m_odd.bit_length() - 1)
        m[j] = m_odd << t
        n[j] = int(rng.integers(t + 1, t + 18))
        for row, sign in ((1 % rows, 1), (2 % rows, -1)):
            q = 2 * int(rng.integers(0, max(1, 120 // m_odd))) + 1
            a = sign * q * 2**(int(n[j]) - 1 - t)
            if abs(a - int(bias[j])) <= lim:
                acc[row, j] = a - int(bias[j])
    zy = int(rng.choice([-128, 127, int(rng.integers(-128, 128))]))
    lo, hi = _clamp(rng, zy)
    if rng.integers(0, 2):
        lo, hi = -128, 127
    dst = rng.permutation(c) if permute else None
    rq = R.RequantK(m, n, zy, lo, hi, bias, dst)
    got = rq(acc.astype(dtype))
    want = requantize(acc + bias, m, n, zy, lo, hi)
    if dst is not None:
        perm_want = np.empty_like(want)
        perm_want[:, dst] = want
        want = perm_want
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), first=st.booleans(), permute=st.booleans())
def test_requant_add_kernel_equals_requantize_then_add(seed, first, permute):
    rng = np.random.default_rng(seed)
    c, rows = int(rng.integers(1, 9)), int(rng.integers(1, 30))
    m, n = _requant_params(rng, c, 64)
    acc = rng.integers(-2**22, 2**22, (rows, c)).astype(np.int32)
    bias = rng.integers(-2**20, 2**20, c)
    zy = int(rng.integers(-128, 128))
    lo, hi = _clamp(rng, zy)
    other = _int8(rng, (rows, c))
    k = rng.integers(1, 2**20, 2).astype(np.int32)
    z = rng.choice(np.array([-128, 127, int(rng.integers(-128, 128))]), 2).astype(np.int32)
    azy = int(rng.integers(-128, 128))
    alo, ahi = _clamp(rng, azy)
    add = QEltwise("a", "add", ["y", "o"] if first else ["o", "y"], "s", k, z,
                   int(rng.integers(2**14, 2**15)), int(rng.integers(20, 40)), azy, alo, ahi)
    dst = rng.permutation(c) if permute else None
    y = requantize(acc.astype(np.int64) + bias, m, n, zy, lo, hi)
    if dst is not None:
        yp = np.empty_like(y)
        yp[:, dst] = y
        y = yp
    want = G.qeltwise_int_slow([y, other] if first else [other, y], add)
    got = R.RequantK(m, n, zy, lo, hi, bias, dst).add(acc, other, add, first)
    np.testing.assert_array_equal(got, want)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(["int32", "float32", "float64"]),
       first=st.booleans())
def test_float64_requant_kernels_equal_int64(seed, dtype, first):
    """requant_rows_f / _perm_f / requant_add_f / _perm_f (the float64 form) equal the
    int64 kernels bit for bit whenever rq_float_params accepts the bound, on accumulators
    at the bound, exact rounding ties and narrow clamps; beyond 2^52 it refuses."""
    rng = np.random.default_rng(seed)
    c, rows = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    m = rng.integers(2**14, 2**15, c)
    n = rng.integers(1, 45, c)
    lim = 2**24 if dtype == "float32" else 2**31 - 1
    acc = rng.integers(-lim, lim + 1, (rows, c), dtype=np.int64)
    acc[0], acc[-1] = lim, -lim
    bias = rng.integers(-2**20, 2**20, c)
    for j in range(c):                        # ties: (acc + bias) * m = odd * 2^(n-1)
        t = int(m[j] & -m[j]).bit_length() - 1     # m = odd * 2^t
        v = 2**max(int(n[j]) - 1 - t, 0) - int(bias[j])
        if int(n[j]) - 1 >= t and abs(v) <= lim:
            acc[rows // 2, j] = v
    vmax = int(np.abs(acc + bias).max())
    p = K.rq_float_params(bias, m, n, vmax)
    assert p is not None                      # 2^31 * 2^15 + 2^43 < 2^52
    assert K.rq_float_params(bias, m * 2**16, n, 2**31) is None
    zy = int(rng.choice([-128, 127, int(rng.integers(-128, 128))]))
    lo, hi = _clamp(rng, zy)
    fz = (float(zy), float(lo), float(hi))
    a = acc.astype(dtype)
    want, got = np.empty((rows, c), np.int8), np.empty((rows, c), np.int8)
    K.requant_rows(a, bias, m, n, zy, lo, hi, want)
    K.requant_rows_f(a, *p, *fz, got)
    np.testing.assert_array_equal(got, want)
    src = rng.permutation(c).astype(np.int64)
    K.requant_rows_perm(a, bias, m, n, zy, lo, hi, src, want)
    K.requant_rows_perm_f(a, *p, *fz, src, got)
    np.testing.assert_array_equal(got, want)
    other = _int8(rng, (rows, c))
    addp = (first, int(rng.integers(1, 2**20)), int(rng.integers(-128, 128)),
            int(rng.integers(1, 2**20)), int(rng.integers(-128, 128)),
            int(rng.integers(2**14, 2**15)), int(rng.integers(20, 40)),
            int(rng.integers(-128, 128)), -128, 127)
    K.requant_add(a, bias, m, n, zy, lo, hi, other, *addp, want)
    K.requant_add_f(a, *p, *fz, other, *addp, got)
    np.testing.assert_array_equal(got, want)
    K.requant_add_perm(a, bias, m, n, zy, lo, hi, src, other, *addp, want)
    K.requant_add_perm_f(a, *p, *fz, src, other, *addp, got)
    np.testing.assert_array_equal(got, want)


@st.composite
def dw_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c = draw(st.integers(1, 20))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    h = draw(st.integers(max(1, (kh - 1) * dh + 1 - pads[0] - pads[2]), 11))
    w = draw(st.integers(max(1, (kw - 1) * dw + 1 - pads[1] - pads[3]), 11))
    nb = draw(st.integers(1, 2))
    zx = int(draw(st.sampled_from([-128, 127, 0, int(rng.integers(-128, 128))])))
    zy = int(draw(st.sampled_from([-128, 127, int(rng.integers(-128, 128))])))
    qw = _weights(rng, (c, 1, kh, kw))
    if draw(st.booleans()):
        qw[:] = 127 * (1 - 2 * draw(st.integers(0, 1)))
    m, n = _requant_params(rng, c, kh * kw)
    bias = rng.integers(-2**20, 2**20, c).astype(np.int32)
    lo, hi = _clamp(rng, zy)
    L = QConv("c", "x", "y", qw, bias, m, n, zx, zy, lo, hi, (sh, sw), pads, (dh, dw), c)
    x = _int8(rng, (nb, h, w, c))
    if draw(st.booleans()):
        x[:] = draw(st.sampled_from([-128, 127]))
    return x, L


@SETTINGS
@given(case=dw_case())
def test_dwconv_kernel_equals_slow(case):
    x, L = case
    want = G.qconv_int_slow(x, L)
    step = R.FastPlan._dw_step(L, want.shape)
    env = R.Env(None)
    env.put("x", x, "cl")
    step(env)
    got, lay = env.v["y"]
    assert lay == "cl" and got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


class _Shapes:
    """The slice of a QuantizedGraph that FastPlan's step builders read."""

    def __init__(self, **shapes):
        self.shapes = shapes

    def shape(self, name):
        return self.shapes[name]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), include_pad=st.booleans(), ceil=st.booleans(),
       is_global=st.booleans())
def test_avgpool_kernel_equals_slow(seed, include_pad, ceil, is_global):
    from dnnfab.sw.ir.graph import pool_counts
    rng = np.random.default_rng(seed)
    h, w, c = int(rng.integers(1, 9)), int(rng.integers(1, 9)), int(rng.integers(1, 6))
    if is_global:
        k, s, pads, extra = (h, w), (1, 1), (0, 0, 0, 0), (0, 0)
    else:
        k = (int(rng.integers(1, min(h, 3) + 1)), int(rng.integers(1, min(w, 3) + 1)))
        s = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        pads = (int(rng.integers(0, k[0])), int(rng.integers(0, k[1])),
                int(rng.integers(0, k[0])), int(rng.integers(0, k[1])))
        extra = (int(ceil and s[0] > 1), int(ceil and s[1] > 1))
    attrs = dict(kernel=k, stride=s, pads=pads, dilation=(1, 1), extra=extra,
                 count_include_pad=int(include_pad))
    cnt = pool_counts(h, w, attrs)
    m = rng.integers(2**14, 2**15, cnt.shape).astype(np.int32)
    n = rng.integers(14, 22, cnt.shape).astype(np.int32)
    zx, zy = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
    lo, hi = _clamp(rng, zy)
    L = QAvgPool("p", "x", "y", k, s, pads, (1, 1), extra, int(include_pad), cnt, m, n,
                 zx, zy, lo, hi, is_global=is_global)
    x = _int8(rng, (1, h, w, c))
    want = G.qavgpool_int_slow(x, L)
    plan = object.__new__(R.FastPlan)
    plan.qg = _Shapes(x=(1, c, h, w))
    step = plan._avgpool_step(L)
    env = R.Env(None)
    env.put("x", x, "cl")
    step(env)
    np.testing.assert_array_equal(env.v["y"][0], want)


def test_lut_kernels_equal_take():
    rng = np.random.default_rng(3)
    a, b = _int8(rng, (7, 5, 3)), _int8(rng, (7, 5, 3))
    t2 = rng.integers(-128, 128, 65536).astype(np.int8)
    t1 = t2[:256].copy()
    out = np.empty(a.size, np.int8)
    K.lut2(a.reshape(-1), b.reshape(-1), t2, out)
    idx = a.view(np.uint8).astype(np.int64) * 256 + b.view(np.uint8)
    np.testing.assert_array_equal(out, t2[idx.reshape(-1)])
    np.testing.assert_array_equal(R._lut1(a, t1), np.take(t1, a.view(np.uint8)))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), edge=st.booleans())
def test_scale_rq_kernel_equals_contract_up_to_its_bound(seed, edge):
    """``scale_rq_rows_f`` (a 1x1 depthwise conv in float64) equals the contract's int64
    requantize of ``x * w + bias`` on every int8 code and extreme weights, biases and
    multipliers; ``edge``: the multiplier is the largest for which ``scale_rq_params``
    still gives parameters (one more and it returns None)."""
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 24))
    w = rng.choice([-128, -127, 127, 0, 1, -1], c).astype(np.int64)
    mix = rng.random(c) < 0.5
    w[mix] = rng.integers(-128, 128, int(mix.sum()))
    bias = rng.integers(-2**24, 2**24, c).astype(np.int64)
    n = rng.integers(1, 48, c).astype(np.int64)
    vmax = 128 * int(np.abs(w).max()) + int(np.abs(bias).max())
    limit = int((2.0 ** 52 - 2.0 ** (int(n.max()) - 1)) // max(vmax, 1))     # |m| below this
    if edge:
        m = np.full(c, limit - 1, np.int64) * rng.choice([-1, 1], c)
        for mm in range(limit - 1, limit + 3):
            if K.scale_rq_params(w, bias, np.full(c, mm), n) is None:
                break
            m[:] = mm
        assert K.scale_rq_params(w, bias, np.full(c, mm), n) is None
    else:
        m = rng.integers(-min(limit, 2**31) + 1, min(limit, 2**31), c).astype(np.int64)
    p = K.scale_rq_params(w, bias, m, n)
    assert p is not None
    zy = int(rng.choice([-128, 127, 0, -5]))
    lo, hi = _clamp(rng, zy)
    x = np.tile(np.arange(-128, 128, dtype=np.int8)[:, None], (1, c))
    got = K.scale_rq_rows_f(x, *p, float(zy), float(lo), float(hi), 0, 256, np.empty_like(x))
    want = requantize(x.astype(np.int64) * w + bias, m, n, zy, lo, hi)
    np.testing.assert_array_equal(got, want)

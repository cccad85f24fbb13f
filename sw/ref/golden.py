"""The golden integer kernels: the contract (docs/contract.md) written out literally, loops
with int64 arithmetic and :func:`~dnnfab.sw.ir.qgraph.requantize`, one output at a time.

Slow on purpose: the property tests pin the fast exact kernels of :mod:`dnnfab.sw.cpu`
(BLAS, onnxruntime MatMulInteger, numba), which every network run uses, down to these.
Layout as there: channel-last int8 arrays (NHWC; 1-D layers use H = 1).
"""

from __future__ import annotations

import numpy as np

from ..ir.qgraph import requantize


def pool_geom(L, x):
    kh, kw = L.kernel
    t, l, b, r = L.pad
    eb, er = L.extra
    h, w = x.shape[1] + t + b + eb, x.shape[2] + l + r + er
    ho = (h - (kh - 1) * L.dilation[0] - 1) // L.stride[0] + 1
    wo = (w - (kw - 1) * L.dilation[1] - 1) // L.stride[1] + 1
    return (t, l, b + eb, r + er), ho, wo


def qconv_int_slow(x, L):
    """Literal contract of the fast :func:`dnnfab.sw.cpu.reference.qconv_int`, with int64 arithmetic (for tests)."""
    cout, cig, kh, kw = L.qweight.shape
    n_, h, w, cin = x.shape
    t, l, b, r = L.pad
    sh, sw = L.stride
    dh, dw = L.dilation
    ho = (h + t + b - (kh - 1) * dh - 1) // sh + 1
    wo = (w + l + r - (kw - 1) * dw - 1) // sw + 1
    xp = np.full((n_, h + t + b, w + l + r, cin), L.zx, np.int64)
    xp[:, t:t + h, l:l + w, :] = x
    wq = L.qweight.astype(np.int64)
    cog = cout // L.groups
    y = np.zeros((n_, ho, wo, cout), np.int8)
    for bi in range(n_):
        for oy in range(ho):
            for ox in range(wo):
                for co in range(cout):
                    g = co // cog
                    acc = int(L.bias[co])
                    for ci in range(cig):
                        for i in range(kh):
                            for j in range(kw):
                                acc += int(xp[bi, oy * sh + i * dh, ox * sw + j * dw,
                                              g * cig + ci]) * int(wq[co, ci, i, j])
                    assert abs(acc) < 2**31
                    y[bi, oy, ox, co] = requantize(acc, int(L.m[co]), int(L.n[co]), L.zy,
                                                   L.lo, L.hi)
    return y


def qgemm_int_slow(x, L):
    """Literal contract of the fast :func:`dnnfab.sw.cpu.reference.qgemm_int` (int64, literal contract)."""
    mrows, k = x.shape
    nout = L.qweight.shape[0]
    y = np.zeros((mrows, nout), np.int8)
    w = L.qweight.astype(np.int64)
    for i in range(mrows):
        xi = x[i].astype(np.int64)
        for o in range(nout):
            acc = int(L.bias[o]) + int(sum(int(a) * int(b) for a, b in zip(xi, w[o])))
            assert abs(acc) < 2**31
            y[i, o] = requantize(acc, int(L.m[o]), int(L.n[o]), L.zy, L.lo, L.hi)
    return y


def qavgpool_int_slow(x, L):
    pads, ho, wo = pool_geom(L, x)
    t, l = pads[0], pads[1]
    n_, h, w, c = x.shape
    y = np.zeros((n_, ho, wo, c), np.int8)
    for oy in range(ho):
        for ox in range(wo):
            acc = np.zeros((n_, c), np.int64)
            for i in range(L.kernel[0]):
                for j in range(L.kernel[1]):
                    yy = oy * L.stride[0] + i * L.dilation[0] - t
                    xx = ox * L.stride[1] + j * L.dilation[1] - l
                    if 0 <= yy < h and 0 <= xx < w:
                        acc += x[:, yy, xx, :].astype(np.int64) - L.zx
            y[:, oy, ox, :] = requantize(acc, int(L.m[oy, ox]), int(L.n[oy, ox]), L.zy,
                                         L.lo, L.hi)
    return y


def qeltwise_int_slow(xs, L):
    if L.op == "add":
        acc = sum((x.astype(np.int64) - int(z)) * int(k) for x, k, z in zip(xs, L.k, L.z))
        return requantize(acc, L.m, L.n, L.zy, L.lo, L.hi)
    return [requantize((x.astype(np.int64) - int(z)) * int(k), L.m, L.n, L.zy, L.lo, L.hi)
            for x, k, z in zip(xs, L.k, L.z)]

"""Fused integer kernels of the reference network, compiled with numba.

The integer reference (:mod:`dnnfab.sw.cpu.reference`) spends its time in two kinds of work:
big GEMMs (onnxruntime ``MatMulInteger`` / float32 BLAS, already near peak) and many
passes over activation-sized arrays (requantize, depthwise taps, table lookups), each a
separate numpy call. The kernels here do each of the latter in **one pass**, in the
literal int64 arithmetic of the contract (docs/contract.md; no floating point, so
exactness needs no argument). They run single-threaded: numba's parallel loops, measured
with 2 threads next to onnxruntime's pool on the same 2 cores, made ShuffleNet ~1.8x
*slower* (pool hand-offs of 50-100 us layers), so the GEMMs keep the threads:

* :func:`requant_rows` -- ``y = clamp(zy + (((acc + bias) * m + 2^(n-1)) >> n), lo, hi)``
  per channel, on int32 or exact-integer float32 accumulators;
* :func:`requant_add` -- the same, followed by the residual add that consumes the conv
  (ResNet/ShuffleNet blocks), without writing the conv's output; ``*_perm`` variants
  permute the output channels (a fused channel shuffle);
* :func:`dwconv` -- depthwise convolution (zero-point padding, stride, dilation) with the
  requantize fused, channel-last;
* :func:`avgpool` -- window sums of ``q - zx`` with a per-position requantize (count
  varies at padded borders), channel-last; global pooling is the full-window case;
* :func:`lut2` / :func:`lut1` -- residual add / rescale through the precomputed
  65536- / 256-entry tables of :class:`~dnnfab.sw.cpu.reference.FastPlan`.

The ``*_rows`` / ``*_range`` kernels are the slices the CPU worker pool
(:mod:`dnnfab.sw.cpu.workers`) runs on its threads: the same arithmetic on output rows
``[oy0, oy1)`` (or a flat range), writing into a shared output array; all are ``nogil``,
so slices of one layer and independent layers really run at once:

* :func:`dwconv_rows`, :func:`avgpool_rows` -- depthwise conv and average pool on a band
  of output rows;
* :func:`lut1_range`, :func:`lut2_range` -- the table lookups on ``[i0, i1)``;
  :func:`lut1_rows` -- one table into a strided 2-D destination.

``AVAILABLE`` is False when numba is missing; the reference then (and with
``Options(numba=False)``, e.g. from ``DNNFAB_NUMBA=0``) uses its numpy kernels (same results, slower). Compiled code is cached on disk by numba
(``cache=True``), so only the first run on a machine pays the ~10 s of compilation.
"""

from __future__ import annotations

import numpy as np

__all__ = ["AVAILABLE", "plan_prod_f32", "plan_scatter", "plan_gather_u8", "plan_finish", "requant_rows", "requant_wrap_rows", "requant_rows_perm", "requant_add", "requant_add_perm",
           "dwconv", "avgpool", "lut1", "lut2", "dwconv_rows",
           "avgpool_rows", "lut1_range", "lut1_rows", "scale_rq_rows_f", "lut2_range", "lrn_rows", "rq_float_params", "requant_rows_f",
           "requant_rows_perm_f", "requant_add_f", "requant_add_perm_f",
           "conv_rq_dot", "gemm_rq_dot", "maxpool_cl", "maxpool_rows", "im2col_u8"]

try:
    import numba  # noqa: F401
    from numba import njit
    AVAILABLE = True
except ImportError:  # pragma: no cover - numba is a dependency
    AVAILABLE = False


if AVAILABLE:
    _jit = dict(cache=True, nogil=True, error_model="numpy")

    @njit(inline="always")
    def _rq(a, m, n, zy, lo, hi):
        y = ((a * m + (np.int64(1) << (n - 1))) >> n) + zy
        return min(max(y, lo), hi)

    @njit(**_jit)
    def requant_rows(acc, bias, m, n, zy, lo, hi, out):
        """acc [rows, C] (int32/int64, or float32/64 holding exact integers); bias, m, n
        int64 [C]; out int8 [rows, C]."""
        rows, c = acc.shape
        for i in range(rows):
            for j in range(c):
                out[i, j] = _rq(np.int64(acc[i, j]) + bias[j], m[j], n[j], zy, lo, hi)
        return out

    @njit(**_jit)
    def requant_wrap_rows(acc, bias, m, n, zy, lo, hi, out):
        """The accelerator's finish of a product: ``acc + bias`` wrapped to int32 (the
        accumulator's two's-complement width), then requantized. ``acc`` [rows, C] holds
        exact integers (float32/64 or ints); bias, m, n int64 [C]; out int8 [rows, C]."""
        rows, c = acc.shape
        for i in range(rows):
            for j in range(c):
                v = np.int64(acc[i, j]) + bias[j]
                v = ((v + np.int64(2147483648)) & np.int64(4294967295)) - np.int64(2147483648)
                out[i, j] = _rq(v, m[j], n[j], zy, lo, hi)
        return out

    @njit(inline="always")
    def _plan_gather(dram, words, idx, haspad, padv, A8):
        """im2col of R-byte DRAM rows ``dram[idx]`` into int8 ``A8`` (flat, P*KR*R); where
        ``haspad``, entries with ``padv != 256`` are the zero point ``padv``; ``words``: the
        same DRAM as uint64 [rows, R / 8] when R is a multiple of 8 (a word at a time),
        else an empty array."""
        P, KR = idx.shape
        R = dram.shape[1]
        if words.shape[0] > 0:
            nw = words.shape[1]
            A64 = A8.view(np.uint64)
            i = 0
            for p in range(P):
                for k in range(KR):
                    if haspad and padv[p, k] != 256:
                        z = np.int8(padv[p, k])
                        for r in range(R):
                            A8[i * 8 + r] = z
                        i += nw
                    else:
                        row = idx[p, k]
                        for w in range(nw):
                            A64[i] = words[row, w]
                            i += 1
        else:
            i = 0
            for p in range(P):
                for k in range(KR):
                    pad = haspad and padv[p, k] != 256
                    for r in range(R):
                        A8[i] = np.int8(padv[p, k]) if pad else dram[idx[p, k], r]
                        i += 1

    @njit(inline="always")
    def _plan_finish(acc, bias, m, n, zy, lo, hi, out, out_rows):
        """``requantize(wrap32(acc + bias))`` of acc [P, tiles*C] scattered to the output
        scratchpad rows ``out[out_rows[p, t], :]`` (int8 [rows, C])."""
        C = out.shape[1]
        for p in range(acc.shape[0]):
            for t in range(out_rows.shape[1]):
                o = out_rows[p, t]
                for c in range(C):
                    j = t * C + c
                    v = np.int64(acc[p, j]) + bias[j]
                    v = ((v + np.int64(2147483648)) & np.int64(4294967295)) - np.int64(2147483648)
                    out[o, c] = _rq(v, m[j], n[j], zy, lo, hi)

    @njit(**_jit)
    def plan_prod_f32(dram, words, idx, haspad, padv, W, bias, m, n, zy, lo, hi, out, out_rows):
        """One small product of the fast model's traced plan (dnnfab.sw.driver.fastplan), in
        one call: the gather (:func:`_plan_gather`), the product with ``W`` (float32
        [K, tiles*C]: exact integers while K <= 1024, every partial sum below 2^24), the
        finish and scatter (:func:`_plan_finish`)."""
        P, KR = idx.shape
        R = dram.shape[1]
        A8 = np.empty(P * KR * R, np.int8)
        _plan_gather(dram, words, idx, haspad, padv, A8)
        A = np.empty((P, KR * R), np.float32)
        Af = A.reshape(-1)
        for j in range(Af.size):
            Af[j] = A8[j]
        _plan_finish(np.dot(A, W), bias, m, n, zy, lo, hi, out, out_rows)

    @njit(**_jit)
    def plan_gather_u8(dram, words, idx, haspad, padv):
        """The gather of :func:`plan_prod_f32` as uint8 codes + 128 [P, K] (onnxruntime's
        u8 x u8 operand)."""
        P, KR = idx.shape
        R = dram.shape[1]
        A8 = np.empty(P * KR * R, np.int8)
        _plan_gather(dram, words, idx, haspad, padv, A8)
        U = A8.view(np.uint8)
        for j in range(U.size):
            U[j] ^= np.uint8(0x80)
        return U.reshape(P, KR * R)

    @njit(**_jit)
    def plan_finish(acc, bias, m, n, zy, lo, hi, out, out_rows):
        """:func:`_plan_finish` as a call (the products onnxruntime computes)."""
        _plan_finish(acc, bias, m, n, zy, lo, hi, out, out_rows)

    @njit(**_jit)
    def plan_scatter(out, rows, buf, r0):
        """``out[rows[p, t], :] = buf[(r0 + p) * tiles + t, :]``: a hoisted band's rows of
        the output scratchpad (int8 [n, C]) from its product's buffer (int8 [m, C])."""
        tiles = rows.shape[1]
        C = out.shape[1]
        for p in range(rows.shape[0]):
            for t in range(tiles):
                o = rows[p, t]
                i = (r0 + p) * tiles + t
                for c in range(C):
                    out[o, c] = buf[i, c]

    @njit(**_jit)
    def requant_rows_perm(acc, bias, m, n, zy, lo, hi, src, out):
        """:func:`requant_rows` with the output channels permuted (a fused channel
        shuffle): ``out[:, k] = rq(acc[:, src[k]])``. Each row is requantized into a
        buffer first: a scatter/gather inside the arithmetic loop stops vectorization
        (measured 10x slower)."""
        rows, c = acc.shape
        tmp = np.empty(c, np.int64)
        for i in range(rows):
            _rq_row(acc, i, bias, m, n, zy, lo, hi, tmp)
            for k in range(c):
                out[i, k] = tmp[src[k]]
        return out

    @njit(inline="always")
    def _rq_row(acc, i, bias, m, n, zy, lo, hi, tmp):
        """Row ``i`` of ``acc`` requantized into the buffer ``tmp`` (the permuted kernels)."""
        for j in range(acc.shape[1]):
            tmp[j] = _rq(np.int64(acc[i, j]) + bias[j], m[j], n[j], zy, lo, hi)

    @njit(inline="always")
    def _add(y, o, first, k0, z0, k1, z1, am, an, azy, alo, ahi):
        if first:
            s = (y - z0) * k0 + (o - z1) * k1
        else:
            s = (o - z0) * k0 + (y - z1) * k1
        return _rq(s, am, an, azy, alo, ahi)

    @njit(**_jit)
    def requant_add(acc, bias, m, n, zy, lo, hi, other, first, k0, z0, k1, z1,
                    am, an, azy, alo, ahi, out):
        """A conv's requantize followed by the residual add that is its only consumer:
        ``y = rq(acc + bias)`` per channel, then ``out = rq_add((a - z0) k0 + (b - z1) k1)``
        with (a, b) = (y, other) if ``first`` else (other, y). other, out int8 [rows, C]."""
        rows, c = acc.shape
        for i in range(rows):
            for j in range(c):
                y = _rq(np.int64(acc[i, j]) + bias[j], m[j], n[j], zy, lo, hi)
                out[i, j] = _add(y, np.int64(other[i, j]), first, k0, z0, k1, z1,
                                 am, an, azy, alo, ahi)
        return out

    @njit(**_jit)
    def requant_add_perm(acc, bias, m, n, zy, lo, hi, src, other, first, k0, z0, k1, z1,
                         am, an, azy, alo, ahi, out):
        """:func:`requant_add` with the conv's output channels permuted like
        :func:`requant_rows_perm` (``other`` and ``out`` in output channel order)."""
        rows, c = acc.shape
        tmp = np.empty(c, np.int64)
        for i in range(rows):
            _rq_row(acc, i, bias, m, n, zy, lo, hi, tmp)
            for k in range(c):
                out[i, k] = _add(tmp[src[k]], np.int64(other[i, k]), first, k0, z0, k1, z1,
                                 am, an, azy, alo, ahi)
        return out

    @njit(**_jit)
    def dwconv(x, w, zx, sh, sw, dh, dw, pt, pl, bias, m, n, zy, lo, hi, out):
        """x int8 [N, H, W, C]; w int32 [KH, KW, C]; out int8 [N, Ho, Wo, C]. One output row
        at a time, tap by tap over the whole row (int32 row accumulator stays in L1)."""
        nb, h, wd, c = x.shape
        _, ho, wo, _ = out.shape
        kh, kw, _ = w.shape
        zw = np.empty((kh, kw, c), np.int32)        # a padded tap adds zx * w
        for i in range(kh):
            for k in range(kw):
                for j in range(c):
                    zw[i, k, j] = zx * w[i, k, j]
        acc = np.empty((wo, c), np.int32)
        for b in range(nb):
            for oy in range(ho):
                acc[:, :] = 0
                for i in range(kh):
                    iy = oy * sh + i * dh - pt
                    for k in range(kw):
                        for ox in range(wo):
                            ix = ox * sw + k * dw - pl
                            if iy < 0 or iy >= h or ix < 0 or ix >= wd:
                                for j in range(c):
                                    acc[ox, j] += zw[i, k, j]
                            else:
                                for j in range(c):
                                    acc[ox, j] += np.int32(x[b, iy, ix, j]) * w[i, k, j]
                for ox in range(wo):
                    for j in range(c):
                        out[b, oy, ox, j] = _rq(np.int64(acc[ox, j]) + bias[j], m[j], n[j],
                                                zy, lo, hi)
        return out

    @njit(**_jit)
    def avgpool(x, kh, kw, sh, sw, dh, dw, pt, pl, zx, m, n, zy, lo, hi, out):
        """x int8 [N, H, W, C]; m, n int64 [Ho, Wo]; padded taps count as zx (add 0)."""
        nb, h, wd, c = x.shape
        _, ho, wo, _ = out.shape
        for p in range(nb * ho):
            b = p // ho
            oy = p - b * ho
            acc = np.empty(c, np.int64)
            for ox in range(wo):
                for j in range(c):
                    acc[j] = 0
                taps = 0
                for i in range(kh):
                    iy = oy * sh + i * dh - pt
                    if iy < 0 or iy >= h:
                        continue
                    for k in range(kw):
                        ix = ox * sw + k * dw - pl
                        if ix < 0 or ix >= wd:
                            continue
                        taps += 1
                        for j in range(c):
                            acc[j] += x[b, iy, ix, j]
                mm, nn = m[oy, ox], n[oy, ox]
                for j in range(c):
                    out[b, oy, ox, j] = _rq(acc[j] - zx * taps, mm, nn, zy, lo, hi)
        return out

    @njit(**_jit)
    def lut2(a, b, table, out):
        """out[i] = table[256 * (a[i] & 0xff) + (b[i] & 0xff)] on flat int8 arrays."""
        for i in range(a.size):
            out[i] = table[(np.int32(a[i]) & 0xFF) << 8 | (np.int32(b[i]) & 0xFF)]
        return out

    @njit(**_jit)
    def lut1(a, table, out):
        """out[i] = table[a[i] & 0xff] on flat int8 arrays."""
        for i in range(a.size):
            out[i] = table[np.int32(a[i]) & 0xFF]
        return out


if AVAILABLE:
    @njit(**_jit)
    def dwconv_rows(x, w, zx, sh, sw, dh, dw, pt, pl, bias, m, n, zy, lo, hi, oy0, oy1, out):
        """:func:`dwconv` on output rows [oy0, oy1) of ``out`` (int8 [N, Ho, Wo, C]).
        |acc| <= kh*kw*128*127 + |bias| stays far inside int32 for any kernel the
        contract accepts (acc_bound < 2^31 is proven at quantization)."""
        nb, h, wd, c = x.shape
        _, ho, wo, _ = out.shape
        kh, kw, _ = w.shape
        zw = np.empty((kh, kw, c), np.int32)
        for i in range(kh):
            for k in range(kw):
                for j in range(c):
                    zw[i, k, j] = zx * w[i, k, j]
        acc = np.empty((wo, c), np.int32)
        for b in range(nb):
            for oy in range(oy0, oy1):
                acc[:, :] = 0
                for i in range(kh):
                    iy = oy * sh + i * dh - pt
                    for k in range(kw):
                        for ox in range(wo):
                            ix = ox * sw + k * dw - pl
                            if iy < 0 or iy >= h or ix < 0 or ix >= wd:
                                for j in range(c):
                                    acc[ox, j] += zw[i, k, j]
                            else:
                                for j in range(c):
                                    acc[ox, j] += np.int32(x[b, iy, ix, j]) * w[i, k, j]
                for ox in range(wo):
                    for j in range(c):
                        out[b, oy, ox, j] = _rq(np.int64(acc[ox, j]) + bias[j], m[j], n[j],
                                                zy, lo, hi)
        return out

    @njit(**_jit)
    def avgpool_rows(x, kh, kw, sh, sw, dh, dw, pt, pl, zx, m, n, zy, lo, hi, oy0, oy1, out):
        """:func:`avgpool` on output rows [oy0, oy1)."""
        nb, h, wd, c = x.shape
        _, ho, wo, _ = out.shape
        acc = np.empty(c, np.int64)
        for b in range(nb):
            for oy in range(oy0, oy1):
                for ox in range(wo):
                    for j in range(c):
                        acc[j] = 0
                    taps = 0
                    for i in range(kh):
                        iy = oy * sh + i * dh - pt
                        if iy < 0 or iy >= h:
                            continue
                        for k in range(kw):
                            ix = ox * sw + k * dw - pl
                            if ix < 0 or ix >= wd:
                                continue
                            taps += 1
                            for j in range(c):
                                acc[j] += x[b, iy, ix, j]
                    mm, nn = m[oy, ox], n[oy, ox]
                    for j in range(c):
                        out[b, oy, ox, j] = _rq(acc[j] - zx * taps, mm, nn, zy, lo, hi)
        return out

    @njit(**_jit)
    def lut1_range(a, table, i0, i1, out):
        """out[i] = table[a[i] & 0xff] for i in [i0, i1) (flat int8 arrays)."""
        for i in range(i0, i1):
            out[i] = table[np.int32(a[i]) & 0xFF]
        return out

    @njit(**_jit)
    def lut1_rows(a, table, out):
        """out[i, j] = table[a[i, j] & 0xff] for int8 ``a`` [rows, C] and ``out`` [rows, C]
        of any strides (a concat input written straight into its channel range)."""
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                out[i, j] = table[np.int32(a[i, j]) & 0xFF]
        return out

    @njit(**_jit)
    def lut2_range(a, b, table, i0, i1, out):
        """out[i] = table[256 * (a[i] & 0xff) + (b[i] & 0xff)] for i in [i0, i1)."""
        for i in range(i0, i1):
            out[i] = table[(np.int32(a[i]) & 0xFF) << 8 | (np.int32(b[i]) & 0xFF)]
        return out


if AVAILABLE:
    @njit(**_jit)
    def gemm_rq(x, w, bias, m, n, zy, lo, hi, c0, c1, out):
        """Small exact GEMM with the requantize fused: out[i, j] = rq(sum_k x[i, k] * w[k, j]
        + bias[j]) for columns j in [c0, c1). x int8 [M, K]; w int32 [K, N]; int32 sums are
        exact while K * 128 * 128 < 2^31 (callers keep K <= 131071)."""
        rows, k = x.shape
        acc = np.empty(c1 - c0, np.int32)
        for i in range(rows):
            for j in range(c1 - c0):
                acc[j] = 0
            for t in range(k):
                xv = np.int32(x[i, t])
                wr = w[t, c0:c1]
                for j in range(c1 - c0):
                    acc[j] += xv * wr[j]
            for j in range(c1 - c0):
                out[i, c0 + j] = _rq(np.int64(acc[j]) + bias[c0 + j], m[c0 + j], n[c0 + j],
                                     zy, lo, hi)
        return out



if AVAILABLE:
    @njit(**_jit)
    def lut_per_channel(x, table, r0, r1, out):
        """out[i, c] = table[c, x[i, c] & 0xff] for rows i in [r0, r1); x, out int8
        [rows, C]; table int8 [C, 256] (a 1x1 depthwise conv: every code of every channel
        precomputed with the contract's formula)."""
        c = x.shape[1]
        for i in range(r0, r1):
            for j in range(c):
                out[i, j] = table[j, np.int32(x[i, j]) & 0xFF]
        return out


if AVAILABLE:
    @njit(**_jit)
    def scale_rq_rows_f(x, wm, bm, sf, zy, lo, hi, r0, r1, out):
        """A 1x1 depthwise conv in float64: ``out[i, c] = clamp(floor((x[i, c] * wm[c] +
        bm[c]) * sf[c]) + zy)`` for rows ``[r0, r1)`` of int8 ``x`` [rows, C], with ``wm =
        w * m``, ``bm = bias * m + 2^(n-1)``, ``sf = 2^-n`` (:func:`scale_rq_params`): the
        contract's ``rq(x * w + bias)``, exact where those exist. Vectorizes, unlike
        :func:`lut_per_channel`'s per-element gather."""
        c = x.shape[1]
        for i in range(r0, r1):
            a = x[i]
            o = out[i]
            for j in range(c):
                v = np.floor((np.float64(a[j]) * wm[j] + bm[j]) * sf[j]) + zy
                o[j] = np.int8(lo if v < lo else (hi if v > hi else v))
        return out


if AVAILABLE:
    @njit(**_jit)
    def lrn_rows(x, z, lo_w, hi_w, table, zy, r0, r1, out):
        """Quantized LRN on pixel rows ``[r0, r1)`` of channel-last int8 ``x`` [rows, C]:
        ``d = x - z``, ``W`` = the exact integer sum of ``d^2`` over channels
        ``[c - lo_w, c + hi_w]``, ``out = clamp(rint(d * table[W]) + zy)`` (float64
        multiply, round half to even; ``table`` from
        :func:`~dnnfab.sw.cpu.reference.lrn_table`, every entry finite)."""
        c = x.shape[1]
        sq = np.empty(c, np.int64)
        for i in range(r0, r1):
            for j in range(c):
                d = np.int64(x[i, j]) - z
                sq[j] = d * d
            w = np.int64(0)
            for j in range(min(hi_w, c - 1) + 1):
                w += sq[j]
            for j in range(c):
                v = np.rint(np.float64(np.int64(x[i, j]) - z) * table[w]) + zy
                out[i, j] = np.int8(max(-128.0, min(127.0, v)))
                if j + 1 + hi_w < c:
                    w += sq[j + 1 + hi_w]
                if j - lo_w >= 0:
                    w -= sq[j - lo_w]
        return out


def scale_rq_params(w, bias, m, n):
    """``(wm, bm, sf)`` float64 [C] for :func:`scale_rq_rows_f` (a 1x1 depthwise conv of
    int8 inputs: ``acc = x * w + bias``), or None where float64 is not exact: every
    intermediate, ``x * w * m``, ``bias * m + 2^(n-1)`` and their sum (``(acc + bias) * m +
    2^(n-1)`` of :func:`rq_float_params`), is an integer below 2^52 in magnitude when
    ``(128 |w| + |bias|) |m| + 2^(n-1) < 2^52``."""
    w = np.asarray(w, np.int64)
    bias = np.asarray(bias, np.int64)
    vmax = 128 * int(np.abs(w).max(initial=0)) + int(np.abs(bias).max(initial=0))
    p = rq_float_params(np.zeros_like(bias), m, n, vmax)
    if p is None:
        return None
    _, _, rf, sf = (np.broadcast_to(v, w.shape) for v in p)
    m = np.broadcast_to(np.asarray(m, np.int64), w.shape)
    return (np.ascontiguousarray(w * m, np.float64),
            np.ascontiguousarray((bias * m).astype(np.float64) + rf), np.ascontiguousarray(sf))


def rq_float_params(bias, m, n, vmax):
    """The requantize of :func:`requant_rows` in float64, when that is exact: ``(bf, mf,
    rf, sf)`` float64 [C] (bias, multiplier, ``2^(n-1)``, ``2^-n``) for the ``*_f``
    kernels, or None. Exact when every ``|acc + bias| <= vmax``: then ``(acc + bias) * m +
    2^(n-1)`` is an integer below 2^52 in magnitude (exact in float64), the scaling by
    ``2^-n`` is exact and ``floor`` is the arithmetic shift. The int64 form cannot be
    vectorized on AVX2 (no 64-bit multiply or arithmetic shift), this one can: measured
    1.75x faster at 12321 x 64."""
    m = np.asarray(m, np.int64)
    n = np.asarray(n, np.int64)
    if n.size == 0 or n.min() < 1 or n.max() > 1000:
        return None
    if float(vmax) * float(np.abs(m).max()) + 2.0 ** (int(n.max()) - 1) >= 2.0 ** 52:
        return None
    return tuple(np.ascontiguousarray(v, np.float64) for v in
                 (np.asarray(bias, np.int64), m, 2.0 ** (n - 1).astype(np.float64),
                  2.0 ** (-n.astype(np.float64))))


if AVAILABLE:
    @njit(inline="always")
    def _rqf(x, bf, mf, rf, sf, zy, lo, hi):
        v = np.floor(((x + bf) * mf + rf) * sf) + zy
        return lo if v < lo else (hi if v > hi else v)

    @njit(inline="always")
    def _rqf_row(acc, i, bf, mf, rf, sf, zy, lo, hi, tmp):
        """Row ``i`` of ``acc`` requantized (float64 form) into the buffer ``tmp``."""
        a = acc[i]
        for j in range(acc.shape[1]):
            tmp[j] = _rqf(np.float64(a[j]), bf[j], mf[j], rf[j], sf[j], zy, lo, hi)

    @njit(**_jit)
    def requant_rows_f(acc, bf, mf, rf, sf, zy, lo, hi, out):
        """:func:`requant_rows` with the parameters of :func:`rq_float_params` (zy, lo, hi
        as floats)."""
        rows, c = acc.shape
        for i in range(rows):
            a = acc[i]
            o = out[i]
            for j in range(c):
                o[j] = np.int8(_rqf(np.float64(a[j]), bf[j], mf[j], rf[j], sf[j], zy, lo, hi))
        return out

    @njit(**_jit)
    def requant_rows_perm_f(acc, bf, mf, rf, sf, zy, lo, hi, src, out):
        """:func:`requant_rows_perm` in the float64 form."""
        rows, c = acc.shape
        tmp = np.empty(c, np.float64)
        for i in range(rows):
            _rqf_row(acc, i, bf, mf, rf, sf, zy, lo, hi, tmp)
            for k in range(c):
                out[i, k] = np.int8(tmp[src[k]])
        return out

    @njit(**_jit)
    def requant_add_f(acc, bf, mf, rf, sf, zy, lo, hi, other, first, k0, z0, k1, z1,
                      am, an, azy, alo, ahi, out):
        """:func:`requant_add` with the conv's requantize in the float64 form (the add's
        own requantize stays int64)."""
        rows, c = acc.shape
        for i in range(rows):
            a = acc[i]
            for j in range(c):
                y = np.int64(_rqf(np.float64(a[j]), bf[j], mf[j], rf[j], sf[j], zy, lo, hi))
                out[i, j] = _add(y, np.int64(other[i, j]), first, k0, z0, k1, z1,
                                 am, an, azy, alo, ahi)
        return out

    @njit(**_jit)
    def requant_add_perm_f(acc, bf, mf, rf, sf, zy, lo, hi, src, other, first, k0, z0, k1,
                           z1, am, an, azy, alo, ahi, out):
        """:func:`requant_add_perm` with the conv's requantize in the float64 form."""
        rows, c = acc.shape
        tmp = np.empty(c, np.float64)
        for i in range(rows):
            _rqf_row(acc, i, bf, mf, rf, sf, zy, lo, hi, tmp)
            for k in range(c):
                out[i, k] = _add(np.int64(tmp[src[k]]), np.int64(other[i, k]), first, k0, z0,
                                 k1, z1, am, an, azy, alo, ahi)
        return out


# ---------------------------------------------------------------- small-network plan
# (dnnfab.sw.cpu.netplan: a whole small network, one call per layer into buffers bound once)
if AVAILABLE:
    @njit(**_jit)
    def conv_rq_dot(x, wt, bias, m, n, zx, zy, lo, hi, kh, kw, sh, sw, dh, dw, pt, pl, out):
        """Dense conv with the requantize fused, channel-last: x int8 [N, H, W, C], wt int16
        [Cout, Kp] (the int8 weights with taps in (i, j, c) order, zero beyond K = kh * kw *
        C; a grouped conv as its block-diagonal dense matrix), out int8 [N, Ho, Wo, Cout].
        Each output pixel gathers its window into one int16 row (taps outside the input
        read ``zx``, the contract's padding), then one int32 dot product per output channel
        over Kp (LLVM vectorizes contiguous int16 rows with multiply-add pairs; a Kp that
        is a multiple of 64 measured ~1.9x the speed of int8 rows of an odd K). int32 sums
        are exact while K * 128 * 128 < 2^31."""
        nb, h, wd, c = x.shape
        _, ho, wo, cout = out.shape
        k = wt.shape[1]
        col = np.zeros(k, np.int16)
        acc = np.empty(cout, np.int32)
        zc = np.int16(zx)
        for b in range(nb):
            for oy in range(ho):
                for ox in range(wo):
                    p = 0
                    for i in range(kh):
                        iy = oy * sh + i * dh - pt
                        for j in range(kw):
                            ix = ox * sw + j * dw - pl
                            if iy < 0 or iy >= h or ix < 0 or ix >= wd:
                                for ch in range(c):
                                    col[p + ch] = zc
                            else:
                                for ch in range(c):
                                    col[p + ch] = x[b, iy, ix, ch]
                            p += c
                    # (the sums go to an int32 row first: requantizing inside this loop
                    # measured 2.5x slower, LLVM then does not vectorize the dot product)
                    for o in range(cout):
                        s = np.int32(0)
                        for t in range(k):
                            s += np.int32(col[t]) * np.int32(wt[o, t])
                        acc[o] = s
                    for o in range(cout):
                        out[b, oy, ox, o] = _rq(np.int64(acc[o]) + bias[o], m[o], n[o], zy, lo, hi)
        return out

    @njit(**_jit)
    def gemm_rq_dot(x, wt, bias, m, n, zy, lo, hi, out):
        """out[i, o] = rq(sum_k x[i, k] * wt[o, k] + bias[o]): x int8 [M, K], wt int8
        [N, K] (the ONNX Gemm weight as it is), out int8 [M, N]; exact like
        :func:`conv_rq_dot`."""
        rows, k = x.shape
        cout = wt.shape[0]
        acc = np.empty(cout, np.int32)
        for i in range(rows):
            for o in range(cout):
                s = np.int32(0)
                for t in range(k):
                    s += np.int32(x[i, t]) * np.int32(wt[o, t])
                acc[o] = s
            for o in range(cout):
                out[i, o] = _rq(np.int64(acc[o]) + bias[o], m[o], n[o], zy, lo, hi)
        return out

    @njit(**_jit)
    def maxpool_rows(x, kh, kw, sh, sw, dh, dw, pt, pl, oy0, oy1, out):
        """Max pool, channel-last int8 [N, H, W, C] -> output rows [oy0, oy1) of [N, Ho,
        Wo, C]; taps outside the input are skipped (the contract pads with -128, which
        never wins a max; a window wholly outside gives -128 either way). Tap by tap over
        an output row (the inner loop vectorizes over channels): measured 2.0-2.8x faster
        than numpy ``maximum`` over the taps with 64-480 channels, equal with 24."""
        nb, h, wd, c = x.shape
        wo = out.shape[2]
        for b in range(nb):
            for oy in range(oy0, oy1):
                orow = out[b, oy]
                orow[:, :] = -128
                for i in range(kh):
                    iy = oy * sh + i * dh - pt
                    if iy < 0 or iy >= h:
                        continue
                    xr = x[b, iy]
                    for j in range(kw):
                        ox0 = 0                 # the output columns whose tap is inside
                        while ox0 < wo and ox0 * sw + j * dw - pl < 0:
                            ox0 += 1
                        ox1 = wo
                        while ox1 > ox0 and (ox1 - 1) * sw + j * dw - pl >= wd:
                            ox1 -= 1
                        for ox in range(ox0, ox1):
                            ix = ox * sw + j * dw - pl
                            for ch in range(c):
                                a = xr[ix, ch]
                                o = orow[ox, ch]
                                orow[ox, ch] = a if a > o else o
        return out

    @njit(**_jit)
    def maxpool_cl(x, kh, kw, sh, sw, dh, dw, pt, pl, out):
        """Max pool, channel-last int8 [N, H, W, C] -> [N, Ho, Wo, C] (all rows of
        :func:`maxpool_rows`)."""
        return maxpool_rows(x, kh, kw, sh, sw, dh, dw, pt, pl, 0, out.shape[1], out)

    @njit(**_jit)
    def im2col_u8(xu, c, src, zu, out):
        """im2col rows of a channel-last int8 conv input, shifted to uint8 (``x + 128``, the
        onnxruntime engines' form) through a gather table: ``xu`` the input's bytes (flat
        uint8 view), ``src`` int32 [rows * taps] the flat offset of each tap's C channels
        or -1 for padding (written as ``zu`` = ``zx + 128``), ``out`` flat uint8 [rows *
        taps * C]. (Measured 3x faster than indexing the 4-D input tap by tap.)"""
        d = 0
        for t in range(src.shape[0]):
            s = src[t]
            if s < 0:
                for ch in range(c):
                    out[d + ch] = zu
            else:
                for ch in range(c):
                    out[d + ch] = xu[s + ch] ^ 0x80
            d += c
        return out

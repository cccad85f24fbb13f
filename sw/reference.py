"""The integer reference network: executes a :class:`~dnnfab.sw.quantize.QuantizedGraph`
exactly as the contract (DESIGN.md section 3) says. It is the golden model the fabric, the
fast model and the CPU workers are compared against, bit for bit.

Layout: the kernels take and return **channel-last** int8 arrays (NHWC; 1-D layers use
H = 1, i.e. [N, 1, L, C]) because im2col then copies contiguous channel runs and the
per-channel requantize broadcasts over the last axis. The network executor keeps rank-3/4
activations channel-last and converts to the logical (ONNX, channel-first) layout only for
layout-sensitive ops (reshape, transpose, CPU float ops) and for the outputs.

Two implementations of every arithmetic kernel:

* fast (``qconv_int``, ``qgemm_int``, ``qavgpool_int``, ``qeltwise_int``, ...):
  int8 x int8 products summed in float32 BLAS are exact while every partial sum stays
  below 2^24, so K is cut into chunks of at most 1024 (1024 * 128 * 127 < 2^24) and the
  chunks are added in int32. Large GEMMs go to onnxruntime ``MatMulInteger`` instead
  (uint8 activations x int8 weights, exact int32, VNNI speed): the activations are
  shifted by +128 (``x ^ 0x80`` on the bit pattern) and ``-128 * sum(w[c])`` is folded
  into the bias. That path is used only when ``255 * sum|w[c]| < 2^31`` and is checked
  bit-identical to the numpy path once per process (and by the tests).
  Requantize runs in float64, which is exact here: ``acc * m`` < 2^46 and ``m * 2^-n`` is
  a 15-bit mantissa, so ``floor(acc * (m 2^-n) + 1/2)`` equals ``(acc*m + 2^(n-1)) >> n``.
* slow (``qconv_int_slow``, ``qgemm_int_slow``, ...): loops with int64 arithmetic and the
  literal contract formula; used by the property tests to pin the fast path down.

``set_engine("numpy" | "ort" | "auto")`` chooses the GEMM engine (default ``auto``).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DnnfabError
from .ir import from_cl, pad_nhwc, run_float_layer, to_cl, windows_nhwc
from .quantize import (QAvgPool, QClip, QConv, QEltwise, QFloat, QGemm, QLayout, QLut,
                       QMaxPool, dequantize_tensor, quantize_tensor, requantize)

K_CHUNK = 1024           # int8*int8 partial sums in float32 stay exact below 2^24
BLOCK_DIAG_MAX_GROUPS = 8
ORT_MIN_MACS = 1 << 12   # below this numpy BLAS beats the ~5 us session call
_ENGINE = {"name": os.environ.get("DNNFAB_GEMM_ENGINE", "auto"), "ort_ok": None}


def set_engine(name):
    """Select the integer GEMM engine: 'numpy', 'ort' (onnxruntime MatMulInteger) or 'auto'
    (ort for large layers when available). Returns the previous setting."""
    if name not in ("numpy", "ort", "auto"):
        raise ValueError("engine must be 'numpy', 'ort' or 'auto'")
    old = _ENGINE["name"]
    _ENGINE["name"] = name
    return old


def _threads():
    return int(os.environ.get("DNNFAB_THREADS", min(2, os.cpu_count() or 1)))


# ====================================================================== requantize
def _mult64(m, n):
    return np.asarray(m, np.float64) * np.exp2(-np.asarray(n, np.float64))


def requantize_fast(acc, M64, zy, lo, hi, bias=None):
    """Exact float64 form of the contract's requantize (see module docstring).

    acc: integer-valued array (int32/int64, or float32/float64 holding exact integers),
    M64: m * 2**-n broadcastable to acc, bias: integers added first (optional).
    """
    t = acc.astype(np.float64)
    if bias is not None:
        t += bias
    t *= M64
    t += 0.5
    np.floor(t, out=t)
    if zy:
        t += zy
    np.clip(t, lo, hi, out=t)
    return t.astype(np.int8)


class Requant:
    """Precomputed requantize of one layer: ``rq(acc) == requantize(acc + bias, m, n, ...)``.

    Fast form (every n <= 44): ``t = acc * M + C`` with ``C = bias*M + 1/2 + zy + 128``,
    clamp to ``[lo + 128, hi + 128.5]``, truncate to uint8 and flip the top bit back to
    int8. Exact: acc*M and bias*M are exact in float64 (< 2^46 * 2^-n), and with n <= 44
    every intermediate has at most 53 significant bits, so the sum is exact; after the
    clamp all values are >= 0, where truncation is floor. Larger n (multipliers below
    2^-30) use :func:`requantize_fast`.
    """

    def __init__(self, m, n, zy, lo, hi, bias=None):
        self.M = _mult64(m, n)
        self.zy, self.lo, self.hi = int(zy), int(lo), int(hi)
        self.bias = None if bias is None else np.asarray(bias, np.int64)
        self.fast = int(np.max(n)) <= 44
        b = 0.0 if bias is None else self.bias.astype(np.float64)
        self.C = b * self.M + (0.5 + self.zy + 128)
        self.lo8, self.hi8 = self.lo + 128.0, self.hi + 128.5

    def __call__(self, acc):
        if not self.fast:
            return requantize_fast(acc, self.M, self.zy, self.lo, self.hi, self.bias)
        t = np.multiply(acc, self.M, dtype=np.float64)
        t += self.C
        np.clip(t, self.lo8, self.hi8, out=t)
        u = t.astype(np.uint8)
        u ^= np.uint8(0x80)
        return u.view(np.int8)


class Requant32:
    """The same requantize as :class:`Requant` in 32-bit integer arithmetic, ~2x faster;
    used by :class:`FastPlan`. ``rq(acc) == requantize(acc + bias, m, n, zy, lo, hi)`` for
    int32 ``acc`` (or float32 holding exact integers) of shape [..., C], C-contiguous.

    Derivation (all per channel; a = acc + bias, y(a) = zy + floor((a*m + 2^(n-1)) / 2^n),
    non-decreasing in a):

    * ``A_lo`` = least a with y(a) >= lo, ``A_hi`` = largest a with y(a) <= hi. When
      y(A_lo) == lo and y(A_hi) == hi (checked; true whenever m*2^-n <= 1), clamping a to
      [A_lo, A_hi] (acc to [A_lo - bias, A_hi - bias], intersected with int32) gives
      y = clamp(y(a), lo, hi) exactly, so no clamp is needed afterwards.
    * With d = a - A_lo >= 0: y + 128 = floor(V / 2^n), V = d*m + c0,
      c0 = A_lo*m + 2^(n-1) + (zy + 128)*2^n >= 0 and V < (hi + 129)*2^n <= 2^(n+8).
    * Split the shift, s = max(0, n - 24), m = mh*2^s + ml, c0 = ch*2^s + cl:
      floor(V / 2^s) = (d*mh + ch) + ((d*ml + cl) >> s) < 2^32, then >> (n - s).
      Both products are formed as ``acc*mh + (ch - (A_lo - bias)*mh)`` in wrapping uint32
      arithmetic; their true values lie in [0, 2^32) (checked exactly per channel at
      construction), so the wrapped results are exact.

    ``ok`` is False (callers use :class:`Requant`) when a channel does not fit: n > 30, an
    empty window (a clamp narrower than one output step), or a window outside int32.
    """

    TILE = 8192  # constants are tiled to rows of ~TILE elements: long contiguous loops

    def __init__(self, m, n, zy, lo, hi, bias=None):
        m = [int(v) for v in np.asarray(m).reshape(-1)]
        n = [int(v) for v in np.asarray(n).reshape(-1)]
        c = len(m)
        b = [0] * c if bias is None else [int(v) for v in np.broadcast_to(
            np.asarray(bias, np.int64), (c,))]
        zy, lo, hi = int(zy), int(lo), int(hi)
        self.c = c
        self.ok = False
        cols = {k: [] for k in ("blo", "bhi", "mh", "kh", "ml", "kl", "s", "r")}
        lo32, hi32 = -2**31, 2**31 - 1
        for mc, nc, bc in zip(m, n, b):
            if not (1 <= nc <= 30 and 0 < mc < 2**15):
                return
            h = 1 << (nc - 1)
            a_lo = -((h - (lo - zy) * 2**nc) // mc)               # ceil((L 2^n - h) / m)
            a_hi = ((hi - zy + 1) * 2**nc - h - 1) // mc
            blo, bhi = max(a_lo - bc, lo32), min(a_hi - bc, hi32)
            if a_lo > a_hi or blo > bhi or zy + ((a_lo * mc + h) >> nc) != lo or \
                    zy + ((a_hi * mc + h) >> nc) != hi:
                return  # clamping a must reproduce the output clamp exactly
            # the clamped a spans [blo + bc, bhi + bc] within [a_lo, a_hi]
            d_max = bhi + bc - a_lo
            d_min = blo + bc - a_lo
            c0 = a_lo * mc + h + (zy + 128) * 2**nc
            sc = max(0, nc - 24)
            mh, ml = mc >> sc, mc & ((1 << sc) - 1)
            ch, cl = c0 >> sc, c0 & ((1 << sc) - 1)
            q_max = d_max * ml + cl
            p_max = d_max * mh + ch + (q_max >> sc)
            if d_min < 0 or c0 < 0 or q_max >= 2**32 or p_max >= 2**32 or \
                    (p_max >> (nc - sc)) > 255:
                return
            # d = acc - blo' with blo' = a_lo - bc: acc*mh + (ch - blo'*mh) (mod 2^32)
            base = a_lo - bc
            cols["blo"].append(blo)
            cols["bhi"].append(bhi)
            cols["mh"].append(mh)
            cols["kh"].append((ch - base * mh) % 2**32)
            cols["ml"].append(ml)
            cols["kl"].append((cl - base * ml) % 2**32)
            cols["s"].append(sc)
            cols["r"].append(nc - sc)
        self.ok = True
        # n > 24 somewhere: the float64 form after the integer clamp beats the split
        self.M = _mult64(m, n)
        self.C = (np.asarray(b, np.float64) * self.M + (0.5 + zy + 128))
        self.lo_v = np.array(cols["blo"], np.int32)
        self.hi_v = np.array(cols["bhi"], np.int32)
        self.mh = np.array(cols["mh"], np.uint32)
        self.kh = np.array(cols["kh"], np.uint32)
        self.split = any(cols["s"])
        self.ml = np.array(cols["ml"], np.uint32)
        self.kl = np.array(cols["kl"], np.uint32)
        self.s = np.array(cols["s"], np.uint32)
        self.r = np.array(cols["r"], np.uint32)
        self.r_scalar = int(self.r[0]) if len(set(cols["r"])) == 1 else None
        self._tiles = {}

    def _tiled(self, rows):
        t = self._tiles.get(rows)
        if t is None:
            k = 1
            for d in range(max(1, min(rows, self.TILE // max(self.c, 1))), 0, -1):
                if rows % d == 0:
                    k = d
                    break
            names = ("lo_v", "hi_v", "mh", "kh", "ml", "kl", "s", "r") if not self.split \
                else ("lo_v", "hi_v", "M", "C")
            t = (k,) + tuple(np.tile(getattr(self, a), k) for a in names)
            self._tiles[rows] = t
        return t

    def __call__(self, acc):
        shape = acc.shape
        rows = acc.size // self.c
        tiles = self._tiled(rows)
        k, lo_v, hi_v = tiles[:3]
        a = acc.reshape(rows // k, k * self.c)
        if a.dtype != np.int32:
            a = a.astype(np.int32)
            np.maximum(a, lo_v, out=a)
        else:
            a = np.maximum(a, lo_v)
        np.minimum(a, hi_v, out=a)
        if self.split:
            # y(a) in [lo, hi] now, so t = a*M + C lies in [lo + 128, hi + 129): truncation
            # to uint8 is the floor (exactness of t: see Requant)
            t = a.astype(np.float64)
            t *= tiles[3]
            t += tiles[4]
            y = t.astype(np.uint8)
            y ^= np.uint8(0x80)
            return y.view(np.int8).reshape(shape)
        mh, kh, ml, kl, s, r = tiles[3:]
        u = a.view(np.uint32)
        p = np.multiply(u, mh)
        p += kh
        p >>= (self.r_scalar if self.r_scalar is not None else r)
        y = p.astype(np.uint8)
        y ^= np.uint8(0x80)
        return y.view(np.int8).reshape(shape)


# ====================================================================== int GEMM
class _OrtMatMulInteger:
    """Cached onnxruntime session computing uint8 [M, K] x int8 [K, N] -> int32."""

    def __init__(self, w_kn):
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        k, n = w_kn.shape
        g = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "mmi",
            [helper.make_tensor_value_info("a", TensorProto.UINT8, ["M", k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", n])],
            [numpy_helper.from_array(np.ascontiguousarray(w_kn), "w")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = min(model.ir_version, 9)
        so = ort.SessionOptions()
        so.intra_op_num_threads = _threads()
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        # one small session per layer: idle pool threads must sleep, not spin, or dozens of
        # spinning pools starve the Python thread between calls
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])

    def __call__(self, a_u8):
        return self.sess.run(None, {"a": a_u8})[0]


def _ort_available():
    if _ENGINE["ort_ok"] is None:
        try:
            rng = np.random.default_rng(1)
            w = rng.integers(-127, 128, (300, 7)).astype(np.int8)
            w[:, 0] = 127
            w[:, 1] = -127
            a = rng.integers(0, 256, (5, 300)).astype(np.uint8)
            a[0] = 255
            got = _OrtMatMulInteger(w)(a)
            _ENGINE["ort_ok"] = bool(np.array_equal(got, a.astype(np.int64) @ w.astype(np.int64)))
        except Exception:
            _ENGINE["ort_ok"] = False
    return _ENGINE["ort_ok"]


class PreparedGemm:
    """Weights of one GEMM ([K, N] int8) in the forms the engines want, cached per layer.

    ``colsum`` = sum over K per output column (int64), used to fold the +128 shift.
    ``ort_safe``: 255 * sum|w| < 2^31, i.e. the uint8 MatMulInteger cannot overflow.
    """

    def __init__(self, w_kn):
        self.w = np.ascontiguousarray(w_kn, dtype=np.int8)
        self.k, self.n = self.w.shape
        self.wf = self.w.astype(np.float32)
        self.colsum = self.w.astype(np.int64).sum(axis=0)
        self.ort_safe = bool(255 * np.abs(self.w.astype(np.int64)).sum(axis=0).max(initial=0)
                             < 2**31)
        self._ort = None

    def use_ort(self, m):
        eng = _ENGINE["name"]
        if eng == "numpy" or not self.ort_safe:
            return False
        if eng == "auto" and m * self.k * self.n < ORT_MIN_MACS:
            return False
        return _ort_available()

    def ort(self):
        if self._ort is None:
            self._ort = _OrtMatMulInteger(self.w)
        return self._ort

    def matmul_f32(self, a_f32):
        """Exact int GEMM via float32 BLAS with K chunks; returns float32 (K <= 1024) or
        int32 exact integer sums."""
        if self.k <= K_CHUNK:
            return a_f32 @ self.wf
        acc = None
        for k0 in range(0, self.k, K_CHUNK):
            part = (a_f32[:, k0:k0 + K_CHUNK] @ self.wf[k0:k0 + K_CHUNK]).astype(np.int32)
            acc = part if acc is None else np.add(acc, part, out=acc)
        return acc


def int_matmul(a_i8, prep):
    """Exact int8 [M, K] x int8 [K, N] -> integer accumulators (int32 or exact float32)."""
    if prep.use_ort(a_i8.shape[0]):
        a_u8 = a_i8.view(np.uint8) ^ np.uint8(0x80)
        return prep.ort()(a_u8) - 128 * prep.colsum
    return prep.matmul_f32(a_i8.astype(np.float32))


# ====================================================================== conv
def _conv_prep(L):
    c = L.cache
    if "prep" not in c:
        cout, cig, kh, kw = L.qweight.shape
        g = L.groups
        cog = cout // g
        depthwise = cig == 1 and g > 1 and cog == 1
        c["depthwise"] = depthwise
        c["M64"] = _mult64(L.m, L.n)
        if depthwise:
            c["wdw"] = np.ascontiguousarray(L.qweight[:, 0].transpose(1, 2, 0)).astype(np.float32)
            c["exact_f32"] = kh * kw * 128 * 127 < 2**24
        elif 1 < g <= BLOCK_DIAG_MAX_GROUPS:
            # few groups: one dense GEMM with a block-diagonal weight matrix (zeros are
            # exact) beats g separate calls plus the per-group column copies
            cin = cig * g
            dense = np.zeros((kh, kw, cin, cout), np.int8)
            for i in range(g):
                dense[:, :, i * cig:(i + 1) * cig, i * cog:(i + 1) * cog] = \
                    L.qweight[i * cog:(i + 1) * cog].transpose(2, 3, 1, 0)
            c["groups"] = [PreparedGemm(dense.reshape(kh * kw * cin, cout))]
            c["block_diag"] = True
        else:
            c["groups"] = [PreparedGemm(
                L.qweight[i * cog:(i + 1) * cog].transpose(2, 3, 1, 0).reshape(kh * kw * cig, cog))
                for i in range(g)]
        c["rq"] = Requant(L.m, L.n, L.zy, L.lo, L.hi, L.bias)
        if not depthwise:
            # bias for the uint8 (+128) activations of the onnxruntime engine
            colsum = np.concatenate([p.colsum for p in c["groups"]])
            c["rq_u8"] = Requant(L.m, L.n, L.zy, L.lo, L.hi,
                                 L.bias.astype(np.int64) - 128 * colsum)
        c["prep"] = True
    return c


def qconv_int(x, L):
    """Integer convolution of the contract. x: int8 channel-last [N, H, W, Cin] (1-D: H=1);
    L: :class:`~dnnfab.sw.quantize.QConv`. Returns int8 [N, Ho, Wo, Cout]."""
    c = _conv_prep(L)
    cout, cig, kh, kw = L.qweight.shape
    n_, h, w, cin = x.shape
    t, l, b, r = L.pad
    ho = (h + t + b - (kh - 1) * L.dilation[0] - 1) // L.stride[0] + 1
    wo = (w + l + r - (kw - 1) * L.dilation[1] - 1) // L.stride[1] + 1
    if c["depthwise"]:
        xp = pad_nhwc(x, L.pad, L.zx).astype(np.float32 if c["exact_f32"] else np.float64)
        win = windows_nhwc(xp, kh, kw, L.stride, L.dilation, ho, wo)
        wd = c["wdw"] if c["exact_f32"] else c["wdw"].astype(np.float64)
        acc = None
        for i in range(kh):
            for j in range(kw):
                term = win[:, :, :, i, j, :] * wd[i, j]
                acc = term if acc is None else np.add(acc, term, out=acc)
        return c["rq"](acc)
    acc, use_ort = _conv_acc(x, L, c, ho, wo)
    y = (c["rq_u8"] if use_ort else c["rq"])(acc)
    return y.reshape(n_, ho, wo, cout)


def _conv_acc(x, L, c, ho, wo):
    """GEMM part of a non-depthwise :func:`qconv_int`: ([M, Cout] accumulators without the
    bias, True if they are for uint8 (+128) activations, i.e. need ``rq_u8``)."""
    cout, cig, kh, kw = L.qweight.shape
    n_, h, w, cin = x.shape
    groups = c["groups"]
    m = n_ * ho * wo
    use_ort = groups[0].use_ort(m)
    if use_ort:
        xs = x.view(np.uint8) ^ np.uint8(0x80)  # int8 -> uint8 (+128), a fresh copy
        zpad = np.uint8(L.zx + 128)
    else:
        xs = x.astype(np.float32)
        zpad = np.float32(L.zx)
    if kh == 1 and kw == 1 and not any(L.pad):  # 1x1: no im2col, just (strided) rows
        sub = xs[:, ::L.stride[0], ::L.stride[1], :][:, :ho, :wo, :]
        cols_all = np.ascontiguousarray(sub).reshape(m, cin)
        win = None
    else:
        xp = pad_nhwc(xs, L.pad, zpad)
        win = windows_nhwc(xp, kh, kw, L.stride, L.dilation, ho, wo)
    if c.get("block_diag"):
        cig = cin
    accs = []
    for gi, prep in enumerate(groups):
        if win is None:
            cols = cols_all if len(groups) == 1 else \
                np.ascontiguousarray(cols_all[:, gi * cig:(gi + 1) * cig])
        else:
            sub = win if len(groups) == 1 else win[..., gi * cig:(gi + 1) * cig]
            cols = np.ascontiguousarray(sub).reshape(m, kh * kw * cig)
        accs.append(prep.ort()(cols) if use_ort else prep.matmul_f32(cols))
    acc = accs[0] if len(accs) == 1 else np.concatenate(accs, axis=1)
    return acc, use_ort


def qconv_int_slow(x, L):
    """Loop implementation of :func:`qconv_int` with int64 arithmetic (for tests)."""
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


# ====================================================================== gemm
def _gemm_prep(L):
    c = L.cache
    if "prep" not in c:
        c["prep"] = PreparedGemm(L.qweight.T)
        c["rq"] = Requant(L.m, L.n, L.zy, L.lo, L.hi, L.bias)
    return c


def qgemm_int(x, L):
    """Integer fully connected layer: x int8 [M, K] -> int8 [M, N] (:class:`QGemm`)."""
    c = _gemm_prep(L)
    acc = int_matmul(np.ascontiguousarray(x), c["prep"])
    return c["rq"](acc)


def qgemm_int_slow(x, L):
    """Loop implementation of :func:`qgemm_int` (int64, literal contract)."""
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


# ====================================================================== pools / eltwise
def _pool_geom(L, x):
    kh, kw = L.kernel
    t, l, b, r = L.pad
    eb, er = L.extra
    h, w = x.shape[1] + t + b + eb, x.shape[2] + l + r + er
    ho = (h - (kh - 1) * L.dilation[0] - 1) // L.stride[0] + 1
    wo = (w - (kw - 1) * L.dilation[1] - 1) // L.stride[1] + 1
    return (t, l, b + eb, r + er), ho, wo


def qmaxpool_int(x, L):
    """Max pool on int8 channel-last data; padding is -128 (never wins). Exact."""
    pads, ho, wo = _pool_geom(L, x)
    xp = pad_nhwc(x, pads, -128)
    win = windows_nhwc(xp, L.kernel[0], L.kernel[1], L.stride, L.dilation, ho, wo)
    y = win[:, :, :, 0, 0, :].copy()
    for i in range(L.kernel[0]):
        for j in range(L.kernel[1]):
            if i or j:
                np.maximum(y, win[:, :, :, i, j, :], out=y)
    return y


def qavgpool_int(x, L):
    """Average pool (:class:`QAvgPool`): window sum of (q - zx), per-position requantize."""
    pads, ho, wo = _pool_geom(L, x)
    kh, kw = L.kernel
    if L.is_global:
        acc = x.sum(axis=(1, 2), dtype=np.int64)[:, None, None, :] - L.zx * kh * kw
    else:
        xp = pad_nhwc(x, pads, L.zx).astype(np.int32)
        win = windows_nhwc(xp, kh, kw, L.stride, L.dilation, ho, wo)
        acc = win[:, :, :, 0, 0, :].copy()
        for i in range(kh):
            for j in range(kw):
                if i or j:
                    acc += win[:, :, :, i, j, :]
        acc -= L.zx * kh * kw
    if "rq" not in L.cache:
        L.cache["rq"] = Requant(L.m[None, :, :, None], L.n[None, :, :, None], L.zy, L.lo, L.hi)
    return L.cache["rq"](acc)


def qavgpool_int_slow(x, L):
    pads, ho, wo = _pool_geom(L, x)
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


def qeltwise_int(xs, L):
    """Add / concat / rescale (:class:`QEltwise`). ``xs`` are int8 arrays in the same
    layout; for concat ``axis`` must already be the physical axis (see the executor).
    The products k*x are exact in float64 (< 2^31) and the zero points are folded into
    the requantize offset."""
    c = L.cache
    if "rq" not in c:
        kz = [int(k) * int(z) for k, z in zip(L.k, L.z)]
        if L.op == "add":
            c["rq"] = Requant(L.m, L.n, L.zy, L.lo, L.hi, np.int64(-sum(kz)))
        else:
            c["rqs"] = [Requant(L.m, L.n, L.zy, L.lo, L.hi, np.int64(-v)) for v in kz]
        c["rq"] = c.get("rq")
    if L.op == "add":
        acc = np.multiply(xs[0], float(L.k[0]), dtype=np.float64)
        for x, k in zip(xs[1:], L.k[1:]):
            acc += np.multiply(x, float(k), dtype=np.float64)
        return c["rq"](acc)
    outs = []
    for i, (x, k) in enumerate(zip(xs, L.k)):
        if L.identity and L.identity[i] and L.lo == -128 and L.hi == 127:
            outs.append(x)
        else:
            outs.append(c["rqs"][i](np.multiply(x, float(k), dtype=np.float64)))
    return outs


def qeltwise_int_slow(xs, L):
    if L.op == "add":
        acc = sum((x.astype(np.int64) - int(z)) * int(k) for x, k, z in zip(xs, L.k, L.z))
        return requantize(acc, L.m, L.n, L.zy, L.lo, L.hi)
    return [requantize((x.astype(np.int64) - int(z)) * int(k), L.m, L.n, L.zy, L.lo, L.hi)
            for x, k, z in zip(xs, L.k, L.z)]


def qlut_int(x, L):
    return np.take(L.table, (x.view(np.uint8) ^ np.uint8(0x80)))


# ====================================================================== executor
_CL_AXIS = {4: {0: 0, 1: 3, 2: 1, 3: 2}, 3: {0: 0, 1: 3, 2: 2}}


class Env:
    """Tensor store tracking each activation's physical layout ('cl' or 'lg')."""

    def __init__(self, graph):
        self.g = graph
        self.v = {}

    def put(self, name, arr, layout):
        self.v[name] = (arr, layout)

    def rank(self, name):
        return len(self.g.shape(name))

    def cl(self, name):
        arr, lay = self.v[name]
        if lay == "cl":
            return arr
        if arr.ndim in (3, 4):
            arr = np.ascontiguousarray(to_cl(arr))
            self.v[name] = (arr, "cl")  # channel-last is the preferred storage
            return arr
        return arr

    def lg(self, name):
        arr, lay = self.v[name]
        if lay == "lg":
            return arr
        return np.ascontiguousarray(from_cl(arr, self.rank(name)))

    def any(self, name):
        return self.v[name]


def run_reference(qg, feed_q, observer=None, fast=None):
    """Run the integer network on int8 inputs ``feed_q`` {name: int8 logical array}.

    Returns ``{output name: int8 array}`` in the logical (ONNX) layout. ``observer(name,
    int8 logical array)`` is called for every tensor (slow: converts layouts).

    Without an observer the network runs through a compiled :class:`FastPlan` (fused
    channel shuffles, table add/rescale, onnxruntime depthwise convs; bit-identical, see
    the class docstring); ``fast=False`` (or ``set_fast_plan(False)``) forces the plain
    layer-by-layer executor."""
    env = Env(qg)
    for t in qg.inputs:
        x = np.asarray(feed_q[t.name])
        if x.dtype != np.int8:
            raise DnnfabError(f"run_reference needs int8 inputs; got {x.dtype} for {t.name!r}")
        env.put(t.name, x, "lg")
    if fast is None:
        fast = _FAST_PLAN["on"]
    if fast and observer is None:
        fast_plan(qg).run(env)
        return {t.name: env.lg(t.name) for t in qg.outputs}
    for L in qg.layers:
        run_layer(qg, env, L)
        if observer:
            observer(L.output, env.lg(L.output))
    return {t.name: env.lg(t.name) for t in qg.outputs}


def run_layer(qg, env, L):
    """Execute one integer layer, reading/writing tensors in ``env`` (an :class:`Env`)."""
    op = L.op
    if op == "conv":
        y, lay = qconv_int(env.cl(L.input), L), "cl"
    elif op == "gemm":
        x = env.lg(L.input)
        shp = x.shape
        y = qgemm_int(x.reshape(-1, shp[-1]), L).reshape(shp[:-1] + (L.qweight.shape[0],))
        lay = "lg"
    elif op == "maxpool":
        y, lay = qmaxpool_int(env.cl(L.input), L), "cl"
    elif op == "avgpool":
        y, lay = qavgpool_int(env.cl(L.input), L), "cl"
    elif op == "add":
        lays = {env.any(t)[1] for t in L.inputs}
        if env.rank(L.inputs[0]) in (3, 4) and "cl" in lays:
            xs, lay = [env.cl(t) for t in L.inputs], "cl"
        else:
            xs, lay = [env.lg(t) for t in L.inputs], "lg"
        y = qeltwise_int(xs, L)
    elif op in ("concat", "rescale"):
        r = env.rank(L.inputs[0])
        if r in (3, 4):
            xs, lay = [env.cl(t) for t in L.inputs], "cl"
            axis = _CL_AXIS[r][L.axis] if op == "concat" else 0
        else:
            xs, lay = [env.lg(t) for t in L.inputs], "lg"
            axis = L.axis
        parts = qeltwise_int(xs, L)
        y = parts[0] if op == "rescale" else np.concatenate(parts, axis=axis)
    elif op == "clip":
        x, lay = env.any(L.input)
        y = np.clip(x, L.lo, L.hi) if (L.lo > -128 or L.hi < 127) else x
    elif op == "lut":
        x, lay = env.any(L.input)
        y = qlut_int(x, L)
    elif op == "reshape":
        y, lay = env.lg(L.input).reshape(L.attr), "lg"
    elif op == "transpose":
        x = env.lg(L.input)
        perm = L.attr
        if x.ndim == 4:  # produce channel-last directly: logical perm then (0,2,3,1)
            y, lay = np.ascontiguousarray(x.transpose([perm[i] for i in (0, 2, 3, 1)])), "cl"
        else:
            y, lay = np.ascontiguousarray(x.transpose(perm)), "lg"
    elif op == "float":
        y, lay = _run_qfloat(qg, env, L), "lg"
    else:
        raise DnnfabError(f"layer {L.name!r}: unknown integer op {op!r}")
    env.put(L.output, y, lay)


def _run_qfloat(qg, env, L):
    xs = []
    for t in L.inputs:
        p = qg.qtensors[t]
        xs.append(dequantize_tensor(env.lg(t), p.scale, p.zero_point))
    with np.errstate(all="ignore"):
        y = run_float_layer(L.layer, xs)[0]
    p = qg.qtensors[L.output]
    y = np.nan_to_num(y, nan=0.0, posinf=3e38, neginf=-3e38)
    return quantize_tensor(y, p.scale, p.zero_point)


# ====================================================================== compiled plan
_FAST_PLAN = {"on": os.environ.get("DNNFAB_FAST_PLAN", "1") != "0"}
_U8 = np.uint8
_BYTE_VALUES = np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8).astype(np.int64)


def set_fast_plan(on):
    """Enable/disable the compiled :class:`FastPlan` executor of :func:`run_reference`
    (default on; ``DNNFAB_FAST_PLAN=0`` turns it off). Returns the previous setting."""
    old = _FAST_PLAN["on"]
    _FAST_PLAN["on"] = bool(on)
    return old


def fast_plan(qg):
    """The :class:`FastPlan` of ``qg``, built on first use and cached on the graph."""
    key = tuple(id(L) for L in qg.layers)
    plan = qg.__dict__.get("_fast_plan")
    if plan is None or plan.key != key:
        plan = FastPlan(qg)
        plan.key = key
        qg.__dict__["_fast_plan"] = plan
    return plan


class _OrtDepthwise:
    """Depthwise conv accumulators (no bias) via onnxruntime float ``Conv``: int8 NHWC in,
    float32 NHWC out. Exact because every product and partial sum is an integer of
    magnitude <= 128 * sum|w[c]| <= 2^24 (checked by the caller), so float32 holds each
    one exactly whatever the summation order or FMA use."""

    def __init__(self, L, shape_cl):
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        n_, h, w, c = shape_cl
        cout, _, kh, kw = L.qweight.shape
        t, l, b, r = L.pad
        nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                 helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2])]
        inits = [numpy_helper.from_array(L.qweight.astype(np.float32), "w")]
        src = "xt"
        if any(L.pad):
            inits += [numpy_helper.from_array(np.array([0, 0, t, l, 0, 0, b, r], np.int64), "p"),
                      numpy_helper.from_array(np.array(float(L.zx), np.float32), "pv")]
            nodes.append(helper.make_node("Pad", ["xt", "p", "pv"], ["xp"]))
            src = "xp"
        nodes += [helper.make_node("Conv", [src, "w"], ["yc"], group=c, kernel_shape=[kh, kw],
                                   strides=list(L.stride), dilations=list(L.dilation),
                                   pads=[0, 0, 0, 0]),
                  helper.make_node("Transpose", ["yc"], ["y"], perm=[0, 2, 3, 1])]
        g = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info(
            "x", TensorProto.INT8, [n_, h, w, c])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = min(model.ir_version, 9)
        so = ort.SessionOptions()
        so.intra_op_num_threads = _threads()
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])

    def __call__(self, x):
        return self.sess.run(None, {"x": x})[0]


class FastPlan:
    """Compiled executor of a :class:`~dnnfab.sw.quantize.QuantizedGraph`, bit-identical to
    running :func:`run_layer` layer by layer (the tests compare both on randomized zoo
    models). Built once per graph; what it changes:

    * **channel shuffle** ``conv -> reshape [N, g, C/g, H, W] -> transpose (0, 2, 1, 3, 4)
      -> reshape [N, C, H, W]`` (ShuffleNet) becomes one conv whose output channels are
      permuted (weights, bias, m, n permuted; grouped convs as block-diagonal dense
      weights, whose zeros add nothing), when the intermediate tensors have no other use;
    * **depthwise convs** sum their taps in onnxruntime float ``Conv`` (exact, see
      :class:`_OrtDepthwise`; verified against the numpy kernel on first use), then the
      usual exact requantize;
    * **two-input add**: one 65536-entry table of the contract's int64 formula indexed by
      the two input bytes; **concat / rescale**: a 256-entry table per non-identity input.
      Tables hold exactly what :func:`qeltwise_int_slow` computes for every input code.

    Everything else runs :func:`run_layer`.
    """

    def __init__(self, qg):
        self.qg = qg
        outputs = {t.name for t in qg.outputs}
        cons = {}
        for L in qg.layers:
            for t in L.inputs:
                cons.setdefault(t, []).append(L)
        skip = set()
        self.steps = []
        for L in qg.layers:
            if id(L) in skip:
                continue
            step = None
            if L.op == "conv":
                step = self._conv_step(L, cons, outputs, skip)
            elif L.op == "add":
                step = self._add_step(L)
            elif L.op in ("concat", "rescale"):
                step = self._concat_step(L)
            if step is None:
                step = (lambda env, L=L: run_layer(qg, env, L))
            self.steps.append(step)

    def run(self, env):
        for step in self.steps:
            step(env)
        return env

    # ---------------------------------------------------------------- conv
    def _shuffle_after(self, L, cons, outputs):
        qg = self.qg

        def only(t):
            c = cons.get(t, [])
            return c[0] if len(c) == 1 and t not in outputs else None

        r1 = only(L.output)
        if r1 is None or r1.op != "reshape":
            return None
        tr = only(r1.output)
        if tr is None or tr.op != "transpose" or tuple(tr.attr) != (0, 2, 1, 3, 4):
            return None
        r2 = only(tr.output)
        if r2 is None or r2.op != "reshape":
            return None
        s0, s1, s3 = (tuple(qg.shape(t)) for t in (L.output, r1.output, r2.output))
        if len(s0) != 4 or len(s1) != 5 or s3 != s0:
            return None
        n_, c, h, w = s0
        if s1[0] != n_ or s1[3:] != (h, w) or s1[1] * s1[2] != c:
            return None
        g, cpg = s1[1], s1[2]
        perm = np.arange(c).reshape(g, cpg).T.reshape(-1)  # new channel j*g+i <- i*cpg+j
        return perm, (r1, tr, r2)

    @staticmethod
    def _rq(L, bias, fallback):
        r = Requant32(L.m, L.n, L.zy, L.lo, L.hi, bias)
        return r if r.ok else fallback

    def _conv_step(self, L, cons, outputs, skip):
        import dataclasses
        cout, cig, kh, kw = L.qweight.shape
        g = L.groups
        shape = tuple(self.qg.shape(L.input))
        if len(shape) == 3:
            shape_cl = (shape[0], 1, shape[2], shape[1])
        elif len(shape) == 4:
            shape_cl = (shape[0], shape[2], shape[3], shape[1])
        else:
            return None
        n_, h, w, _ = shape_cl
        t, l, b, r = L.pad
        ho = (h + t + b - (kh - 1) * L.dilation[0] - 1) // L.stride[0] + 1
        wo = (w + l + r - (kw - 1) * L.dilation[1] - 1) // L.stride[1] + 1
        if cig == 1 and g > 1 and cout == g:
            return self._depthwise_step(L, shape_cl)
        out = L.output
        fused = self._shuffle_after(L, cons, outputs)
        if fused is not None and g <= BLOCK_DIAG_MAX_GROUPS:
            perm, chain = fused
            cog = cout // g
            dense = np.zeros((cout, cig * g, kh, kw), np.int8)
            for i in range(g):
                dense[i * cog:(i + 1) * cog, i * cig:(i + 1) * cig] = \
                    L.qweight[i * cog:(i + 1) * cog]
            L = dataclasses.replace(
                L, qweight=dense[perm], bias=L.bias[perm], m=L.m[perm], n=L.n[perm], groups=1,
                sw=None if L.sw is None else L.sw[perm],
                bias_q=None if L.bias_q is None else L.bias_q[perm], cache={})
            out = chain[-1].output
            skip.update(id(x) for x in chain)
        c = _conv_prep(L)
        rq = self._rq(L, L.bias, c["rq"])
        rq_u8 = self._rq(L, c["rq_u8"].bias, c["rq_u8"])
        oshape = (n_, ho, wo, cout)

        def step(env):
            acc, use_ort = _conv_acc(env.cl(L.input), L, c, ho, wo)
            env.put(out, (rq_u8 if use_ort else rq)(acc).reshape(oshape), "cl")
        return step

    def _depthwise_step(self, L, shape_cl):
        cout = L.qweight.shape[0]
        c = _conv_prep(L)
        if 128 * int(np.abs(L.qweight.astype(np.int64)).reshape(cout, -1).sum(1).max()) > 2**24:
            return None
        rq = self._rq(L, L.bias, c["rq"])
        state = {}

        def step(env):
            x = env.cl(L.input)
            if "ort" not in state:
                ref = qconv_int(x, L)
                try:
                    ortc = _OrtDepthwise(L, shape_cl)
                    ok = np.array_equal(rq(ortc(x)), ref)
                except Exception:
                    ok = False
                state["ort"] = ortc if ok else None
                y = ref
            elif state["ort"] is None:
                y = qconv_int(x, L)
            else:
                y = rq(state["ort"](x))
            env.put(L.output, y, "cl")
        return step

    # ---------------------------------------------------------------- add / concat
    def _add_step(self, L):
        qg = self.qg
        if len(L.inputs) != 2 or tuple(qg.shape(L.inputs[0])) != tuple(qg.shape(L.inputs[1])):
            return None
        v = _BYTE_VALUES
        acc = (v[:, None] - int(L.z[0])) * int(L.k[0]) + (v[None, :] - int(L.z[1])) * int(L.k[1])
        table = requantize(acc, L.m, L.n, L.zy, L.lo, L.hi).reshape(-1)
        a, b = L.inputs
        rank = len(qg.shape(a))

        def step(env):
            lays = (env.v[a][1], env.v[b][1])
            if rank in (3, 4) and "cl" in lays:
                x0, x1, lay = env.cl(a), env.cl(b), "cl"
            else:
                x0, x1, lay = env.lg(a), env.lg(b), "lg"
            idx = np.left_shift(x0.view(_U8), 8, dtype=np.uint16)
            idx |= x1.view(_U8)
            env.put(L.output, np.take(table, idx), lay)
        return step

    def _concat_step(self, L):
        qg = self.qg
        tables = []
        for i, (k, z) in enumerate(zip(L.k, L.z)):
            if L.identity and L.identity[i] and L.lo == -128 and L.hi == 127:
                tables.append(None)
            else:
                tables.append(requantize((_BYTE_VALUES - int(z)) * int(k), L.m, L.n, L.zy,
                                         L.lo, L.hi))
        r = len(qg.shape(L.inputs[0]))
        op = L.op

        def step(env):
            if r in (3, 4):
                xs, lay = [env.cl(t) for t in L.inputs], "cl"
                axis = _CL_AXIS[r][L.axis] if op == "concat" else 0
            else:
                xs, lay = [env.lg(t) for t in L.inputs], "lg"
                axis = L.axis
            parts = [x if tb is None else np.take(tb, x.view(_U8)) for x, tb in zip(xs, tables)]
            y = parts[0] if op == "rescale" else np.concatenate(parts, axis=axis)
            env.put(L.output, y, lay)
        return step

"""The integer reference network: executes a :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph`
exactly as the contract (docs/contract.md) says. It is the golden model the fabric, the
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
  chunks are added in int32. Large GEMMs go to onnxruntime ``MatMulInteger`` instead,
  **uint8 x uint8** (see :class:`_OrtMatMulInteger`): the activations are shifted by +128
  (``x ^ 0x80`` on the bit pattern) and ``-128 * sum(w[c])`` is folded into the bias; the
  weights are stored shifted by +128 too, with ``b_zero_point = 128``, so the session
  returns ``(x + 128) @ w`` in int32. uint8 x int8 is *not* used: on x86 CPUs without
  VNNI onnxruntime sums u8*s8 product pairs in saturating int16 (``vpmaddubsw``) and is
  wrong on most outputs of a random product; no such instruction exists for u8 x u8, so
  every u8 x u8 kernel widens to 16 bits and accumulates in int32 -- exact by
  construction, on every CPU, with no run-time probe (the tests compare both engines with
  int64 on extreme values wherever they run). Used when ``255 * 255 * K < 2^31`` (no
  int32 intermediate can overflow, whatever the order of the zero-point fix-up).
  Requantize runs in float64, which is exact here: ``acc * m`` < 2^46 and ``m * 2^-n`` is
  a 15-bit mantissa, so ``floor(acc * (m 2^-n) + 1/2)`` equals ``(acc*m + 2^(n-1)) >> n``.
* slow (``qconv_int_slow``, ``qgemm_int_slow``, ... in :mod:`dnnfab.sw.ref.golden`): loops
  with int64 arithmetic and the literal contract formula; the property tests pin the fast
  path down to them.

``Options.gemm_engine`` (``"numpy" | "ort" | "auto"``, :mod:`dnnfab.sw.cpu.options`) chooses
the GEMM engine (default ``auto``); every function that runs GEMMs takes the options.

Network executor: :func:`run_reference` runs a compiled :class:`FastPlan` of the graph
(fused ShuffleNet channel shuffles, onnxruntime float depthwise/first convs, table-driven
add and concat, integer-clamp requantize :class:`Requant32`), bit-identical to calling
:func:`run_layer` layer by layer, which it does with an observer or with
``Options(fast_plan=False)`` (``DNNFAB_FAST_PLAN=0``).
"""

from __future__ import annotations

import functools
import weakref

import numpy as np

from ...errors import DnnfabError
from . import kernels as _K
from .engines import is_qlrn
from .options import Options
from ..ir.graph import from_cl, pad_nhwc, run_float_layer, to_cl, windows_nhwc
from ..ref.golden import pool_geom
from ..ir.qgraph import (QAvgPool, QClip, QConv, QEltwise, QFloat, QGemm, QLayout, QLut,
                       QMaxPool, dequantize_tensor, quantize_tensor, requantize)

K_CHUNK = 1024           # int8*int8 partial sums in float32 stay exact below 2^24
BLOCK_DIAG_MAX_GROUPS = 8
GROUPED_MAX_ROWS = 256   # grouped 1x1 convs with <= this many output pixels: per-group GEMMs
ORT_MIN_MACS = 1 << 12   # below this numpy BLAS beats the ~5 us session call
ORT_SINGLE_THREAD_MACS = 24 << 20  # smaller GEMMs run single-threaded (see PreparedGemm.ort)
#: largest K of the uint8 x uint8 engine: 255 * 255 * K < 2^31 (no int32 overflow at all)
ORT_MAX_K = (2**31 - 1) // (255 * 255)
#: the built-in defaults (no environment): what a kernel called without options uses
_DEFAULT = Options()


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
    """The requantize of :class:`Requant` with the clamp done on the int32 accumulators and,
    when every ``n <= 24``, the rest in uint32 arithmetic (~2x faster than float64); used by
    :class:`FastPlan`. ``rq(acc) == requantize(acc + bias, m, n, zy, lo, hi)`` for int32
    ``acc`` (or float32 holding exact integers) of shape [..., C], C-contiguous.

    Derivation (per channel; a = acc + bias, y(a) = zy + floor((a*m + 2^(n-1)) / 2^n) is
    non-decreasing in a):

    * ``A_lo`` = least a with y(a) >= lo, ``A_hi`` = largest a with y(a) <= hi. When
      y(A_lo) == lo and y(A_hi) == hi (checked; true whenever m*2^-n <= 1), clamping a to
      [A_lo, A_hi] (acc to [A_lo - bias, A_hi - bias], intersected with int32) gives
      y = clamp(y(a), lo, hi) exactly, so no clamp is needed afterwards.
    * uint32 form (all n <= 24): with d = a - A_lo >= 0, y + 128 = floor(V / 2^n) where
      V = d*m + c0, c0 = A_lo*m + 2^(n-1) + (zy + 128)*2^n >= 0 and V < (hi + 129)*2^n
      <= 2^32. V is formed as ``acc*m + (c0 - (A_lo - bias)*m)`` in wrapping uint32
      arithmetic; its true value lies in [0, 2^32) (checked exactly per channel), so the
      wrapped result is V itself, and ``V >> n`` is the answer.
    * otherwise (some 24 < n <= 44): t = acc*M + C in float64 as in :class:`Requant` (exact),
      now known to lie in [lo + 128, hi + 129), so truncation to uint8 is the floor.

    ``ok`` is False (callers use :class:`Requant`) when a channel does not fit: n > 44, an
    output clamp narrower than one output step, or a window outside int32.
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
        self.split = any(nc > 24 for nc in n)
        blos, bhis, mus, kus = [], [], [], []
        lo32, hi32 = -2**31, 2**31 - 1
        for mc, nc, bc in zip(m, n, b):
            if not (1 <= nc <= 44 and 0 < mc < 2**15):
                return
            h = 1 << (nc - 1)
            a_lo = -((h - (lo - zy) * 2**nc) // mc)               # ceil((L 2^n - h) / m)
            a_hi = ((hi - zy + 1) * 2**nc - h - 1) // mc
            blo, bhi = max(a_lo - bc, lo32), min(a_hi - bc, hi32)
            if a_lo > a_hi or blo > bhi or zy + ((a_lo * mc + h) >> nc) != lo or \
                    zy + ((a_hi * mc + h) >> nc) != hi:
                return  # clamping a must reproduce the output clamp exactly
            blos.append(blo)
            bhis.append(bhi)
            if not self.split:
                c0 = a_lo * mc + h + (zy + 128) * 2**nc
                v_min = (blo + bc - a_lo) * mc + c0
                v_max = (bhi + bc - a_lo) * mc + c0
                if v_min < 0 or v_max >= 2**32:
                    return
                mus.append(mc)
                kus.append((c0 - (a_lo - bc) * mc) % 2**32)
        self.ok = True
        self.lo_v = np.array(blos, np.int32)
        self.hi_v = np.array(bhis, np.int32)
        if self.split:
            self.M = _mult64(m, n)
            self.C = np.asarray(b, np.float64) * self.M + (0.5 + zy + 128)
        else:
            self.mu = np.array(mus, np.uint32)
            self.ku = np.array(kus, np.uint32)
            self.r = np.array(n, np.uint32)
            self.r_scalar = n[0] if len(set(n)) == 1 else None
        self._tiles = {}

    def _tiled(self, rows):
        t = self._tiles.get(rows)
        if t is None:
            k = 1
            for d in range(max(1, min(rows, self.TILE // max(self.c, 1))), 0, -1):
                if rows % d == 0:
                    k = d
                    break
            names = ("lo_v", "hi_v") + (("M", "C") if self.split else ("mu", "ku", "r"))
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
            t = a.astype(np.float64)
            t *= tiles[3]
            t += tiles[4]
            y = t.astype(np.uint8)
        else:
            u = a.view(np.uint32)
            u *= tiles[3]
            u += tiles[4]
            u >>= (self.r_scalar if self.r_scalar is not None else tiles[5])
            y = u.astype(np.uint8)
        y ^= np.uint8(0x80)
        return y.view(np.int8).reshape(shape)


def _per_channel(c, bias, m, n):
    """(bias, m, n) as contiguous int64 [c] arrays (bias None -> zeros)."""
    b = np.zeros(c, np.int64) if bias is None else np.broadcast_to(np.asarray(bias, np.int64), (c,))
    return tuple(np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.int64), (c,)))
                 for v in (b, m, n))


class RequantK:
    """The requantize of :class:`Requant` as one fused pass
    (:func:`dnnfab.sw.cpu.kernels.requant_rows`, literal int64 contract arithmetic), for
    accumulators of shape [..., C] (int32/int64 or float32/64 holding exact integers)."""

    ok = True

    def __init__(self, m, n, zy, lo, hi, bias=None, dst=None):
        self.c = int(np.size(m)) if np.ndim(m) else (1 if bias is None else int(np.size(bias)))
        self.bias, self.m, self.n = _per_channel(self.c, bias, m, n)
        self.zy, self.lo, self.hi = int(zy), int(lo), int(hi)
        #: accumulator column of output channel k (a fused channel shuffle), else None
        self.src = None if dst is None else np.ascontiguousarray(np.argsort(dst), dtype=np.int64)

    def __call__(self, acc):
        shape = acc.shape
        a = np.ascontiguousarray(acc).reshape(-1, self.c)
        y = np.empty(a.shape, np.int8)
        p = (self.bias, self.m, self.n, self.zy, self.lo, self.hi)
        if self.src is None:
            _K.requant_rows(a, *p, y)
        else:
            _K.requant_rows_perm(a, *p, self.src, y)
        return y.reshape(shape)

    def add(self, acc, other, add, first):
        """``rq`` fused with the residual ``add`` (a QEltwise) whose other input is
        ``other`` (int8, output channel order, same shape as the result); ``first``: the
        conv is the add's input 0."""
        a = np.ascontiguousarray(acc).reshape(-1, self.c)
        y = np.empty(a.shape, np.int8)
        p = (self.bias, self.m, self.n, self.zy, self.lo, self.hi)
        q = (np.ascontiguousarray(other).reshape(-1, self.c), first,
             int(add.k[0]), int(add.z[0]), int(add.k[1]), int(add.z[1]),
             int(add.m), int(add.n), int(add.zy), int(add.lo), int(add.hi), y)
        if self.src is None:
            _K.requant_add(a, *p, *q)
        else:
            _K.requant_add_perm(a, *p, self.src, *q)
        return y


def _lut1(x, table, numba=True):
    """``table[x & 0xff]`` for int8 ``x`` (one pass with numba, else ``np.take``)."""
    if numba and _K.AVAILABLE and x.flags.c_contiguous:
        y = np.empty(x.shape, np.int8)
        _K.lut1(x.reshape(-1), table, y.reshape(-1))
        return y
    return np.take(table, x.view(np.uint8))


# ====================================================================== int GEMM
#: True only inside the CPU workers' *native* helper process (procpool.serve_native), after
#: it made onnxruntime's process-wide thread pool: every session there must use that pool
#: (onnxruntime refuses per-session threads once it exists). Never set in a user's process.
_GLOBAL_POOL = False


def _ort_session(nodes, inputs, outputs, inits, threads):
    """An onnxruntime CPU session of a small opset-13 graph, with ``threads`` intra-op
    threads (``Options.threads``, or 1) that sleep rather than spin when idle: the plan
    holds one session per layer, and dozens of spinning pools starve the Python thread
    between calls."""
    import onnxruntime as ort
    from onnx import helper
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 9)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if _GLOBAL_POOL:
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _u8_weights(w):
    """int8 weights as the uint8 ``w + 128`` of the u8 x u8 engine (``w ^ 0x80``)."""
    return np.ascontiguousarray(w, dtype=np.int8).view(np.uint8) ^ np.uint8(0x80)


def _matmul_u8u8_node(from_array, a, w_kn, y, tag=""):
    """A ``MatMulInteger(a, w + 128, 0, 128)`` node and its initializers: uint8 x uint8
    with the weight zero point 128, i.e. ``a @ w`` for int8 ``w`` (see the module
    docstring for why not uint8 x int8)."""
    from onnx import helper
    wn, az, wz = f"w{tag}", f"az{tag}", f"wz{tag}"
    inits = [from_array(_u8_weights(w_kn), wn), from_array(np.array(0, np.uint8), az),
             from_array(np.array(128, np.uint8), wz)]
    return helper.make_node("MatMulInteger", [a, wn, az, wz], [y]), inits


class _OrtMatMulInteger:
    """Cached onnxruntime session computing uint8 [M, K] x int8 [K, N] -> int32, exactly:
    the session multiplies uint8 by the uint8 ``w + 128`` with weight zero point 128
    (u8 x u8 kernels accumulate in int32, never in saturating int16; callers keep
    ``255 * 255 * K < 2^31``)."""

    def __init__(self, w_kn, threads):
        from onnx import TensorProto, helper, numpy_helper
        k, n = w_kn.shape
        node, inits = _matmul_u8u8_node(numpy_helper.from_array, "a", w_kn, "y")
        self.sess = _ort_session(
            [node], [helper.make_tensor_value_info("a", TensorProto.UINT8, ["M", k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", n])], inits, threads)

    def __call__(self, a_u8):
        return self.sess.run(None, {"a": a_u8})[0]


class _OrtGroupedMatMulInteger:
    """One onnxruntime session computing a grouped 1x1 convolution's accumulators:
    uint8 [M, g*K] -> Split into g column blocks -> MatMulInteger with int8 [K, N] each ->
    Concat -> int32 [M, g*N]. Exact like :class:`_OrtMatMulInteger` (the same uint8 x uint8
    form, ``255 * 255 * K < 2^31`` checked here); for small M it beats
    one dense GEMM with a block-diagonal weight matrix (g times the MACs): measured 25 vs
    37 us (M=196, g=4, K=N=68) and 17 vs 35 us (M=49, K=N=136), single-threaded."""

    def __init__(self, ws, threads=1):
        from onnx import TensorProto, helper, numpy_helper
        g = len(ws)
        k = ws[0].shape[0]
        if k > ORT_MAX_K:
            raise ValueError(f"K = {k} > {ORT_MAX_K}: the int32 accumulators could overflow")
        nodes = [helper.make_node("Split", ["a", "sp"], [f"a{i}" for i in range(g)], axis=1)]
        inits = [numpy_helper.from_array(np.full(g, k, np.int64), "sp")]
        for i, w in enumerate(ws):
            node, more = _matmul_u8u8_node(numpy_helper.from_array, f"a{i}", w, f"y{i}", str(i))
            nodes.append(node)
            inits += more
        nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(g)], ["y"], axis=1))
        self.sess = _ort_session(
            nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, ["M", g * k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits, threads)

    def __call__(self, a_u8):
        return self.sess.run(None, {"a": a_u8})[0]


@functools.cache
def _ort_available():
    """True when onnxruntime can be imported (checked once). This is not an exactness
    check: the uint8 x uint8 engine is exact by construction (see the module docstring)."""
    try:
        import onnxruntime  # noqa: F401
        return True
    except ImportError:
        return False


class PreparedGemm:
    """Weights of one GEMM ([K, N] int8) in the forms the engines want, cached per layer.

    ``colsum`` = sum over K per output column (int64), used to fold the +128 shift.
    ``ort_safe``: ``K <= ORT_MAX_K`` (255 * 255 * K < 2^31), so no int32 sum of the
    uint8 x uint8 MatMulInteger can overflow.
    """

    def __init__(self, w_kn):
        self.w = np.ascontiguousarray(w_kn, dtype=np.int8)
        self.k, self.n = self.w.shape
        self.wf = self.w.astype(np.float32)
        self.colsum = self.w.astype(np.int64).sum(axis=0)
        self.ort_safe = self.k <= ORT_MAX_K
        self._ort = None

    def use_ort(self, m, eng="auto"):
        """Whether a GEMM of ``m`` rows runs on onnxruntime with engine ``eng``
        (``Options.gemm_engine``)."""
        if eng == "numpy" or not self.ort_safe:
            return False
        if eng == "auto" and m * self.k * self.n < ORT_MIN_MACS:
            return False
        return _ort_available()

    def ort(self, m=None, threads=None):
        """The onnxruntime session for ``m`` rows: single-threaded below
        :data:`ORT_SINGLE_THREAD_MACS` (waking a sleeping pool thread costs more than it
        saves there; measured 1.2-1.3x faster for 13-15 M MACs), else ``threads``
        (``Options.threads``; default the built-in one)."""
        threads = 1 if m is not None and m * self.k * self.n < ORT_SINGLE_THREAD_MACS \
            else (threads or _DEFAULT.threads)
        if self._ort is None:
            self._ort = {}
        sess = self._ort.get(threads)
        if sess is None:
            sess = self._ort[threads] = _OrtMatMulInteger(self.w, threads)
        return sess

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


def int_matmul(a_i8, prep, options=_DEFAULT):
    """Exact int8 [M, K] x int8 [K, N] -> integer accumulators (int32 or exact float32)."""
    if prep.use_ort(a_i8.shape[0], options.gemm_engine):
        a_u8 = a_i8.view(np.uint8) ^ np.uint8(0x80)
        return prep.ort(a_u8.shape[0], options.threads)(a_u8) - 128 * prep.colsum
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


def qconv_int(x, L, options=_DEFAULT):
    """Integer convolution of the contract. x: int8 channel-last [N, H, W, Cin] (1-D: H=1);
    L: :class:`~dnnfab.sw.ir.qgraph.QConv`. Returns int8 [N, Ho, Wo, Cout]."""
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
    acc, use_ort = _conv_acc(x, L, c, ho, wo, options)
    y = (c["rq_u8"] if use_ort else c["rq"])(acc)
    return y.reshape(n_, ho, wo, cout)


def _conv_acc(x, L, c, ho, wo, options=_DEFAULT):
    """GEMM part of a non-depthwise :func:`qconv_int`: ([M, Cout] accumulators without the
    bias, True if they are for uint8 (+128) activations, i.e. need ``rq_u8``)."""
    cout, cig, kh, kw = L.qweight.shape
    n_, h, w, cin = x.shape
    groups = c["groups"]
    m = n_ * ho * wo
    use_ort = groups[0].use_ort(m, options.gemm_engine)
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
        accs.append(prep.ort(m, options.threads)(cols) if use_ort else prep.matmul_f32(cols))
    acc = accs[0] if len(accs) == 1 else np.concatenate(accs, axis=1)
    return acc, use_ort


# ====================================================================== gemm
def _gemm_prep(L):
    c = L.cache
    if "prep" not in c:
        c["prep"] = PreparedGemm(L.qweight.T)
        c["rq"] = Requant(L.m, L.n, L.zy, L.lo, L.hi, L.bias)
    return c


def qgemm_int(x, L, options=_DEFAULT):
    """Integer fully connected layer: x int8 [M, K] -> int8 [M, N] (:class:`QGemm`)."""
    c = _gemm_prep(L)
    acc = int_matmul(np.ascontiguousarray(x), c["prep"], options)
    return c["rq"](acc)


# ====================================================================== pools / eltwise
def qmaxpool_int(x, L):
    """Max pool on int8 channel-last data; padding is -128 (never wins). Exact."""
    pads, ho, wo = pool_geom(L, x)
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
    pads, ho, wo = pool_geom(L, x)
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

    def layout(self, name):
        """'cl' or 'lg': how ``name`` is stored now."""
        return self.v[name][1]

    def empty(self, shape, dtype):
        """A new array for a layer's output (the CPU workers' process pool gives shared
        memory here, see workers.py)."""
        return np.empty(shape, dtype)


def run_reference(qg, feed_q, observer=None, fast=None, options=None):
    """Run the integer network on int8 inputs ``feed_q`` {name: int8 logical array}.

    Returns ``{output name: int8 array}`` in the logical (ONNX) layout. ``observer(name,
    int8 logical array)`` is called for every tensor (slow: converts layouts).

    Without an observer the network runs through a compiled :class:`FastPlan` (fused
    channel shuffles, table add/rescale, onnxruntime depthwise convs; bit-identical, see
    the class docstring); ``fast=False`` (or ``Options(fast_plan=False)``) forces the plain
    layer-by-layer executor. ``options``: an :class:`~dnnfab.sw.cpu.options.Options`
    (default :meth:`Options.from_env() <dnnfab.sw.cpu.options.Options.from_env>`)."""
    if options is None:
        options = Options.from_env()
    env = Env(qg)
    for t in qg.inputs:
        x = np.asarray(feed_q[t.name])
        if x.dtype != np.int8:
            raise DnnfabError(f"run_reference needs int8 inputs; got {x.dtype} for {t.name!r}")
        env.put(t.name, x, "lg")
    if fast is None:
        fast = options.fast_plan
    if fast and observer is None:
        fast_plan(qg, options).run(env)
        return {t.name: env.lg(t.name) for t in qg.outputs}
    for L in qg.layers:
        run_layer(qg, env, L, options)
        if observer:
            observer(L.output, env.lg(L.output))
    return {t.name: env.lg(t.name) for t in qg.outputs}


def run_layer(qg, env, L, options=_DEFAULT):
    """Execute one integer layer, reading/writing tensors in ``env`` (an :class:`Env`)."""
    op = L.op
    if op == "conv":
        y, lay = qconv_int(env.cl(L.input), L, options), "cl"
    elif op == "gemm":
        x = env.lg(L.input)
        shp = x.shape
        y = qgemm_int(x.reshape(-1, shp[-1]), L, options).reshape(shp[:-1] + (L.qweight.shape[0],))
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
    elif op == "float" and is_qlrn(L):
        y, lay = _run_qlrn(qg, env, L, options), "lg"
    elif op == "float":
        y, lay = _run_qfloat(qg, env, L), "lg"
    else:
        raise DnnfabError(f"layer {L.name!r}: unknown integer op {op!r}")
    env.put(L.output, y, lay)


def lrn_params(qg, L):
    """(z, lo_w, hi_w, table, zy) of a quantized LRN layer ``L`` (a QFloat of ONNX
    ``LRN``): the input zero point, the channel window ``[c - lo_w, c + hi_w]``, the
    float64 table of :func:`lrn_table` and the output zero point."""
    a = L.layer.attrs["onnx_attrs"]
    size = int(a["size"])
    pi, po = qg.qtensors[L.inputs[0]], qg.qtensors[L.output]
    z = int(pi.zero_point)
    table = lrn_table(float(np.float32(pi.scale)), z, float(np.float32(po.scale)),
                      float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)),
                      float(a.get("bias", 1.0)), size)
    return z, (size - 1) // 2, size // 2, table, int(po.zero_point)


@functools.lru_cache(maxsize=32)
def lrn_table(s_in, z, s_out, alpha, beta, bias, size):
    """The quantized LRN's table: entry ``W`` (an exact integer window sum of squared
    input codes ``(q - z)^2``, 0 .. size * max(q - z)^2) is the factor that maps a code
    ``d = q - z`` to the output code before rounding,
    ``s_in / s_out * (bias + alpha / size * s_in^2 * W)^-beta``, in float64 (non-finite
    entries clamped). ONNX LRN on the dequantized input, with the window sum exact: every
    engine reads this one table, so they agree to the bit on any CPU."""
    dmax = max(abs(-128 - z), abs(127 - z))
    wv = np.arange(size * dmax * dmax + 1, dtype=np.float64)
    with np.errstate(all="ignore"):
        t = s_in / s_out * np.power(bias + alpha / size * (s_in * s_in) * wv, -beta)
    t = np.nan_to_num(t, nan=0.0, posinf=1e300, neginf=-1e300)
    t.flags.writeable = False
    return t


def qlrn_rows(x2, z, lo_w, hi_w, table, zy, numba=True):
    """Quantized LRN of channel-last int8 rows ``x2`` [rows, C] (see :func:`lrn_table`)."""
    if numba and _K.AVAILABLE:
        return _K.lrn_rows(x2, z, lo_w, hi_w, table, zy, 0, x2.shape[0],
                           np.empty_like(x2))
    rows, c = x2.shape
    d = x2.astype(np.int64) - z
    cs = np.zeros((rows, c + 1), np.int64)
    np.cumsum(d * d, axis=1, out=cs[:, 1:])
    j = np.arange(c)
    w = cs[:, np.minimum(j + hi_w, c - 1) + 1] - cs[:, np.maximum(j - lo_w, 0)]
    v = np.rint(d.astype(np.float64) * table[w]) + zy
    return np.clip(v, -128, 127).astype(np.int8)


def _run_qlrn(qg, env, L, options=_DEFAULT):
    z, lo_w, hi_w, table, zy = lrn_params(qg, L)
    x = env.lg(L.inputs[0])
    xc = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    y = qlrn_rows(xc.reshape(-1, xc.shape[-1]), z, lo_w, hi_w, table, zy,
                  options.numba).reshape(xc.shape)
    return np.ascontiguousarray(np.moveaxis(y, -1, 1))


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
_U8 = np.uint8
_BYTE_VALUES = np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8).astype(np.int64)


_PLANS = weakref.WeakKeyDictionary()


def fast_plan(qg, options=_DEFAULT):
    """The :class:`FastPlan` of ``qg`` for ``options``, built on first use and cached
    (weakly) per graph; rebuilt when the graph's layer list or the options change."""
    key = (tuple(id(L) for L in qg.layers), options)
    plan = _PLANS.get(qg)
    if plan is None or plan.key != key:
        plan = FastPlan(qg, options)
        plan.key = key
        _PLANS[qg] = plan
    return plan


class _OrtFloatConv:
    """Convolution accumulators (no bias) via onnxruntime float ``Conv``: int8 in (NHWC, or
    the logical NCHW when ``channel_first``), float32 NHWC out. Exact because every product
    and partial sum is an integer of magnitude <= 128 * sum|w[c]| <= 2^24 (checked by the
    caller), so float32 holds each one exactly whatever the summation order or FMA use."""

    def __init__(self, L, shape_cl, channel_first=False, pool=None, threads=None):
        from onnx import TensorProto, helper, numpy_helper
        n_, h, w, c = shape_cl
        cout, _, kh, kw = L.qweight.shape
        t, l, b, r = L.pad
        nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)]
        if channel_first:
            nodes.append(helper.make_node("Identity", ["xf"], ["xt"]))
            shape_in = [n_, c, h, w]
        else:
            nodes.append(helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2]))
            shape_in = [n_, h, w, c]
        inits = [numpy_helper.from_array(L.qweight.astype(np.float32), "w")]
        src = "xt"
        if any(L.pad):
            inits += [numpy_helper.from_array(np.array([0, 0, t, l, 0, 0, b, r], np.int64), "p"),
                      numpy_helper.from_array(np.array(float(L.zx), np.float32), "pv")]
            nodes.append(helper.make_node("Pad", ["xt", "p", "pv"], ["xp"]))
            src = "xp"
        nodes += [helper.make_node("Conv", [src, "w"], ["yc"], group=L.groups,
                                   kernel_shape=[kh, kw], strides=list(L.stride),
                                   dilations=list(L.dilation), pads=[0, 0, 0, 0])]
        if pool is not None:  # max pool of the accumulators (see FastPlan): exact
            pt, pl, pb, pr = pool.pad
            eb, er = pool.extra
            nodes.append(helper.make_node(
                "MaxPool", ["yc"], ["ym"], kernel_shape=list(pool.kernel),
                strides=list(pool.stride), dilations=list(pool.dilation),
                pads=[pt, pl, pb + eb, pr + er]))
        nodes.append(helper.make_node("Transpose", ["ym" if pool is not None else "yc"], ["y"],
                                      perm=[0, 2, 3, 1]))
        self.sess = _ort_session(
            nodes, [helper.make_tensor_value_info("x", TensorProto.INT8, shape_in)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
            threads or _DEFAULT.threads)

    def __call__(self, x):
        return self.sess.run(None, {"x": x})[0]


class FastPlan:
    """Compiled executor of a :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph`, bit-identical to
    running :func:`run_layer` layer by layer (the tests compare both on randomized zoo
    models). Built once per graph; what it changes:

    * **channel shuffle** ``conv -> reshape [N, g, C/g, H, W] -> transpose (0, 2, 1, 3, 4)
      -> reshape [N, C, H, W]`` (ShuffleNet) becomes one conv whose output channels are
      permuted (weights, bias, m, n permuted; convs with <= 8 groups as block-diagonal
      dense weights, whose zeros add nothing), when the intermediate tensors have no other
      use; the three layout layers disappear;
    * **depthwise convs and dense kxk convs with <= 4 input channels** (first layers,
      where im2col would copy 3-byte runs) sum their taps in onnxruntime float ``Conv``
      (exact, see :class:`_OrtFloatConv`; each layer is checked once against the numpy
      kernel on its first input and falls back to it on any difference); a max pool that
      is such a conv's only consumer runs on the accumulators, before the requantize;
    * every conv requantizes with :class:`Requant32` (falls back to :class:`Requant`);
    * **two-input add**: one 65536-entry table of the contract's int64 formula indexed by
      the two input bytes; **concat / rescale**: a 256-entry table per non-identity input.
      Tables hold exactly what :func:`qeltwise_int_slow` computes for every input code.

    Everything else runs :func:`run_layer`. ``options`` (:class:`~dnnfab.sw.cpu.options.Options`):
    the GEMM engine, threads and whether the numba kernels are used.
    """

    opts = _DEFAULT

    def __init__(self, qg, options=_DEFAULT):
        self.qg = qg
        self.opts = options
        outputs = {t.name for t in qg.outputs}
        cons = {}
        for L in qg.layers:
            for t in L.inputs:
                cons.setdefault(t, []).append(L)
        skip = set()
        self.steps = []
        #: position of each tensor's producer (graph inputs: -1)
        self.pos = {L.output: i for i, L in enumerate(qg.layers)}
        for L in qg.layers:
            if id(L) in skip:
                continue
            step = None
            if L.op == "conv":
                step = self._conv_step(L, cons, outputs, skip)
            elif L.op == "add":
                step = self._add_step(L)
            elif L.op in ("concat", "rescale"):
                step = self._concat_step(L, cons, outputs, skip)
            elif L.op == "avgpool":
                step = self._avgpool_step(L)
            if step is None:
                step = (lambda env, L=L: run_layer(env.g, env, L, self.opts))
            self.steps.append(step)
        del self.qg  # the plan is cached weakly per graph: it must not keep the graph alive

    @property
    def numba(self):
        """The fused numba kernels are used: on in the options and numba importable."""
        return self.opts.numba and _K.AVAILABLE

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

    def _rq(self, L, bias, fallback):
        if self.numba:
            return RequantK(L.m, L.n, L.zy, L.lo, L.hi, bias)
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
        if cig == 1 and g > 1 and cout == g and self.numba:
            return self._dw_step(L, (n_, ho, wo, cout))
        if (cig == 1 and g > 1 and cout == g) or (cig <= 4 and kh * kw > 1 and g == 1):
            pool = None
            users = cons.get(L.output, [])
            if len(users) == 1 and users[0].op == "maxpool" and L.output not in outputs and \
                    len(shape) == 4:
                pool = users[0]
            step = self._float_conv_step(L, shape_cl, len(shape) == 4, pool)
            if step is None and pool is not None:
                step = self._float_conv_step(L, shape_cl, len(shape) == 4)
            elif pool is not None:
                skip.add(id(pool))
            if step is not None:
                return step
        out = L.output
        fused = self._shuffle_after(L, cons, outputs)
        if 1 < g and kh == kw == 1 and not any(L.pad) and n_ * ho * wo <= GROUPED_MAX_ROWS \
                and cig * g == shape_cl[3] and cig <= ORT_MAX_K and self.numba \
                and self.opts.gemm_engine != "numpy" and _ort_available():
            return self._grouped_step(L, (n_, ho, wo, cout), fused, cons, outputs, skip)
        if fused is None or g > BLOCK_DIAG_MAX_GROUPS:
            fused = None
            if cig == 1 and g > 1 and cout == g:
                return None  # depthwise the float Conv cannot take: the numpy kernel
        if fused is not None:
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
        add = self._add_after(L, out, cons, outputs) if self.numba else None
        if add is not None:
            skip.add(id(add))
            other, first = (add.inputs[1], True) if add.inputs[0] == out else (add.inputs[0], False)

            def step(env):
                acc, use_ort = _conv_acc(env.cl(L.input), L, c, ho, wo, self.opts)
                y = (rq_u8 if use_ort else rq).add(acc, env.cl(other), add, first)
                env.put(add.output, y.reshape(oshape), "cl")
            return step

        def step(env):
            acc, use_ort = _conv_acc(env.cl(L.input), L, c, ho, wo, self.opts)
            env.put(out, (rq_u8 if use_ort else rq)(acc).reshape(oshape), "cl")
        return step

    def _grouped_step(self, L, oshape, fused, cons, outputs, skip):
        """Grouped 1x1 conv with few output rows: per-group GEMMs in one onnxruntime
        session (:class:`_OrtGroupedMatMulInteger`), a fused channel shuffle applied as the
        requantize's output permutation, a consuming residual add fused too."""
        cout, cig = L.qweight.shape[:2]
        g = L.groups
        cog = cout // g
        ws = [L.qweight[i * cog:(i + 1) * cog, :, 0, 0].T for i in range(g)]
        colsum = L.qweight.astype(np.int64).reshape(cout, -1).sum(1)
        out, dst = L.output, None
        if fused is not None:
            perm, chain = fused
            dst = np.argsort(perm)          # old channel o -> new position dst[o]
            out = chain[-1].output
            skip.update(id(x) for x in chain)
        rq = RequantK(L.m, L.n, L.zy, L.lo, L.hi, L.bias.astype(np.int64) - 128 * colsum, dst)
        sess = _OrtGroupedMatMulInteger(ws)
        sy, sx = L.stride
        n_, ho, wo, _ = oshape
        m = n_ * ho * wo

        def acc_of(env):
            x = env.cl(L.input)
            if sy != 1 or sx != 1:
                x = x[:, ::sy, ::sx, :][:, :ho, :wo, :]
            xs = x.view(np.uint8) ^ np.uint8(0x80)       # int8 -> uint8 (+128), contiguous
            return sess(xs.reshape(m, -1))

        add = self._add_after(L, out, cons, outputs)
        if add is not None:
            skip.add(id(add))
            other, first = (add.inputs[1], True) if add.inputs[0] == out else (add.inputs[0], False)

            def step(env):
                y = rq.add(acc_of(env), env.cl(other), add, first)
                env.put(add.output, y.reshape(oshape), "cl")
            return step

        def step(env):
            env.put(out, rq(acc_of(env)).reshape(oshape), "cl")
        return step

    def _add_after(self, L, out, cons, outputs):
        """The two-input residual add that is the only consumer of conv ``L``'s output
        ``out`` and whose other input exists before ``L`` runs, else None."""
        users = cons.get(out, [])
        if len(users) != 1 or out in outputs or users[0].op != "add":
            return None
        add = users[0]
        if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] or \
                np.ndim(add.m) or np.ndim(add.n):
            return None
        other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        qg = self.qg
        if tuple(qg.shape(other)) != tuple(qg.shape(out)) or len(qg.shape(out)) not in (3, 4):
            return None
        if self.pos.get(other, -1) >= self.pos[L.output]:
            return None
        return add

    @staticmethod
    def _dw_step(L, oshape):
        """Depthwise conv with the requantize fused (:func:`dnnfab.sw.cpu.kernels.dwconv`)."""
        cout = oshape[-1]
        w = np.ascontiguousarray(L.qweight[:, 0].transpose(1, 2, 0), dtype=np.int32)
        ch = _per_channel(cout, L.bias, L.m, L.n)
        args = (int(L.zx), int(L.stride[0]), int(L.stride[1]), int(L.dilation[0]),
                int(L.dilation[1]), int(L.pad[0]), int(L.pad[1])) + ch + \
            (int(L.zy), int(L.lo), int(L.hi))

        def step(env):
            y = np.empty(oshape, np.int8)
            _K.dwconv(env.cl(L.input), w, *args, y)
            env.put(L.output, y, "cl")
        return step

    def _avgpool_step(self, L):
        shape = tuple(self.qg.shape(L.input))
        if len(shape) != 4 or not self.numba:
            return None
        n_, c, h, w = shape
        pads, ho, wo = pool_geom(L, np.empty((n_, h, w, c), np.int8))
        m = np.ascontiguousarray(np.broadcast_to(L.m, (ho, wo)), dtype=np.int64)
        nn = np.ascontiguousarray(np.broadcast_to(L.n, (ho, wo)), dtype=np.int64)
        args = (int(L.kernel[0]), int(L.kernel[1]), int(L.stride[0]), int(L.stride[1]),
                int(L.dilation[0]), int(L.dilation[1]), int(pads[0]), int(pads[1]),
                int(L.zx), m, nn, int(L.zy), int(L.lo), int(L.hi))

        def step(env):
            y = np.empty((n_, ho, wo, c), np.int8)
            _K.avgpool(env.cl(L.input), *args, y)
            env.put(L.output, y, "cl")
        return step

    def _float_conv_step(self, L, shape_cl, rank4, pool=None):
        """Depthwise convs and convs with few input channels (im2col would copy tiny channel
        runs): taps summed by :class:`_OrtFloatConv`, checked once against the numpy kernel.
        The input is read in whatever layout it is stored (the network input is NCHW).

        ``pool``: the conv's only consumer, a max pool, runs on the accumulators before the
        requantize (a first conv's output is 4x its pooled size): requantize is
        non-decreasing in the accumulator, so max(rq(a_i)) == rq(max(a_i)), and the int8
        pool's -128 padding never wins over a real value, like the float pool's -inf."""
        cout = L.qweight.shape[0]
        c = _conv_prep(L)
        if 128 * int(np.abs(L.qweight.astype(np.int64)).reshape(cout, -1).sum(1).max()) > 2**24:
            return None
        rq = self._rq(L, L.bias, c["rq"])
        state = {}
        out = L.output if pool is None else pool.output

        def reference(x_cl):
            y = qconv_int(x_cl, L, self.opts)
            return y if pool is None else qmaxpool_int(y, pool)

        def step(env):
            x, lay = env.any(L.input)
            cf = lay == "lg" and rank4
            if not cf:
                x = env.cl(L.input)
            sess = state.get(cf, 0)
            if sess == 0:  # first call in this layout: build and verify
                ref = reference(env.cl(L.input))
                try:
                    sess = _OrtFloatConv(L, shape_cl, channel_first=cf, pool=pool,
                                           threads=self.opts.threads)
                    if not np.array_equal(rq(sess(x)), ref):
                        sess = None
                except Exception:
                    sess = None
                state[cf] = sess
                y = ref
            elif sess is None:
                y = reference(env.cl(L.input))
            else:
                y = rq(sess(x))
            env.put(out, y, "cl")
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
            if self.numba and x0.flags.c_contiguous and x1.flags.c_contiguous:
                y = np.empty(x0.shape, np.int8)
                _K.lut2(x0.reshape(-1), x1.reshape(-1), table, y.reshape(-1))
            else:
                idx = np.left_shift(x0.view(_U8), 8, dtype=np.uint16)
                idx |= x1.view(_U8)
                y = np.take(table, idx)
            env.put(L.output, y, lay)
        return step

    def _concat_step(self, L, cons, outputs, skip):
        qg = self.qg
        out, lo, hi = L.output, -128, 127
        users = cons.get(L.output, [])
        if len(users) == 1 and users[0].op == "clip" and L.output not in outputs:
            clip = users[0]    # a ReLU after the concat (ShuffleNet): folded into the tables
            skip.add(id(clip))
            out, lo, hi = clip.output, clip.lo, clip.hi
        tables = []
        for i, (k, z) in enumerate(zip(L.k, L.z)):
            if L.identity and L.identity[i] and L.lo == -128 and L.hi == 127:
                tb = None if (lo, hi) == (-128, 127) else \
                    np.clip(_BYTE_VALUES, lo, hi).astype(np.int8)
            else:
                tb = np.clip(requantize((_BYTE_VALUES - int(z)) * int(k), L.m, L.n, L.zy,
                                        L.lo, L.hi), lo, hi).astype(np.int8)
            tables.append(tb)
        r = len(qg.shape(L.inputs[0]))
        op = L.op

        def step(env):
            if r in (3, 4):
                xs, lay = [env.cl(t) for t in L.inputs], "cl"
                axis = _CL_AXIS[r][L.axis] if op == "concat" else 0
            else:
                xs, lay = [env.lg(t) for t in L.inputs], "lg"
                axis = L.axis
            parts = [x if tb is None else _lut1(x, tb, self.numba) for x, tb in zip(xs, tables)]
            y = parts[0] if op == "rescale" else np.concatenate(parts, axis=axis)
            env.put(out, y, lay)
        return step

"""Exact int8 engines of the CPU workers and the selector that picks one per layer.

An *engine* is a way to compute a layer's int32 accumulators (or its int8 output) that is
exact **by construction** on the CPU it is chosen for -- never by a run-time probe. The
selector (:func:`select_engine`) is a pure function of the layer, the CPU's features
(:class:`CpuFeatures`, given as input so tests can pose any machine) and the options; it
returns the engine and the reason, which :meth:`CpuWorkers.engine_report
<dnnfab.sw.cpu.workers.CpuWorkers.engine_report>` shows.

GEMM engines (dense and grouped convs via im2col, fully connected layers); ``a`` is the
activation shifted to uint8 (``x + 128``, the bit pattern ``x ^ 0x80``) and the shift is
folded back as ``acc = a @ w - 128 * colsum(w)`` (into the bias):

``ort-u8s8``
    onnxruntime ``MatMulInteger`` uint8 x int8. Exact only where MLAS sums u8*s8 products
    straight into int32: x86 with AVX512-VNNI / AVX-VNNI / AMX (``vpdpbusd``), ARM64 with
    the dot-product extension (``udot``/``sdot``/``usdot``). On plain AVX2 MLAS uses
    ``vpmaddubsw``, which adds product *pairs* in saturating int16
    (2 * 255 * 127 > 32767): wrong, so never chosen there -- unless the layer's weights
    are within +-:data:`S8_PAIR_SAFE_W` (64; 7-bit weights, ``quantize(reduce_range=True)``),
    where no pair can exceed 2 * 255 * 64 < 2^15 on any CPU. K <= :data:`U8S8_MAX_K`
    (255 * 128 * K < 2^31).
``ort-u8u8``
    onnxruntime ``MatMulInteger`` uint8 x uint8, the weights stored as ``w + 128`` with
    ``b_zero_point = 128``. No CPU has a saturating u8 x u8 instruction: MLAS widens both
    operands to 16 bits (``vpmaddwd``: pairs of 16x16-bit products added into int32,
    each pair < 2 * 255 * 255 < 2^17) and accumulates in int32, so it is exact whenever
    no int32 sum overflows: K <= :data:`U8U8_MAX_K` (255 * 255 * K < 2^31, whatever the
    order of the zero-point fix-up). Exact on every CPU; the fastest exact GEMM on AVX2.
``blas-f32``
    numpy float32 matmul (BLAS), K cut into chunks of 1024 added in int32: every partial
    sum of a chunk is an integer below 1024 * 128 * 127 < 2^24, which float32 holds
    exactly whatever the order or FMA use. Exact everywhere, always available (and the
    only engine for K beyond the onnxruntime limits).

Direct engines:

``ort-f32-conv``
    onnxruntime float ``Conv`` on the integer codes (padding with the value zx). Every
    product and partial sum is an integer of magnitude <= 128 * max_c sum|w[c]|; when that
    is <= 2^24 float32 represents each exactly, so the sum is exact whatever the order.
    MLAS's float Conv is im2col/direct + SGEMM (no Winograd/FFT, whose transforms would
    round). Chosen for depthwise convs when numba is off. Measured here (AVX2) it is slower
    than ``ort-u8u8`` even on first layers with 3 input channels (1.2-1.6x, im2col
    included), so dense convs never take it.
``numba-dw``
    depthwise conv, int32 accumulators in a numba loop (|acc| <= 128 * 127 * kh * kw plus
    the bias; the contract's acc_bound < 2^31 is proven at quantization), requantize in
    int64: exact by integer arithmetic.
``numba-gemm``
    small convs / GEMMs (<= 2^17 MACs, where an onnxruntime call's ~20 us dominates;
    ``Options.gemm_engine="auto"`` only, ``"ort"`` keeps them on onnxruntime): int8
    products summed in int32 in a numba loop (|sum| <= 128 * 128 * K < 2^31 for
    K <= 131071), requantize fused in int64: exact by integer arithmetic.
``numba-max``, ``numpy-max``
    max pool: a numba loop over the window taps, or numpy ``maximum`` over them without
    numba (int8, exact).
``numba-pool``, ``numba-lut``
    average pool and table-driven add / concat / rescale / LUT in numba loops, integer
    arithmetic (tables hold the contract's int64 formula for every input code).
``numba-affine``
    1x1 depthwise convs (unfoldable BatchNorms) as ``floor((x * w * m + bias * m +
    2^(n-1)) * 2^-n)`` in float64, only where every intermediate is an integer below
    2^52 (exact); otherwise their per-channel table (``numba-lut``).
``numba-lrn``
    ONNX LRN (a CPU float op): the channel-window sum of squared codes ``(q - zx)^2`` is an
    exact integer; one float64 table per layer (:func:`~dnnfab.sw.cpu.reference.lrn_table`)
    maps it to the output factor, and the reference reads the same table, so every engine
    agrees to the bit.
``numpy``
    layout ops and CPU float ops: the reference's own :func:`run_layer
    <dnnfab.sw.cpu.reference.run_layer>` (one task; pure data movement or the float
    fallback of the contract).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import numpy as np

from .options import Options

__all__ = ["CpuFeatures", "EngineChoice", "select_engine", "select_gemm_engine", "GEMM_ENGINE_NAMES",
           "layer_signature",
           "U8U8_MAX_K", "U8S8_MAX_K", "F32_EXACT", "f32_conv_exact", "layer_geometry"]

#: largest K of the uint8 x uint8 engine: 255 * 255 * K < 2^31
U8U8_MAX_K = (2**31 - 1) // (255 * 255)
#: largest K of the uint8 x int8 engine: 255 * 128 * K < 2^31
U8S8_MAX_K = (2**31 - 1) // (255 * 128)
#: layers up to this many MACs go to the numba GEMM (an onnxruntime call costs ~20 us)
NUMBA_GEMM_MAX_MACS = 1 << 17
#: int32 sums of int8 x int8 products are exact for K <= this (128 * 128 * K < 2^31)
NUMBA_GEMM_MAX_K = (2**31 - 1) // (128 * 128)
#: float32 holds every integer of magnitude <= 2^24
F32_EXACT = 2**24
GEMM_ENGINE_NAMES = ("ort-u8s8", "ort-u8u8", "blas-f32")

_VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_ARM_DOT_FLAGS = frozenset({"asimddp"})


@dataclass(frozen=True)
class CpuFeatures:
    """What the selector needs to know about a CPU: its architecture (``platform.machine``
    form, lower case) and its feature flags (the ``flags`` / ``Features`` line of
    /proc/cpuinfo). Build one by hand to pose a machine (tests), or :meth:`detect`."""

    arch: str = "x86_64"
    flags: frozenset = frozenset()

    @classmethod
    def detect(cls) -> "CpuFeatures":
        """This machine's architecture and flags (flags empty where /proc/cpuinfo is
        missing, which makes the selector choose only engines exact on every CPU)."""
        flags = set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    key = line.split(":", 1)[0].strip().lower()
                    if key in ("flags", "features"):
                        flags.update(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        return cls(platform.machine().lower() or "unknown", frozenset(flags))

    @property
    def x86(self):
        return self.arch in ("x86_64", "amd64", "i386", "i686", "x86")

    @property
    def arm64(self):
        return self.arch in ("aarch64", "arm64")

    @property
    def int8_dot(self):
        """u8 x s8 products go straight into int32 (x86 VNNI/AMX, ARM64 dot product):
        onnxruntime's uint8 x int8 MatMulInteger is exact here."""
        if self.x86:
            return bool(self.flags & _VNNI_FLAGS)
        if self.arm64:
            return bool(self.flags & _ARM_DOT_FLAGS)
        return False

    def describe(self):
        if self.x86:
            kind = "VNNI" if self.int8_dot else ("AVX2, no VNNI" if "avx2" in self.flags
                                                 else "x86 without AVX2")
        elif self.arm64:
            kind = "dot product" if self.int8_dot else "no dot product"
        else:
            kind = "generic"
        return f"{self.arch} ({kind})"


@dataclass(frozen=True)
class EngineChoice:
    """The selector's answer for one layer: ``engine`` (a name of the module docstring)
    and ``reason`` (one line: why this one, why not the faster ones)."""

    engine: str
    reason: str


#: weights within +-S8_PAIR_SAFE_W: a u8 x s8 product pair is at most 2 * 255 * 64 = 32640
#: in magnitude, below int16's limit, so even a saturating pair sum (AVX2 ``vpmaddubsw``)
#: is exact (onnxruntime's own advice for non-VNNI CPUs: 7-bit weights, reduce_range)
S8_PAIR_SAFE_W = 64


def select_gemm_engine(k, features, options=None, ort=True, wmax=None):
    """The GEMM engine for reduction length ``k`` on ``features`` (see the module
    docstring): u8s8 where it is exact and allowed, else u8u8, else float32 BLAS.
    ``wmax``: the layer's largest weight magnitude (u8s8 is exact on any CPU when it is at
    most :data:`S8_PAIR_SAFE_W`, e.g. ``quantize(reduce_range=True)``).
    ``options.gemm_engine == "numpy"`` forces ``blas-f32``; ``ort=False``: onnxruntime
    is not importable."""
    options = options or Options()
    why_not_s8 = ("uint8 x int8 would sum product pairs in saturating int16 on "
                  f"{features.describe()}")
    if options.gemm_engine == "numpy":
        return EngineChoice("blas-f32", "Options.gemm_engine='numpy'")
    if not ort:
        return EngineChoice("blas-f32", "onnxruntime is not importable")
    if features.int8_dot and k <= U8S8_MAX_K:
        return EngineChoice("ort-u8s8", f"{features.describe()}: u8 x s8 dot products "
                            f"into int32, K={k} <= {U8S8_MAX_K}")
    if wmax is not None and wmax <= S8_PAIR_SAFE_W and k <= U8S8_MAX_K:
        return EngineChoice("ort-u8s8", f"weights within +-{wmax}: a u8 x s8 product pair "
                            f"is at most 2*255*{wmax} < 2^15, so no int16 pair sum saturates "
                            f"on any CPU; K={k} <= {U8S8_MAX_K}")
    if k <= U8U8_MAX_K:
        return EngineChoice("ort-u8u8", f"{why_not_s8 if not features.int8_dot else 'K too long for u8s8'}; "
                            f"u8 x u8 widens to 16 bit, exact for K={k} <= {U8U8_MAX_K}")
    return EngineChoice("blas-f32", f"K={k} > {U8U8_MAX_K}: int32 sums of the onnxruntime "
                        "engines could overflow; float32 BLAS in K chunks of 1024")


def is_qlrn(L):
    """Whether ``L`` is a quantized ONNX LRN (a QFloat run by
    :func:`~dnnfab.sw.cpu.reference.qlrn_rows`)."""
    return L.op == "float" and L.layer.attrs.get("op_type") == "LRN" and len(L.inputs) == 1


def _wmax(L):
    """The largest weight magnitude of a conv / gemm layer."""
    return int(np.abs(L.qweight.astype(np.int16)).max(initial=0))


def f32_conv_exact(qweight):
    """128 * max_c sum|w[c]| <= 2^24: every partial sum of a float32 conv of int8 codes is an
    exactly representable integer."""
    w = np.abs(qweight.astype(np.int64)).reshape(qweight.shape[0], -1).sum(1)
    return 128 * int(w.max(initial=0)) <= F32_EXACT


def layer_geometry(L, in_shape):
    """(kind, k, m, n) of a conv/gemm: kind ``dense``, ``grouped``, ``depthwise`` or
    ``gemm``; k the reduction length per output, m the output rows, n the outputs per row."""
    if L.op == "gemm":
        return "gemm", int(L.qweight.shape[1]), int(np.prod(in_shape[:-1])), int(L.qweight.shape[0])
    cout, cig, kh, kw = L.qweight.shape
    kind = "dense" if L.groups == 1 else (
        "depthwise" if cig == 1 and cout == L.groups else "grouped")
    return kind, cig * kh * kw, None, cout


def _conv_macs(L, in_shape):
    if len(in_shape) not in (3, 4):
        return None
    n_ = in_shape[0]
    h, w = (1, in_shape[2]) if len(in_shape) == 3 else in_shape[2:4]
    cout, cig, kh, kw = L.qweight.shape
    t, l, b, r = L.pad
    ho = (h + t + b - (kh - 1) * L.dilation[0] - 1) // L.stride[0] + 1
    wo = (w + l + r - (kw - 1) * L.dilation[1] - 1) // L.stride[1] + 1
    return int(n_ * ho * wo * cout * cig * kh * kw)


def select_engine(L, in_shape, features, options=None, numba=True, ort=True):
    """The engine for layer ``L`` (a layer of a QuantizedGraph) whose (first) input has
    the logical shape ``in_shape``, on a CPU with ``features``: an :class:`EngineChoice`.
    ``numba``/``ort``: whether numba / onnxruntime are importable (and allowed)."""
    options = options or Options()
    op = L.op
    numba = numba and options.numba
    if op == "conv":
        kind, k, _, _ = layer_geometry(L, in_shape)
        cout, cig, kh, kw = L.qweight.shape
        if kind == "depthwise" and numba:
            return EngineChoice("numba-dw", "depthwise: int32 taps in a numba loop (no GEMM "
                                "to feed; exact integer arithmetic)")
        if kind == "depthwise":
            if ort and len(in_shape) == 4 and f32_conv_exact(L.qweight):
                return EngineChoice("ort-f32-conv", "depthwise without numba: float32 conv, "
                                    "exact as 128*max sum|w| <= 2^24")
            return EngineChoice("blas-f32", "depthwise without numba: the reference's "
                                "float32 taps (exact below 2^24)")
        macs = _conv_macs(L, in_shape)
        if numba and options.gemm_engine == "auto" and macs is not None and \
                macs <= NUMBA_GEMM_MAX_MACS and k <= NUMBA_GEMM_MAX_K:
            return EngineChoice("numba-gemm", f"{macs} MACs: an onnxruntime call would cost "
                                "more; int32 sums in a numba loop (exact, K <= 131071)")
        return select_gemm_engine(k, features, options, ort, _wmax(L))
    if op == "gemm":
        k = int(L.qweight.shape[1])
        macs = int(np.prod(in_shape[:-1])) * k * int(L.qweight.shape[0]) if in_shape else None
        if numba and options.gemm_engine == "auto" and macs is not None and \
                macs <= NUMBA_GEMM_MAX_MACS and k <= NUMBA_GEMM_MAX_K:
            return EngineChoice("numba-gemm", f"{macs} MACs: an onnxruntime call would cost "
                                "more; int32 sums in a numba loop (exact, K <= 131071)")
        return select_gemm_engine(k, features, options, ort, _wmax(L))
    if op == "maxpool" and numba and len(in_shape) == 4:
        return EngineChoice("numba-max", "window maximum tap by tap in a numba loop on bands "
                            "of output rows (vectorized over channels); exact on int8")
    if op == "maxpool" and len(in_shape) == 4:
        return EngineChoice("numpy-max", "window maximum as numpy ufuncs on bands of output "
                            "rows (vectorized, GIL released); exact on int8")
    if op == "avgpool" and numba and len(in_shape) == 4:
        return EngineChoice("numba-pool", "integer window sums and int64 requantize on bands "
                            "of output rows")
    if op == "add" and numba and len(L.inputs) == 2:
        return EngineChoice("numba-lut", "65536-entry table of the contract's formula, "
                            "indexed by the two input codes")
    if op in ("concat", "rescale") and numba:
        return EngineChoice("numba-lut", "256-entry table per rescaled input, copied into "
                            "its channel range")
    if op == "lut" and numba:
        return EngineChoice("numba-lut", "the layer's 256-entry table")
    if numba and is_qlrn(L):
        return EngineChoice("numba-lrn", "LRN: exact integer window sums of squared codes, "
                            "one float64 table lookup per output (the reference's table)")
    return EngineChoice("numpy", f"{op}: the reference kernel (data movement or float "
                        "fallback), one task")


def _attrs(L):
    keys = ("stride", "pad", "dilation", "groups", "kernel", "extra", "axis", "attr")
    out = []
    for k in keys:
        v = getattr(L, k, None)
        if v is not None and not callable(v):
            out.append(f"{k}={tuple(v) if isinstance(v, (list, tuple)) else v}")
    return out


def layer_signature(qg, L, engine=None):
    """A string naming what layer ``L``'s CPU time depends on (see the module docstring)."""
    parts = [L.op]
    if L.op == "float":
        parts.append(L.layer.op)
    for t in L.inputs:
        parts.append("in" + "x".join(str(d) for d in qg.shape(t)))
    parts.append("out" + "x".join(str(d) for d in qg.shape(L.output)))
    w = getattr(L, "qweight", None)
    if w is not None:
        parts.append("w" + "x".join(str(d) for d in w.shape))
    parts += _attrs(L)
    if engine:
        parts.append(f"engine={engine}")
    return " ".join(parts)


def default_workers():
    """Threads of the worker pool when nothing says otherwise: the CPU's cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)

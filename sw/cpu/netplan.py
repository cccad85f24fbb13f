"""The small-network plan: a whole network of small layers as one numba call per layer into
buffers bound once.

On a network like the bundled digits-cnn (7 layers, 92 k MACs) or eeg-seizure (8 layers,
1.7 M MACs) the layer-by-layer workers spend their time in Python, not in arithmetic: a
layer's binding (views, output allocation, task closures) and an onnxruntime call cost
~10-30 us each, against a few microseconds of work. :class:`NetPlan` prepares everything
once -- every tensor's buffer, every layer's weights in the kernel's layout -- so a run is
the input's layout conversion, one compiled call per layer (:mod:`dnnfab.sw.cpu.kernels`:
``conv_rq_dot``, ``gemm_rq_dot``, ``maxpool_cl``, ``avgpool_rows``) and a copy of the
outputs. A dense conv for which the workers' selector chose an onnxruntime engine (over
2^17 MACs) keeps it: ``im2col_u8`` into a bound buffer, the engine's session,
``requant_rows`` (eeg-seizure's first conv: 1.3 M MACs, ~4x faster than the numba dot
product).

The kernels are the contract's integer arithmetic (int32 dot products of int8 codes, the
int64 requantize): exact by construction, bit-identical to
:func:`~dnnfab.sw.cpu.reference.run_reference` (tests/sw/test_netplan.py, random networks
and extreme values). :meth:`NetPlan.build` returns None (with the reason) for a network it
does not cover: another op, a rank it does not keep, more than ``PLAN_MAX_MACS`` MACs (the
layer-parallel workers win there), or numba missing / turned off.
"""

from __future__ import annotations

import numpy as np

from ..ref.golden import pool_geom
from . import kernels as _K
from . import reference as R

__all__ = ["NetPlan", "PLAN_MAX_MACS"]

#: networks up to this many MACs run as one plan (eeg-seizure: 1.7 M; the smallest zoo
#: model, squeezenet, has 350 M and its layers run on the workers)
PLAN_MAX_MACS = 1 << 22
#: int32 dot products stay exact while K * 128 * 128 < 2^31
_MAX_K = (1 << 31) // (128 * 128) - 1


def _taps(shape, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo):
    """int32 [N * Ho * Wo * kh * kw]: the flat offset in a channel-last input of ``shape``
    of each output pixel's taps (in (i, j) order), -1 where a tap falls in the padding."""
    nb, h, w, c = shape
    b, oy, ox, i, j = np.meshgrid(np.arange(nb), np.arange(ho), np.arange(wo), np.arange(kh),
                                  np.arange(kw), indexing="ij")
    iy, ix = oy * sh + i * dh - pt, ox * sw + j * dw - pl
    inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    return np.where(inside, ((b * h + iy) * w + ix) * c, -1).astype(np.int32).reshape(-1)


def _gemm_rq(eng, cols, bias, m, n, zy, lo, hi, y2d):
    _K.requant_rows(eng(cols), bias, m, n, zy, lo, hi, y2d)


def _padded_k(k):
    """The dot products' length: K rounded up to a multiple of 64 (16 for K <= 32), where
    LLVM's vectorized int16 loop has no remainder."""
    q = 16 if k <= 32 else 64
    return -(-k // q) * q


class NetPlan:
    """A prepared small network; :meth:`run` is ``run_reference`` bit for bit."""

    def __init__(self, qg, steps, bufs, inputs, outputs, macs):
        self.qg = qg
        self.steps = steps          # [(kernel, args)], in layer order
        self.bufs = bufs            # tensor name -> (array, 'cl' | 'lg')
        self.inputs = inputs        # [(name, buffer, 'cl' | 'lg')]
        self.outputs = outputs      # [(name, rank)]
        self.macs = macs

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, qg, options=None, gemm=None):
        """``(plan, None)`` or ``(None, reason)``. ``gemm(L, w_kn)``: for a dense conv, a
        callable ``uint8 [M, K] (x + 128) -> int32 [M, N] (x + 128) @ w_kn`` (the workers'
        onnxruntime engine, where the selector chose one for ``L``) or None (the numba
        dot product)."""
        if not _K.AVAILABLE or (options is not None and not options.numba):
            return None, "numba is missing or turned off"
        bufs, steps, macs = {}, [], 0
        inputs = []
        for t in qg.inputs:
            shp = tuple(qg.shape(t.name))
            if len(shp) == 4:
                b = np.empty((shp[0], shp[2], shp[3], shp[1]), np.int8)
                bufs[t.name] = (b, "cl")
            else:
                b = np.empty(shp, np.int8)
                bufs[t.name] = (b, "lg")
            inputs.append((t.name, b, bufs[t.name][1]))
        for L in qg.layers:
            if L.op not in ("conv", "gemm", "maxpool", "avgpool", "reshape"):
                return None, f"layer {L.name!r}: op {L.op!r} is not in the plan"
            if L.input not in bufs:
                return None, f"layer {L.name!r}: input {L.input!r} is not a planned tensor"
            x, lay = bufs[L.input]
            if L.op == "reshape":
                y = np.empty(tuple(int(v) for v in L.attr), np.int8)
                if y.size != x.size:
                    return None, f"layer {L.name!r}: reshape changes the size"
                if lay == "lg":
                    bufs[L.output] = (x.reshape(y.shape), "lg")       # a view, no step
                else:
                    n_, h, w, c = x.shape
                    steps.append((np.copyto, (y.reshape(n_, c, h, w), x.transpose(0, 3, 1, 2))))
                    bufs[L.output] = (y, "lg")
                continue
            if L.op == "gemm":
                if lay != "lg" or x.ndim != 2:
                    return None, f"layer {L.name!r}: gemm input of rank {x.ndim}"
                wt = np.ascontiguousarray(L.qweight, np.int8)          # [N, K]
                cout, k = wt.shape
                if k != x.shape[1] or k > _MAX_K:
                    return None, f"layer {L.name!r}: K = {k}"
                y = np.empty((x.shape[0], cout), np.int8)
                rq = R._per_channel(cout, L.bias, L.m, L.n) + (int(L.zy), int(L.lo), int(L.hi))
                steps.append((_K.gemm_rq_dot, (x, wt) + rq + (y,)))
                macs += x.shape[0] * k * cout
                bufs[L.output] = (y, "lg")
                continue
            if lay != "cl":
                return None, f"layer {L.name!r}: {L.op} input is not a 4-D activation"
            n_, h, w, c = x.shape
            if L.op == "conv":
                cout, cig, kh, kw = L.qweight.shape
                g = L.groups
                cog = cout // g
                if cig * g != c or len(L.pad) != 4:
                    return None, f"layer {L.name!r}: conv geometry"
                t, l, b, r = (int(v) for v in L.pad)
                sh, sw = (int(v) for v in L.stride)
                dh, dw = (int(v) for v in L.dilation)
                ho = (h + t + b - (kh - 1) * dh - 1) // sh + 1
                wo = (w + l + r - (kw - 1) * dw - 1) // sw + 1
                k = kh * kw * c
                if k > _MAX_K or ho < 1 or wo < 1:
                    return None, f"layer {L.name!r}: K = {k}, output {ho}x{wo}"
                y = np.empty((n_, ho, wo, cout), np.int8)
                macs += n_ * ho * wo * k * cout
                eng = gemm(L, np.ascontiguousarray(
                    L.qweight.transpose(2, 3, 1, 0).reshape(k, cout))) if gemm and g == 1 else None
                if eng is not None:
                    # im2col as uint8 (x + 128), the engine, the requantize with the shift
                    # folded into the bias: (x + 128) @ w = x @ w + 128 * colsum(w)
                    cols = np.empty((n_ * ho * wo, k), np.uint8)
                    bias, m, nn = R._per_channel(cout, L.bias, L.m, L.n)
                    bias = bias - 128 * L.qweight.astype(np.int64).reshape(cout, -1).sum(1)
                    src = _taps(x.shape, kh, kw, sh, sw, dh, dw, t, l, ho, wo)
                    steps.append((_K.im2col_u8, (x.reshape(-1).view(np.uint8), c, src,
                                                 np.uint8(int(L.zx) + 128), cols.reshape(-1))))
                    steps.append((_gemm_rq, (eng, cols, bias, m, nn, int(L.zy), int(L.lo),
                                             int(L.hi), y.reshape(-1, cout))))
                    bufs[L.output] = (y, "cl")
                    if macs > PLAN_MAX_MACS:
                        return None, f"more than {PLAN_MAX_MACS} MACs"
                    continue
                wd = np.zeros((cout, kh, kw, c), np.int16)     # block-diagonal when grouped
                for i in range(g):
                    wd[i * cog:(i + 1) * cog, :, :, i * cig:(i + 1) * cig] = \
                        L.qweight[i * cog:(i + 1) * cog].transpose(0, 2, 3, 1)
                wt = np.zeros((cout, _padded_k(k)), np.int16)   # zeros beyond K
                wt[:, :k] = wd.reshape(cout, k)
                rq = R._per_channel(cout, L.bias, L.m, L.n)
                steps.append((_K.conv_rq_dot, (x, wt) + rq + (
                    int(L.zx), int(L.zy), int(L.lo), int(L.hi), kh, kw, sh, sw, dh, dw, t, l, y)))
            else:
                pads, ho, wo = pool_geom(L, x)
                kh, kw = (int(v) for v in L.kernel)
                geo = (kh, kw, int(L.stride[0]), int(L.stride[1]), int(L.dilation[0]),
                       int(L.dilation[1]), int(pads[0]), int(pads[1]))
                y = np.empty((n_, ho, wo, c), np.int8)
                if L.op == "maxpool":
                    steps.append((_K.maxpool_cl, (x,) + geo + (y,)))
                else:
                    m = np.ascontiguousarray(np.broadcast_to(L.m, (ho, wo)), dtype=np.int64)
                    nn = np.ascontiguousarray(np.broadcast_to(L.n, (ho, wo)), dtype=np.int64)
                    steps.append((_K.avgpool_rows, (x,) + geo + (
                        int(L.zx), m, nn, int(L.zy), int(L.lo), int(L.hi), 0, ho, y)))
                macs += n_ * ho * wo * c * kh * kw
            bufs[L.output] = (y, "cl")
            if macs > PLAN_MAX_MACS:
                return None, f"more than {PLAN_MAX_MACS} MACs"
        outputs = []
        for t in qg.outputs:
            if t.name not in bufs:
                return None, f"output {t.name!r} is not a planned tensor"
            outputs.append((t.name, len(qg.shape(t.name))))
        return cls(qg, steps, bufs, inputs, outputs, macs), None

    # ------------------------------------------------------------------ run
    def run(self, feed_q):
        """``{output name: int8 array}`` (logical layout, fresh arrays) of int8 inputs
        ``feed_q`` (logical layout, already checked by the caller)."""
        for name, buf, lay in self.inputs:
            x = feed_q[name]
            if lay == "cl":
                np.copyto(buf, x.transpose(0, 2, 3, 1))
            else:
                np.copyto(buf, x)
        for fn, args in self.steps:
            fn(*args)
        out = {}
        for name, rank in self.outputs:
            y, lay = self.bufs[name]
            out[name] = np.array(y if lay == "lg" else R.from_cl(y, rank))
        return out

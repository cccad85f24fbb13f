"""The multithreaded CPU software workers: a pool of N threads running a QuantizedGraph's
layers exactly (bit-identical to :func:`~dnnfab.sw.cpu.reference.run_reference`).

>>> with CpuWorkers(qg, threads=2) as w:
...     out = w.run(feed_q)                 # {output name: int8}, == run_reference(qg, feed_q)
...     w.engine_report()["conv1"]          # {'engine': 'ort-u8u8', 'reason': '...', ...}

**Tasks.** Every layer is prepared once (:class:`CpuWorkers` binds to one graph): its
engine is chosen (:func:`~dnnfab.sw.cpu.engines.select_engine`), its weights are put in
that engine's form and the layer is cut into *slices* -- bands of output rows for convs
and pools with many rows, ranges of output channels for GEMMs with few rows (a fully
connected layer at batch 1), ranges of elements for element-wise tables, one input each
for a concat. A task is (layer, slice); all slices of a layer write disjoint parts of one
output array, so one big layer uses every thread, and a layer whose inputs are ready
starts at once, so independent layers (Inception branches, DenseNet concats, residual
paths) run at the same time. Layers below 8 M MACs are one task (a slice costs ~30 us of
fixed work: an onnxruntime call, a hand-off); from 32 M MACs a layer has two slices per
thread. :meth:`run` (the whole graph) also fuses a channel shuffle and/or the residual
add after a GEMM conv into its requantize (:class:`_FusedConvProg`).

**Threads.** ``threads = N`` means N threads of execution: the thread that calls
:meth:`run` / :meth:`run_layers` takes tasks like the N - 1 pool threads, so N = 1 runs
everything inline with no hand-off; a thread that finishes a task goes on with the first
task it made ready (a chain of layers stays on one thread). Every kernel releases the
GIL: onnxruntime ``run``, numpy copies, numba ``nogil`` loops. Each slice has its **own** engine session
(onnxruntime, one intra-op thread, no spinning), so no shared intra-op pool fights the
workers and no session is used by two threads at once; a row-band slice holds the
layer's full weights, a channel slice only its columns. Nothing is global: settings come
from the :class:`~dnnfab.sw.cpu.options.Options` given (``threads``: ``Options.workers``,
default the CPU's cores).

**Processes.** With ``Options(pool="processes")`` (the default) and N > 1, whole-graph
:meth:`run` calls from the third on also start helper processes (procpool.py): N - 1 that
take slices like the pool threads, and one *native* helper that runs the graph unsliced
with its GEMMs on onnxruntime's own N-thread pool; a calibration keeps whichever of those
two and the caller alone ran fastest (:meth:`pool_report`). ``run_layer`` /
``run_layers`` always use the threads.

**Lifetime.** A context manager; :meth:`close` (idempotent) stops and joins the pool
threads; they are also stopped when the object is garbage collected (the threads hold no
reference to it). One run at a time per object (a lock); use one object per session.

**Errors.** An exception in a task stops the run (queued tasks are dropped, running ones
finish) and reaches the caller as :class:`CpuTaskError` naming the layer, chained to the
original exception.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref

import numpy as np

from ...errors import DnnfabError
from ..ir.graph import windows_nhwc
from ..ref.golden import pool_geom
from ..ir.qgraph import requantize
from . import kernels as _K
from . import reference as R
from .engines import (CpuFeatures, EngineChoice, U8S8_MAX_K, U8U8_MAX_K, default_workers,
                      is_qlrn, layer_geometry, layer_signature, select_engine)
from .options import Options
from .netplan import NetPlan
from .procpool import ArenaEnv, NativeHelper, ProcPool, ProcRun, dependencies, serve, serve_native

__all__ = ["CpuWorkers", "CpuTaskError"]

#: a conv/GEMM below this many MACs, or a pool/table below this many outputs, is one task
SPLIT_MIN_MACS = 1 << 23
SPLIT_MIN_ELEMS = 1 << 15
#: from this many MACs a layer gets 2 slices per thread: a thread that the OS preempts
#: (a shared machine) then holds up at most half of its share, the others take the rest
BIG_MACS = 1 << 25
#: row bands need at least this many output pixels per band (else: channel slices)
BAND_MIN_ROWS = 64
#: a ready task goes to another thread only if its layer's work per slice (``_work``, in
#: MAC-equivalents) is at least this; smaller ones run on the thread that made them ready,
#: in priority order. A hand-off costs ~80 us here (a sleeping thread's wake-up on this
#: VM) plus GIL contention; measured side by side on squeezenet / resnet50 / inception_v1
#: at 2 threads: 1.08x / 1.38x / 1.22x over 1 thread with this rule, 1.02x / 1.35x / 1.23x
#: handing off every task
HANDOFF_MIN_WORK = 1 << 23
#: a conv's row slice is computed in runs of rows whose im2col matrix and int32
#: accumulators fit this many bytes: measured side by side at 1 thread (median of 5 rounds),
#: vgg19 148.5 -> 128.6 ms and inception_v1 25.4 -> 22.6 ms with 4 MiB, resnet50 and
#: zfnet512 unchanged; 1 MiB helped less, 256 KiB was slower (per-call cost)
IM2COL_CHUNK_BYTES = 1 << 22
#: a grouped 1x1 conv with at most this many groups runs as one block-diagonal GEMM on the
#: u8s8 engine (g times the MACs in one call instead of Split + g GEMMs + Concat): measured
#: on ShuffleNet's 32 g=4 convs with VNNI, 1 thread, side by side: 11.1 -> 9.7 ms. Not on
#: u8u8 (plain AVX2), where a MAC costs ~2x and this was not measured
GROUPED_1X1_DENSE_MAX_GROUPS = 4
#: the module settings that decide how layers are cut into slices (a helper process of
#: Options(pool="processes") takes the caller's values)
SLICING_CONSTANTS = ("SPLIT_MIN_MACS", "SPLIT_MIN_ELEMS", "BIG_MACS", "BAND_MIN_ROWS",
                     "HANDOFF_MIN_WORK")


class CpuTaskError(DnnfabError, RuntimeError):
    """A task of the CPU workers raised; ``layer`` names the layer, ``__cause__`` is the
    original exception."""

    def __init__(self, msg, layer=None):
        super().__init__(msg)
        self.layer = layer


def _split(total, parts):
    """``parts`` near-equal [a, b) ranges covering [0, total) (fewer if total is small)."""
    parts = max(1, min(parts, total))
    edges = [total * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


# ====================================================================== onnxruntime
def _session(nodes, inputs, outputs, inits):
    return R._ort_session(nodes, inputs, outputs, inits, 1)


def _matmul_session(w_kn, engine):
    """uint8 [M, K] (``x + 128``) x int8 ``w_kn`` -> int32 [M, N] ``(x + 128) @ w``: the
    u8s8 form (int8 weights) or the u8u8 form (``w + 128`` with weight zero point 128)."""
    from onnx import TensorProto, helper, numpy_helper
    k, n = w_kn.shape
    if engine == "ort-u8u8":
        node, inits = R._matmul_u8u8_node(numpy_helper.from_array, "a", w_kn, "y")
    else:
        inits = [numpy_helper.from_array(np.ascontiguousarray(w_kn, np.int8), "w"),
                 numpy_helper.from_array(np.array(0, np.uint8), "az")]
        node = helper.make_node("MatMulInteger", ["a", "w", "az"], ["y"])
    sess = _session([node], [helper.make_tensor_value_info("a", TensorProto.UINT8, ["M", k])],
                    [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", n])], inits)
    return lambda a: sess.run(None, {"a": a})[0]


def _grouped_session(ws, engine):
    """Grouped 1x1 conv accumulators: uint8 [M, g*K] -> Split -> g MatMulIntegers -> Concat."""
    from onnx import TensorProto, helper, numpy_helper
    g, k = len(ws), ws[0].shape[0]
    nodes = [helper.make_node("Split", ["a", "sp"], [f"a{i}" for i in range(g)], axis=1)]
    inits = [numpy_helper.from_array(np.full(g, k, np.int64), "sp")]
    for i, w in enumerate(ws):
        if engine == "ort-u8u8":
            node, more = R._matmul_u8u8_node(numpy_helper.from_array, f"a{i}", w, f"y{i}", str(i))
        else:
            more = [numpy_helper.from_array(np.ascontiguousarray(w, np.int8), f"w{i}"),
                    numpy_helper.from_array(np.array(0, np.uint8), f"az{i}")]
            node = helper.make_node("MatMulInteger", [f"a{i}", f"w{i}", f"az{i}"], [f"y{i}"])
        nodes.append(node)
        inits += more
    nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(g)], ["y"], axis=1))
    sess = _session(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, ["M", g * k])],
                    [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    return lambda a: sess.run(None, {"a": a})[0]


def _f32_conv_session(L, band_shape, pads):
    """onnxruntime float Conv of an int8 NHWC band [N, h, W, C] with explicit ``pads``
    (t, l, b, r) of value zx: float32 NHWC accumulators (exact, see engines)."""
    from onnx import TensorProto, helper, numpy_helper
    cout, _, kh, kw = L.qweight.shape
    t, l, b, r = pads
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2])]
    inits = [numpy_helper.from_array(L.qweight.astype(np.float32), "w")]
    src = "xt"
    if any(pads):
        inits += [numpy_helper.from_array(np.array([0, 0, t, l, 0, 0, b, r], np.int64), "p"),
                  numpy_helper.from_array(np.array(float(L.zx), np.float32), "pv")]
        nodes.append(helper.make_node("Pad", ["xt", "p", "pv"], ["xp"]))
        src = "xp"
    nodes += [helper.make_node("Conv", [src, "w"], ["yc"], group=L.groups, kernel_shape=[kh, kw],
                               strides=list(L.stride), dilations=list(L.dilation),
                               pads=[0, 0, 0, 0]),
              helper.make_node("Transpose", ["yc"], ["y"], perm=[0, 2, 3, 1])]
    sess = _session(nodes, [helper.make_tensor_value_info("x", TensorProto.INT8, list(band_shape))],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return lambda x: sess.run(None, {"x": x})[0]


def _ort_ok():
    return R._ort_available()


# ====================================================================== layer programs
class _Prog:
    """A prepared layer. ``bind(env)`` -> (stages, finish): stages is a list of lists of
    callables (a stage starts when the previous one is done), ``finish()`` stores the
    output (or None). ``bind`` takes views of the environment's tensors and allocates the
    output with ``env.empty``; it never reads tensor *contents* (the tasks do): a helper
    process (procpool.py) keeps a binding from one run to the next."""

    slices = 1
    split = "none"
    #: whether one task of this layer is worth handing to another thread (see HANDOFF_MIN_WORK)
    big = False

    def __init__(self, L, choice):
        self.L = L
        self.choice = choice


class _RefProg(_Prog):
    """One task: the reference's run_layer (layout ops, float ops, fallbacks)."""

    def __init__(self, L, choice, qg, options):
        super().__init__(L, choice)
        self.qg, self.options = qg, options

    def bind(self, env):
        return [[lambda: R.run_layer(self.qg, env, self.L, self.options)]], None


def _conv_out(L, shape_cl):
    n_, h, w, _ = shape_cl
    cout, _, kh, kw = L.qweight.shape
    t, l, b, r = L.pad
    ho = (h + t + b - (kh - 1) * L.dilation[0] - 1) // L.stride[0] + 1
    wo = (w + l + r - (kw - 1) * L.dilation[1] - 1) // L.stride[1] + 1
    return (n_, ho, wo, cout)


def _shape_cl(shape):
    if len(shape) == 3:
        return (shape[0], 1, shape[2], shape[1])
    return (shape[0], shape[2], shape[3], shape[1])


def _band_rows(oy0, oy1, sh, dh, pt, kh, h):
    """Input rows [a, b) of an image of height h that output rows [oy0, oy1) read, and the
    padding rows still needed above and below (a band may lie wholly in the padding)."""
    lo = oy0 * sh - pt
    hi = (oy1 - 1) * sh + (kh - 1) * dh - pt + 1
    a = min(max(lo, 0), h)
    b = max(min(hi, h), a)
    return a, b, max(0, min(0, hi) - lo), max(0, hi - max(h, lo))


def _band_input(L, x, oy0, oy1, kh):
    """:func:`_band_rows` of a conv ``L`` on the NHWC input ``x``."""
    return _band_rows(oy0, oy1, L.stride[0], L.dilation[0], L.pad[0], kh, x.shape[1])


def _padded(band, pads, zx, u8):
    """The band (int8 NHWC) padded with ``zx``: uint8 ``x + 128`` (``u8`` True), float32
    (False) or int8 as it is (``"i8"``). A few whole-array numpy operations (each releases
    the GIL), no np.pad."""
    t, l, b, r = pads
    n_, h, w, c = band.shape
    if u8 == "i8":
        xp = np.empty((n_, h + t + b, w + l + r, c), np.int8)
        fill = np.int8(zx)
    elif u8:
        xp = np.empty((n_, h + t + b, w + l + r, c), np.uint8)
        fill = np.uint8(zx + 128)
    else:
        xp = np.empty((n_, h + t + b, w + l + r, c), np.float32)
        fill = np.float32(zx)
    if t:
        xp[:, :t] = fill
    if b:
        xp[:, t + h:] = fill
    if l:
        xp[:, t:t + h, :l] = fill
    if r:
        xp[:, t:t + h, l + w:] = fill
    inner = xp[:, t:t + h, l:l + w]
    if u8 is True:
        np.bitwise_xor(band.view(np.uint8), np.uint8(0x80), out=inner)
    else:
        inner[...] = band
    return xp


def _rq_into(acc, bias, m, n, zy, lo, hi, y2d):
    """The contract's requantize of acc [rows, C] into the int8 view y2d [rows, C]."""
    if _K.AVAILABLE:
        _K.requant_rows(acc, bias, m, n, zy, lo, hi, y2d)
    else:
        y2d[...] = requantize(acc.astype(np.int64) + bias, m, n, zy, lo, hi)


class _Rq:
    """A GEMM layer's requantize (per-channel ``bias``, ``m``, ``n``; ``zy``, ``lo``,
    ``hi``), in the float64 form of :func:`kernels.rq_float_params` when ``vmax`` (a bound on
    ``|acc + bias|``) makes it exact, else the int64 kernels. Column range [c0, c1) of the
    accumulator's channels; ``src``: a fused channel shuffle; ``addp``: a fused residual
    add (:class:`_FusedConvProg`)."""

    def __init__(self, bias, m, n, zy, lo, hi, vmax):
        self.bias, self.m, self.n = bias, m, n
        self.zy, self.lo, self.hi = int(zy), int(lo), int(hi)
        self.vmax = vmax
        self.f = _K.rq_float_params(bias, m, n, vmax) if _K.AVAILABLE else None
        self.fs = (float(zy), float(lo), float(hi))

    def columns(self, src):
        """The requantize of accumulators whose channel k is this one's ``src[k]``."""
        return _Rq(self.bias[src], self.m[src], self.n[src], self.zy, self.lo, self.hi,
                   self.vmax)

    def _p(self, c0, c1):
        if self.f is not None:
            return tuple(v[c0:c1] for v in self.f) + self.fs
        return (self.bias[c0:c1], self.m[c0:c1], self.n[c0:c1], self.zy, self.lo, self.hi)

    def rows(self, acc, out, c0=0, c1=None):
        if self.f is not None:
            _K.requant_rows_f(acc, *self._p(c0, c1), out)
        else:
            _rq_into(acc, *self._p(c0, c1), out)

    def perm(self, acc, src, out):
        (_K.requant_rows_perm_f if self.f is not None else _K.requant_rows_perm)(
            acc, *self._p(0, None), src, out)

    def add(self, acc, other, addp, out, c0=0, c1=None, src=None):
        if src is None:
            (_K.requant_add_f if self.f is not None else _K.requant_add)(
                acc, *self._p(c0, c1), other, *addp, out)
        else:
            (_K.requant_add_perm_f if self.f is not None else _K.requant_add_perm)(
                acc, *self._p(c0, c1), src, other, *addp, out)


class _GemmConvProg(_Prog):
    """Dense / grouped conv through im2col and a GEMM engine (ort-u8s8, ort-u8u8,
    blas-f32), sliced by output-row bands or output-channel ranges."""

    def __init__(self, L, choice, shape_cl, threads, two_per_thread=True):
        super().__init__(L, choice)
        eng = choice.engine
        self.u8 = eng in ("ort-u8u8", "ort-u8s8")
        cout, cig, kh, kw = L.qweight.shape
        g = L.groups
        cog = cout // g
        self.shape_cl, self.oshape = shape_cl, _conv_out(L, shape_cl)
        n_, ho, wo, _ = self.oshape
        cin = shape_cl[3]
        self.one_by_one = kh == kw == 1 and not any(L.pad)
        mode = "dense"
        if g > 1:
            if self.one_by_one and self.u8 and not (
                    eng == "ort-u8s8" and g <= GROUPED_1X1_DENSE_MAX_GROUPS):
                mode = "grouped1x1"
            elif g <= R.BLOCK_DIAG_MAX_GROUPS and kh * kw * cin <= (U8U8_MAX_K if eng == "ort-u8u8" else U8S8_MAX_K):
                mode = "blockdiag"
            else:
                mode = "pergroup"
        self.mode = mode
        if mode in ("dense", "blockdiag"):
            wd = np.zeros((kh, kw, cin, cout), np.int8)
            for i in range(g):
                wd[:, :, i * cig:(i + 1) * cig, i * cog:(i + 1) * cog] = \
                    L.qweight[i * cog:(i + 1) * cog].transpose(2, 3, 1, 0)
            self.w_kn = wd.reshape(kh * kw * cin, cout)
        else:
            self.ws = [np.ascontiguousarray(
                L.qweight[i * cog:(i + 1) * cog].transpose(2, 3, 1, 0).reshape(kh * kw * cig, cog))
                for i in range(g)]
        colsum = L.qweight.astype(np.int64).reshape(cout, -1).sum(1)
        bias = L.bias.astype(np.int64)
        self.bias = bias - 128 * colsum if self.u8 else bias
        self.m_, self.n_ = (np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.int64), (cout,)))
                            for v in (L.m, L.n))
        self.rq = _Rq(self.bias, self.m_, self.n_, L.zy, L.lo, L.hi,
                      cig * kh * kw * 128 * 128 + int(np.abs(bias).max(initial=0)))
        m = n_ * ho * wo
        macs = m * cig * kh * kw * cout
        k = threads * (2 if macs >= BIG_MACS and two_per_thread else 1)
        if macs < SPLIT_MIN_MACS or threads == 1:
            self.split, parts = "none", [(0, ho)]
        elif ho >= 2 and m >= BAND_MIN_ROWS * min(k, ho) and n_ == 1:
            self.split, parts = "rows", _split(ho, k)
        elif mode in ("dense", "blockdiag") and cout >= 8 * k:
            self.split, parts = "channels", _split(cout, k)
        elif ho >= 2:
            self.split, parts = "rows", _split(ho, threads)
        else:
            self.split, parts = "none", [(0, ho)]
        self.parts = parts
        self.slices = len(parts)
        # one engine per slice (its own session): full weights per band, columns per range
        self.engines = []
        for a, b in parts:
            if self.split == "channels":
                self.engines.append(self._engine(self.w_kn[:, a:b]))
            elif mode in ("dense", "blockdiag"):
                self.engines.append(self._engine(self.w_kn))
            elif mode == "grouped1x1":
                self.engines.append(_grouped_session(self.ws, eng))
            else:
                self.engines.append([self._engine(w) for w in self.ws])

    def _chunks(self, oy0, oy1):
        """[oy0, oy1) in runs of output rows whose im2col rows and accumulators stay within
        IM2COL_CHUNK_BYTES (a cache-sized piece: one big im2col of a 224x224 layer is tens
        of MB, streamed through memory twice)."""
        cout, cig, kh, kw = self.L.qweight.shape
        n_, _, wo, _ = self.oshape
        cin = self.shape_cl[3]
        per_row = n_ * wo * (kh * kw * cin * (1 if self.u8 else 4) + 4 * cout)
        step = max(1, IM2COL_CHUNK_BYTES // max(1, per_row))
        return [(a, min(a + step, oy1)) for a in range(oy0, oy1, step)]

    def _engine(self, w_kn):
        if self.u8:
            return _matmul_session(w_kn, self.choice.engine)
        prep = R.PreparedGemm(w_kn)
        return lambda a: prep.matmul_f32(a)

    def _cols(self, x, oy0, oy1, c0=None, c1=None):
        """im2col rows of output rows [oy0, oy1) (all channels or [c0, c1)): uint8 +128
        for the onnxruntime engines, float32 for BLAS."""
        L = self.L
        cout, cig, kh, kw = L.qweight.shape
        wo = self.oshape[2]
        if self.one_by_one:
            sh, sw = L.stride
            sub = x[:, oy0 * sh:(oy1 - 1) * sh + 1:sh, ::sw, :][:, :, :wo, :]
            if c0 is not None:
                sub = sub[..., c0:c1]
            rows = sub.shape[0] * sub.shape[1] * sub.shape[2]
            if self.u8:
                return (sub.view(np.uint8) ^ np.uint8(0x80)).reshape(rows, -1)
            return sub.astype(np.float32).reshape(rows, -1)
        a, b, ptop, pbot = _band_input(L, x, oy0, oy1, kh)
        band = x[:, a:b]
        if c0 is not None:
            band = band[..., c0:c1]
        xp = _padded(band, (ptop, L.pad[1], pbot, L.pad[3]), L.zx, self.u8)
        win = windows_nhwc(xp, kh, kw, L.stride, L.dilation, oy1 - oy0, wo)
        return np.ascontiguousarray(win).reshape(-1, kh * kw * xp.shape[3])

    def _acc(self, eng, x, oy0, oy1):
        if self.mode in ("dense", "blockdiag", "grouped1x1"):
            return eng(self._cols(x, oy0, oy1))
        cig = self.L.qweight.shape[1]
        return np.concatenate([e(self._cols(x, oy0, oy1, i * cig, (i + 1) * cig))
                               for i, e in enumerate(eng)], axis=1)

    def bind(self, env):
        L = self.L
        x = env.cl(L.input)
        y = env.empty(self.oshape, np.int8)
        n_, ho, wo, cout = self.oshape
        rq = self.rq
        tasks = []
        if self.split == "channels":
            y2 = y.reshape(-1, cout)
            for (c0, c1), eng in zip(self.parts, self.engines):
                def t(c0=c0, c1=c1, eng=eng):
                    rq.rows(eng(self._cols(x, 0, ho)), y2[:, c0:c1], c0, c1)
                tasks.append(t)
        else:
            for (oy0, oy1), eng in zip(self.parts, self.engines):
                def t(chunks=self._chunks(oy0, oy1), eng=eng):
                    for oy0, oy1 in chunks:
                        acc = self._acc(eng, x, oy0, oy1)
                        if n_ == 1:
                            rq.rows(acc, y[0, oy0:oy1].reshape(-1, cout))
                        else:
                            tmp = np.empty((n_ * (oy1 - oy0) * wo, cout), np.int8)
                            rq.rows(acc, tmp)
                            y[:, oy0:oy1] = tmp.reshape(n_, oy1 - oy0, wo, cout)
                tasks.append(t)
        return [tasks], lambda: env.put(L.output, y, "cl")


class _FusedConvProg(_Prog):
    """A :class:`_GemmConvProg` (sharing its engine sessions) with what follows it fused
    into its requantize, for whole-graph runs: a ShuffleNet channel shuffle
    (``reshape -> transpose (0, 2, 1, 3, 4) -> reshape``) as a permutation of the output
    channels (``out[:, k] = rq(acc[:, src[k]])``), and/or the two-input residual add that is
    its only consumer (``kernels.requant_add``: the conv's int8 output is requantized, then
    added with the contract's formula, never stored). Batch 1; a channel-sliced conv fuses
    only the add."""

    def __init__(self, base, src, add, other, first, output, fused):
        super().__init__(base.L, base.choice)
        self.base, self.src, self.add, self.other, self.first = base, src, add, other, first
        self.output, self.fused = output, fused
        self.split, self.slices, self.big = base.split, base.slices, base.big
        self.engines, self.rq = base.engines, base.rq
        if src is not None:
            self.src = np.ascontiguousarray(src, dtype=np.int64)
            if base.mode in ("dense", "blockdiag") and base.split != "channels":
                # the shuffle folded into the weights: the GEMM makes the accumulators in
                # shuffled order, and the requantize reads them in place (no gather per
                # element; ShuffleNet's 16 shuffled convs, sessions of their own)
                w = np.ascontiguousarray(base.w_kn[:, self.src])
                self.engines = [base._engine(w) for _ in base.parts]
                self.rq = base.rq.columns(self.src)
                self.src = None
        if add is not None:
            self.addp = (bool(first), int(add.k[0]), int(add.z[0]), int(add.k[1]), int(add.z[1]),
                         int(add.m), int(add.n), int(add.zy), int(add.lo), int(add.hi))

    def bind(self, env):
        b, L = self.base, self.L
        x = env.cl(L.input)
        y = env.empty(b.oshape, np.int8)
        cout = b.oshape[3]
        rq = self.rq
        other = None if self.add is None else np.ascontiguousarray(env.cl(self.other))
        tasks = []
        if b.split == "channels":      # add only (no permutation): column ranges
            y2, o2 = y.reshape(-1, cout), other.reshape(-1, cout)
            ho = b.oshape[1]
            for (c0, c1), eng in zip(b.parts, self.engines):
                def t(c0=c0, c1=c1, eng=eng):
                    rq.add(eng(b._cols(x, 0, ho)), o2[:, c0:c1], self.addp, y2[:, c0:c1], c0, c1)
                tasks.append(t)
            return [tasks], lambda: env.put(self.output, y, "cl")
        for (oy0, oy1), eng in zip(b.parts, self.engines):
            def t(chunks=b._chunks(oy0, oy1), eng=eng):
                for oy0, oy1 in chunks:
                    acc = b._acc(eng, x, oy0, oy1)
                    out = y[0, oy0:oy1].reshape(-1, cout)
                    if other is None:
                        if self.src is None:
                            rq.rows(acc, out)
                        else:
                            rq.perm(acc, self.src, out)
                    else:
                        rq.add(acc, other[0, oy0:oy1].reshape(-1, cout), self.addp, out,
                               src=self.src)
            tasks.append(t)
        return [tasks], lambda: env.put(self.output, y, "cl")


class _Step:
    """A step of a whole-graph run: a layer, or a conv with layers fused into it."""

    def __init__(self, L, inputs, output):
        self.name, self.op, self.inputs, self.output = L.name, L.op, list(inputs), output
        self.L = L


class _ShuffleProg(_Prog):
    """A channel shuffle (reshape -> transpose(0, 2, 1, 3, 4) -> reshape back) as one
    gather of channels, in whatever layout its input is stored (channel-last from the
    fabric, so no layout conversion is made): ``y[..., k] = x[..., src[k]]``."""

    def __init__(self, chain, src):
        self.L = chain[0]
        self.choice = None
        self.src, self.inp, self.out = src, chain[0].input, chain[-1].output

    def bind(self, env):
        x, lay = env.any(self.inp)
        axis = x.ndim - 1 if lay == "cl" else 1
        y = env.empty(x.shape, np.int8)

        def task():
            np.take(x, self.src, axis=axis, out=y)
        return [[task]], lambda: env.put(self.out, y, lay)


class _SmallGemmProg(_Prog):
    """Small conv / GEMM: int8 im2col (padding zx) and the fused numba GEMM + requantize
    (``kernels.gemm_rq``), one task; grouped weights as a block-diagonal dense matrix."""

    def __init__(self, L, choice, in_shape):
        super().__init__(L, choice)
        if L.op == "conv":
            cout, cig, kh, kw = L.qweight.shape
            g = L.groups
            cog = cout // g
            self.shape_cl = _shape_cl(in_shape)
            self.oshape = _conv_out(L, self.shape_cl)
            cin = self.shape_cl[3]
            wd = np.zeros((kh, kw, cin, cout), np.int32)
            for i in range(g):
                wd[:, :, i * cig:(i + 1) * cig, i * cog:(i + 1) * cog] = \
                    L.qweight[i * cog:(i + 1) * cog].transpose(2, 3, 1, 0)
            self.w = wd.reshape(kh * kw * cin, cout)
        else:
            cout = L.qweight.shape[0]
            self.w = np.ascontiguousarray(L.qweight.T, dtype=np.int32)
        self.rq = R._per_channel(cout, L.bias, L.m, L.n) + (int(L.zy), int(L.lo), int(L.hi))
        self.cout = cout

    def _cols(self, x):
        L = self.L
        cout, cig, kh, kw = L.qweight.shape
        n_, ho, wo, _ = self.oshape
        if kh == kw == 1 and not any(L.pad):
            sub = x[:, ::L.stride[0], ::L.stride[1], :][:, :ho, :wo, :]
            return np.ascontiguousarray(sub).reshape(n_ * ho * wo, -1)
        xp = _padded(x, L.pad, L.zx, "i8") if any(L.pad) else x
        win = windows_nhwc(xp, kh, kw, L.stride, L.dilation, ho, wo)
        return np.ascontiguousarray(win).reshape(n_ * ho * wo, -1)

    def bind(self, env):
        L = self.L
        if L.op == "conv":
            x = env.cl(L.input)
            y = env.empty(self.oshape, np.int8)

            def t():
                _K.gemm_rq(self._cols(x), self.w, *self.rq, 0, self.cout, y.reshape(-1, self.cout))
            return [[t]], lambda: env.put(L.output, y, "cl")
        x = env.lg(L.input)
        shp = x.shape
        x2 = np.ascontiguousarray(x).reshape(-1, shp[-1])
        y = env.empty((x2.shape[0], self.cout), np.int8)
        return [[lambda: _K.gemm_rq(x2, self.w, *self.rq, 0, self.cout, y)]], \
            lambda: env.put(L.output, y.reshape(shp[:-1] + (self.cout,)), "lg")


class _F32ConvProg(_Prog):
    """Conv with few input channels through onnxruntime float Conv, one session per band of
    output rows (exact: 128 * max sum|w| <= 2^24, checked by the selector)."""

    def __init__(self, L, choice, shape_cl, threads):
        super().__init__(L, choice)
        self.oshape = _conv_out(L, shape_cl)
        n_, ho, wo, cout = self.oshape
        kh = L.qweight.shape[2]
        macs = n_ * ho * wo * int(np.prod(L.qweight.shape))
        parts = [(0, ho)] if macs < SPLIT_MIN_MACS or threads == 1 else _split(ho, threads)
        self.split = "rows" if len(parts) > 1 else "none"
        self.parts, self.slices = parts, len(parts)
        probe = np.empty(shape_cl, np.int8)
        if any(_band_input(L, probe, a, b, kh)[1] == _band_input(L, probe, a, b, kh)[0]
               for a, b in parts):
            parts = [(0, ho)]   # a band wholly in the padding: one session for the layer
        self.split = "rows" if len(parts) > 1 else "none"
        self.parts, self.slices = parts, len(parts)
        self.bands, self.engines = [], []
        for oy0, oy1 in parts:
            a, b, ptop, pbot = _band_input(L, probe, oy0, oy1, kh)
            self.bands.append((a, b))
            self.engines.append(_f32_conv_session(
                L, (n_, b - a, shape_cl[2], shape_cl[3]), (ptop, L.pad[1], pbot, L.pad[3])))
        cout = L.qweight.shape[0]
        self.rq = R._per_channel(cout, L.bias, L.m, L.n)

    def bind(self, env):
        L = self.L
        x = env.cl(L.input)
        y = env.empty(self.oshape, np.int8)
        n_, ho, wo, cout = self.oshape
        tasks = []
        for (oy0, oy1), (a, b), eng in zip(self.parts, self.bands, self.engines):
            def t(oy0=oy0, oy1=oy1, a=a, b=b, eng=eng):
                acc = eng(np.ascontiguousarray(x[:, a:b])).reshape(-1, cout)
                dst = y[:, oy0:oy1]
                if n_ == 1:
                    _rq_into(acc, *self.rq, int(L.zy), int(L.lo), int(L.hi), dst.reshape(-1, cout))
                else:
                    tmp = np.empty(acc.shape, np.int8)
                    _rq_into(acc, *self.rq, int(L.zy), int(L.lo), int(L.hi), tmp)
                    dst[...] = tmp.reshape(dst.shape)
            tasks.append(t)
        return [tasks], lambda: env.put(L.output, y, "cl")


def _row_parts(ho, elems, threads):
    if elems < SPLIT_MIN_ELEMS or threads == 1 or ho < 2:
        return [(0, ho)]
    return _split(ho, threads)


class _DwProg(_Prog):
    """Depthwise conv: numba ``dwconv_rows`` on bands of output rows."""

    def __init__(self, L, choice, shape_cl, threads):
        super().__init__(L, choice)
        self.oshape = _conv_out(L, shape_cl)
        n_, ho, wo, cout = self.oshape
        self.w = np.ascontiguousarray(L.qweight[:, 0].transpose(1, 2, 0), dtype=np.int32)
        self.args = (int(L.zx), int(L.stride[0]), int(L.stride[1]), int(L.dilation[0]),
                     int(L.dilation[1]), int(L.pad[0]), int(L.pad[1])) + \
            R._per_channel(cout, L.bias, L.m, L.n) + (int(L.zy), int(L.lo), int(L.hi))
        kh, kw = L.qweight.shape[2:]
        self.parts = _row_parts(ho, n_ * ho * wo * cout * kh * kw // 4, threads)
        self.slices = len(self.parts)
        self.split = "rows" if self.slices > 1 else "none"

    def bind(self, env):
        x = env.cl(self.L.input)
        y = env.empty(self.oshape, np.int8)
        tasks = [lambda a=a, b=b: _K.dwconv_rows(x, self.w, *self.args, a, b, y)
                 for a, b in self.parts]
        return [tasks], lambda: env.put(self.L.output, y, "cl")


class _Dw1x1Prog(_Prog):
    """1x1 depthwise conv (a BatchNorm that could not be folded, e.g. DenseNet's BN-ReLU-conv):
    ``y = rq(x * w[c] + bias[c])``, in the float64 form of :func:`kernels.scale_rq_params`
    where that is exact (``numba-affine``: vectorized, 1.3-1.7x faster than the table at
    DenseNet's sizes), else a table [C, 256] (the layer takes 256 values per channel)
    built once with the contract's int64 formula (``numba-lut``); row ranges per thread."""

    def __init__(self, L, choice, shape_cl, threads):
        w = L.qweight[:, 0, 0, 0].astype(np.int64)
        self.f = _K.scale_rq_params(w, L.bias, L.m, L.n) if _K.AVAILABLE else None
        if self.f is not None:
            choice = EngineChoice("numba-affine", "1x1 depthwise (a BatchNorm that could "
                                  "not be folded): x * w * m + bias * m in float64, exact "
                                  "(every intermediate an integer below 2^52)")
        super().__init__(L, choice)
        self.oshape = _conv_out(L, shape_cl)
        n_, ho, wo, cout = self.oshape
        self.fs = (float(L.zy), float(L.lo), float(L.hi))
        if self.f is None:
            v = R._BYTE_VALUES                                   # the int8 value of byte u
            acc = v[None, :] * w[:, None] + L.bias.astype(np.int64)[:, None]
            m = np.broadcast_to(np.asarray(L.m, np.int64), (cout,))[:, None]
            nn = np.broadcast_to(np.asarray(L.n, np.int64), (cout,))[:, None]
            self.table = np.ascontiguousarray(requantize(acc, m, nn, L.zy, L.lo, L.hi))
        rows = n_ * ho * wo
        self.parts = _row_parts(rows, rows * cout // 4, threads)
        self.slices = len(self.parts)
        self.split = "rows" if self.slices > 1 else "none"

    def bind(self, env):
        L = self.L
        x = env.cl(L.input)
        n_, ho, wo, cout = self.oshape
        if L.stride != (1, 1):
            x = x[:, ::L.stride[0], ::L.stride[1]][:, :ho, :wo]
        x2 = np.ascontiguousarray(x).reshape(-1, cout)
        y = env.empty(self.oshape, np.int8)
        y2 = y.reshape(-1, cout)
        if self.f is not None:
            tasks = [lambda a=a, b=b: _K.scale_rq_rows_f(x2, *self.f, *self.fs, a, b, y2)
                     for a, b in self.parts]
        else:
            tasks = [lambda a=a, b=b: _K.lut_per_channel(x2, self.table, a, b, y2)
                     for a, b in self.parts]
        return [tasks], lambda: env.put(L.output, y, "cl")


class _PoolProg(_Prog):
    """Max / average pool on bands of output rows, in numba kernels (``maxpool_rows``,
    ``avgpool_rows``); without numba, max pool as numpy ``maximum`` over the window taps of
    the band (padding -128 never wins; the ufuncs release the GIL and vectorize)."""

    def __init__(self, L, choice, shape_cl, threads):
        super().__init__(L, choice)
        n_, h, w, c = shape_cl
        self.pads, ho, wo = pool_geom(L, np.empty((n_, h, w, c), np.int8))
        self.oshape = (n_, ho, wo, c)
        geo = (int(L.kernel[0]), int(L.kernel[1]), int(L.stride[0]), int(L.stride[1]),
               int(L.dilation[0]), int(L.dilation[1]), int(self.pads[0]), int(self.pads[1]))
        self.geo = geo
        if choice.engine == "numba-max":
            # the kernel's first call in a process loads it from numba's cache (~3 ms,
            # measured): here, not in the first inference (dnnfab run reported digits-cnn's
            # first max pool at 3.3 ms instead of 0.03)
            z = np.zeros((1, 1, 1, 1), np.int8)
            _K.maxpool_rows(z, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, np.empty_like(z))
        if L.op == "avgpool":
            m = np.ascontiguousarray(np.broadcast_to(L.m, (ho, wo)), dtype=np.int64)
            nn = np.ascontiguousarray(np.broadcast_to(L.n, (ho, wo)), dtype=np.int64)
            self.args = geo + (int(L.zx), m, nn, int(L.zy), int(L.lo), int(L.hi))
        work = n_ * ho * wo * c * L.kernel[0] * L.kernel[1] // 4
        self.parts = _row_parts(ho, work, threads)
        self.slices = len(self.parts)
        self.split = "rows" if self.slices > 1 else "none"

    def _max_band(self, x, oy0, oy1, y):
        L = self.L
        kh, kw = L.kernel
        t, l, b, r = self.pads
        a, bb, pt, pb = _band_rows(oy0, oy1, L.stride[0], L.dilation[0], t, kh, x.shape[1])
        band = x[:, a:bb]
        n_, hb, wb, c = band.shape
        if pt or pb or l or r:
            xp = np.empty((n_, hb + pt + pb, wb + l + r, c), np.int8)
            xp[:, :pt] = -128
            xp[:, pt + hb:] = -128
            xp[:, pt:pt + hb, :l] = -128
            xp[:, pt:pt + hb, l + wb:] = -128
            xp[:, pt:pt + hb, l:l + wb] = band
        else:
            xp = band
        win = windows_nhwc(xp, kh, kw, L.stride, L.dilation, oy1 - oy0, self.oshape[2])
        dst = y[:, oy0:oy1]
        np.copyto(dst, win[:, :, :, 0, 0, :])
        for i in range(kh):
            for j in range(kw):
                if i or j:
                    np.maximum(dst, win[:, :, :, i, j, :], out=dst)

    def bind(self, env):
        x = env.cl(self.L.input)
        y = env.empty(self.oshape, np.int8)
        if self.choice.engine == "numba-max":
            tasks = [lambda a=a, b=b: _K.maxpool_rows(x, *self.geo, a, b, y)
                     for a, b in self.parts]
        elif self.L.op == "maxpool":
            tasks = [lambda a=a, b=b: self._max_band(x, a, b, y) for a, b in self.parts]
        else:
            tasks = [lambda a=a, b=b: _K.avgpool_rows(x, *self.args, a, b, y)
                     for a, b in self.parts]
        return [tasks], lambda: env.put(self.L.output, y, "cl")


class _AddProg(_Prog):
    """Two-input residual add through the 65536-entry table (FastPlan's), element ranges."""

    def __init__(self, L, choice, qg, threads):
        super().__init__(L, choice)
        v = R._BYTE_VALUES
        acc = (v[:, None] - int(L.z[0])) * int(L.k[0]) + (v[None, :] - int(L.z[1])) * int(L.k[1])
        self.table = requantize(acc, L.m, L.n, L.zy, L.lo, L.hi).reshape(-1)
        self.rank = len(qg.shape(L.inputs[0]))
        self.size = int(np.prod(qg.shape(L.inputs[0])))
        self.parts = [(0, self.size)] if self.size < SPLIT_MIN_ELEMS * 4 or threads == 1 \
            else _split(self.size, threads)
        self.slices = len(self.parts)
        self.split = "elements" if self.slices > 1 else "none"

    def bind(self, env):
        a, b = self.L.inputs
        lays = (env.layout(a), env.layout(b))
        if self.rank in (3, 4) and "cl" in lays:
            x0, x1, lay = env.cl(a), env.cl(b), "cl"
        else:
            x0, x1, lay = env.lg(a), env.lg(b), "lg"
        x0, x1 = np.ascontiguousarray(x0), np.ascontiguousarray(x1)
        y = env.empty(x0.shape, np.int8)
        f0, f1, fy = x0.reshape(-1), x1.reshape(-1), y.reshape(-1)
        tasks = [lambda i0=i0, i1=i1: _K.lut2_range(f0, f1, self.table, i0, i1, fy)
                 for i0, i1 in self.parts]
        return [tasks], lambda: env.put(self.L.output, y, lay)


def _rows_view(a):
    """``a`` as a 2-D view [rows, last axis], or None where that needs a copy."""
    try:
        return np.reshape(a, (-1, a.shape[-1]), copy=False)
    except (ValueError, TypeError):     # (TypeError: numpy < 2.1 has no ``copy``)
        return None


class _ConcatProg(_Prog):
    """Concat / rescale: a 256-entry table per non-identity input (FastPlan's); a concat
    on the channel axis of channel-last data is one task per input, writing its channel
    range of the output."""

    def __init__(self, L, choice, qg, threads):
        super().__init__(L, choice)
        self.tables = []
        for i, (k, z) in enumerate(zip(L.k, L.z)):
            if L.identity and L.identity[i] and L.lo == -128 and L.hi == 127:
                self.tables.append(None)
            else:
                self.tables.append(requantize((R._BYTE_VALUES - int(z)) * int(k), L.m, L.n,
                                              L.zy, L.lo, L.hi).astype(np.int8))
        self.r = len(qg.shape(L.inputs[0]))
        self.qg = qg
        size = int(np.prod(qg.shape(L.output)))
        self.slices = len(L.inputs) if L.op == "concat" and threads > 1 and \
            size >= SPLIT_MIN_ELEMS * 4 else 1
        self.split = "inputs" if self.slices > 1 else "none"

    @staticmethod
    def _lut(x, tb, dst):
        if tb is None:
            dst[...] = x
        elif _K.AVAILABLE and x.ndim >= 2 and dst.shape == x.shape and \
                (d2 := _rows_view(dst)) is not None:
            # straight into the destination (a channel range of the output: strided rows)
            _K.lut1_rows(np.ascontiguousarray(x).reshape(-1, x.shape[-1]), tb, d2)
        elif _K.AVAILABLE:
            xc = np.ascontiguousarray(x)
            tmp = np.empty(xc.shape, np.int8)
            _K.lut1_range(xc.reshape(-1), tb, 0, xc.size, tmp.reshape(-1))
            dst[...] = tmp
        else:
            dst[...] = np.take(tb, x.view(np.uint8))

    def bind(self, env):
        L = self.L
        if self.r in (3, 4):
            xs, lay = [env.cl(t) for t in L.inputs], "cl"
            axis = R._CL_AXIS[self.r][L.axis] if L.op == "concat" else 0
        else:
            xs, lay = [env.lg(t) for t in L.inputs], "lg"
            axis = L.axis % xs[0].ndim
        if L.op == "rescale":
            y = env.empty(xs[0].shape, np.int8)
            return [[lambda: self._lut(xs[0], self.tables[0], y)]], lambda: env.put(L.output, y, lay)
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        y = env.empty(shape, np.int8)
        tasks, c0 = [], 0
        for x, tb in zip(xs, self.tables):
            c1 = c0 + x.shape[axis]
            idx = (slice(None),) * axis + (slice(c0, c1),)
            tasks.append(lambda x=x, tb=tb, idx=idx: self._lut(x, tb, y[idx]))
            c0 = c1
        if self.slices == 1:            # small: one task does every part
            parts = tasks
            tasks = [lambda: [t() for t in parts]]
        return [tasks], lambda: env.put(L.output, y, lay)


class _GemmProg(_Prog):
    """Fully connected layer: a GEMM engine on ranges of output channels (rows at batch 1
    are few); x [.., K] in the logical layout."""

    def __init__(self, L, choice, in_shape, threads, two_per_thread=True):
        super().__init__(L, choice)
        nout, k = L.qweight.shape
        self.u8 = choice.engine in ("ort-u8u8", "ort-u8s8")
        rows = int(np.prod(in_shape[:-1]))
        w_kn = np.ascontiguousarray(L.qweight.T)
        colsum = L.qweight.astype(np.int64).sum(1)
        bias = L.bias.astype(np.int64)
        self.bias = bias - 128 * colsum if self.u8 else bias
        self.m_, self.n_ = (np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.int64), (nout,)))
                            for v in (L.m, L.n))
        self.rq = _Rq(self.bias, self.m_, self.n_, L.zy, L.lo, L.hi,
                      k * 128 * 128 + int(np.abs(bias).max(initial=0)))
        macs = rows * k * nout
        if macs < SPLIT_MIN_MACS or threads == 1 or nout < 2 * threads:
            self.parts = [(0, nout)]
        else:
            self.parts = _split(nout, threads * (2 if macs >= BIG_MACS and two_per_thread else 1))
        self.slices = len(self.parts)
        self.split = "channels" if self.slices > 1 else "none"
        self.engines = []
        for a, b in self.parts:
            if self.u8:
                self.engines.append(_matmul_session(np.ascontiguousarray(w_kn[:, a:b]), choice.engine))
            else:
                prep = R.PreparedGemm(w_kn[:, a:b])
                self.engines.append(prep.matmul_f32)

    def bind(self, env):
        L = self.L
        x = env.lg(L.input)
        shp = x.shape
        nout = L.qweight.shape[0]
        x2 = np.ascontiguousarray(x).reshape(-1, shp[-1])
        y = env.empty((x2.shape[0], nout), np.int8)
        u8 = self.u8
        tasks = []
        for (c0, c1), eng in zip(self.parts, self.engines):
            def t(c0=c0, c1=c1, eng=eng):   # each slice converts x (K bytes at batch 1)
                a = x2.view(np.uint8) ^ np.uint8(0x80) if u8 else x2.astype(np.float32)
                self.rq.rows(eng(a), y[:, c0:c1], c0, c1)
            tasks.append(t)
        return [tasks], lambda: env.put(L.output, y.reshape(shp[:-1] + (nout,)), "lg")


class _LrnProg(_Prog):
    """Quantized LRN (:func:`~dnnfab.sw.cpu.reference.qlrn_rows`, the reference's own
    table and window), channel-last, pixel-row ranges per thread."""

    def __init__(self, L, choice, qg, shape_cl, threads):
        super().__init__(L, choice)
        self.params = R.lrn_params(qg, L)
        self.shape_cl = shape_cl
        rows = int(np.prod(shape_cl[:-1]))
        self.parts = _row_parts(rows, rows * shape_cl[-1] // 4, threads)
        self.slices = len(self.parts)
        self.split = "rows" if self.slices > 1 else "none"

    def bind(self, env):
        L = self.L
        z, lo_w, hi_w, table, zy = self.params
        x2 = env.cl(L.inputs[0]).reshape(-1, self.shape_cl[-1])
        y = env.empty(self.shape_cl, np.int8)
        y2 = y.reshape(x2.shape)
        tasks = [lambda a=a, b=b: _K.lrn_rows(x2, z, lo_w, hi_w, table, zy, a, b, y2)
                 for a, b in self.parts]
        return [tasks], lambda: env.put(L.output, y, "cl")


class _LutProg(_Prog):
    def bind(self, env):
        x, lay = env.any(self.L.input)
        xc = np.ascontiguousarray(x)
        y = env.empty(xc.shape, np.int8)
        return [[lambda: _K.lut1_range(xc.reshape(-1), self.L.table, 0, xc.size, y.reshape(-1))]], \
            lambda: env.put(self.L.output, y, lay)


def _work(qg, L):
    """A rough cost of layer ``L`` in MAC-equivalents (a u8u8 GEMM MAC; an activation-sized
    pass costs ~60 of them here), to decide which tasks are worth a hand-off."""
    in_shape = tuple(qg.shape(L.inputs[0])) if L.inputs else ()
    elems = int(np.prod(qg.shape(L.output)))
    if L.op in ("conv", "gemm"):
        kind, k, _, _ = layer_geometry(L, in_shape)
        per_out = k * (8 if kind == "depthwise" else 1)
        return elems * (per_out + 60)
    if L.op in ("maxpool", "avgpool"):
        kh, kw = getattr(L, "kernel", (3, 3))
        return elems * (kh * kw * 10 + 60)
    if is_qlrn(L):
        return elems * 300
    return elems * 60


# ====================================================================== pool of threads
class _Pool:
    """N - 1 daemon threads taking tasks from a priority queue; the caller of
    :meth:`drain` is the N-th. A task returns the tasks it made ready: the thread runs the
    first itself (no hand-off along a chain of layers) and queues the rest. Holds no
    reference to the CpuWorkers that owns it."""

    def __init__(self, n):
        lock = threading.Lock()
        self.cv = threading.Condition(lock)         # pool threads wait here for tasks
        self.caller_cv = threading.Condition(lock)  # the caller of drain waits here
        self.caller_waiting = False
        self.heap = []
        self.seq = itertools.count()
        self.stop = False
        self.threads = [threading.Thread(target=self._loop, name=f"dnnfab-cpu-{i + 1}",
                                         daemon=True) for i in range(n - 1)]
        for t in self.threads:
            t.start()

    def push(self, items):
        """Queue (prio, fn, big) items for any thread."""
        if not items:
            return
        with self.cv:
            for prio, fn, _ in items:
                heapq.heappush(self.heap, (prio, next(self.seq), fn))
            self.cv.notify(len(items))
            if self.caller_waiting:
                self.caller_cv.notify()

    def _chain(self, fn, items=()):
        """Run ``fn`` (None: the first of ``items``), then what each task makes ready: the
        first ready task on this thread (no hand-off along a chain of layers), the other
        *big* ones queued for any thread, the small ones kept for this thread (a hand-off
        costs more than they do), in priority order."""
        local = []
        if fn is None and items:
            fn, items = items[0][1], items[1:]
        follow = items
        while True:
            if follow:
                give = [f for f in follow if f[2]]
                for prio, f, big in follow:
                    if not big:
                        heapq.heappush(local, (prio, next(self.seq), f))
                self.push(give)
            if fn is None:
                if not local:
                    return
                fn = heapq.heappop(local)[2]
            follow = fn()
            fn = None
            if follow:
                fn, follow = follow[0][1], follow[1:]

    def _loop(self):
        while True:
            with self.cv:
                while not self.heap and not self.stop:
                    self.cv.wait()
                if self.stop:
                    return
                fn = heapq.heappop(self.heap)[2]
            self._chain(fn)
            fn = None  # an idle thread keeps no task (nor, through it, its CpuWorkers) alive

    def drain(self, done):
        """Run tasks in the calling thread until ``done()`` (checked under the lock)."""
        while True:
            with self.cv:
                while not self.heap and not done():
                    self.caller_waiting = True
                    self.caller_cv.wait()
                    self.caller_waiting = False
                if done():
                    return
                fn = heapq.heappop(self.heap)[2]
            self._chain(fn)
            fn = None

    def wake_caller(self):
        """Tell a waiting caller to look again (its run may be done); call holding cv."""
        if self.caller_waiting:
            self.caller_cv.notify()

    def shutdown(self):
        with self.cv:
            self.stop = True
            self.heap.clear()
            self.cv.notify_all()
            self.caller_cv.notify_all()
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join()
        self.threads = []


class _Run:
    """One execution of a list of layers (topological order) on the pool. Every task is a
    wrapped slice; it returns the (prio, task) pairs it made ready."""

    def __init__(self, workers, env, layers, progs=None, times=None):
        self.env, self.pool = env, workers._pool
        self.times = times          # {layer name: (start, end)} perf_counter, when given
        self.progs = workers._progs if progs is None else progs
        self.pos = workers._pos
        self.layers = list(layers)
        self.pending, self.consumers = dependencies(self.layers)
        self.remaining = len(self.layers)
        self.inflight = 0
        self.error = None
        self.lock = threading.Lock()

    def done(self):
        return self.inflight == 0 and (self.remaining == 0 or self.error is not None)

    def _fail(self, L, exc):
        with self.lock:
            if self.error is None:
                self.error = (L, exc)

    def _start_layer(self, L):
        """Bind ``L`` and return its first stage's tasks (or, for an empty program, what
        finishing it makes ready)."""
        if self.error is not None:
            return []
        if self.times is not None:
            self.times[L.name] = (time.perf_counter(), None)
        try:
            stages, finish = self.progs[id(L)].bind(self.env)
        except Exception as exc:  # noqa: BLE001 - reported to the caller with the layer
            self._fail(L, exc)
            return []
        return self._stage(L, stages, 0, finish)

    def _stage(self, L, stages, i, finish):
        if i == len(stages):
            try:
                if finish is not None:
                    finish()
            except Exception as exc:  # noqa: BLE001
                self._fail(L, exc)
                return []
            return self._layer_done(L)
        tasks = stages[i]
        left = [len(tasks)]
        prio = self.pos[id(L)]

        def wrap(fn):
            def task():
                try:
                    if self.error is None:
                        fn()
                except Exception as exc:  # noqa: BLE001
                    self._fail(L, exc)
                with self.lock:
                    left[0] -= 1
                    last = left[0] == 0
                follow = self._stage(L, stages, i + 1, finish) \
                    if last and self.error is None else []
                with self.pool.cv:
                    self.inflight -= 1
                    if self.done():
                        self.pool.wake_caller()
                return follow
            return task

        with self.pool.cv:
            self.inflight += len(tasks)
        big = self.progs[id(L)].big
        return [(prio, wrap(fn), big) for fn in tasks]

    def _layer_done(self, L):
        if self.times is not None:
            self.times[L.name] = (self.times[L.name][0], time.perf_counter())
        ready = []
        with self.lock:
            self.remaining -= 1
            for c in self.consumers.get(L.output, ()):
                self.pending[id(c)] -= 1
                if self.pending[id(c)] == 0:
                    ready.append(c)
        out = []
        for c in ready:
            out += self._start_layer(c)
        if self.remaining == 0:
            with self.pool.cv:
                self.pool.wake_caller()
        return out

    def run(self):
        first = []
        for L in self.layers:
            if self.pending[id(L)] == 0:
                first += self._start_layer(L)
        if first:   # the caller starts on the first task itself: no hand-off to begin with
            self.pool._chain(None, first)
        self.pool.drain(self.done)
        if self.error is not None:
            _raise(*self.error)


def _raise(L, exc):
    text = str(exc).splitlines()[0] if str(exc) else ""
    raise CpuTaskError(f"CPU worker task of layer {L.name!r} ({L.op}) failed: "
                       f"{type(exc).__name__}: {text}; check the layer's input tensors "
                       "(run_reference shows the reference's own error)", layer=L.name) from exc


def _run_inline(progs, env, layers, times=None):
    """threads == 1: every layer's tasks in order in the calling thread, no queue."""
    for L in layers:
        t0 = time.perf_counter()
        try:
            stages, finish = progs[id(L)].bind(env)
            for tasks in stages:
                for fn in tasks:
                    fn()
            if finish is not None:
                finish()
        except Exception as exc:  # noqa: BLE001
            _raise(L, exc)
        if times is not None:
            times[L.name] = (t0, time.perf_counter())


def _shuffle_after(qg, L, cons, outputs):
    """(src, [reshape, transpose, reshape]) when conv ``L``'s output only feeds a channel
    shuffle back to its own shape (FastPlan's pattern); src[k] = the conv channel that ends
    up as channel k."""
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
    return np.arange(c).reshape(g, cpg).T.reshape(-1), [r1, tr, r2]


def _add_after(qg, L, out, cons, outputs, pos, producers):
    """The two-input add (scalar m, n) that is the only consumer of ``out`` (the output of
    conv ``L``, maybe after a fused shuffle) and whose other input of the same shape is
    made before ``L``; else None."""
    users = cons.get(out, [])
    if len(users) != 1 or out in outputs or users[0].op != "add":
        return None
    add = users[0]
    if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] or np.ndim(add.m) or np.ndim(add.n):
        return None
    other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
    if tuple(qg.shape(other)) != tuple(qg.shape(out)) or len(qg.shape(out)) != 4:
        return None
    producer = producers.get(other)
    if producer is not None and pos[id(producer)] >= pos[id(L)]:
        return None
    return add


# ====================================================================== public class
def _helper_entry(fd):
    """Entry of a helper process of ``Options(pool="processes")`` (procpool.py): prepare
    the caller's programs with the caller's slicing constants, run them once on zeros (an
    onnxruntime session's first run plans its memory: squeezenet's first helper runs took
    59 ms against 14 ms alone without this), then serve slices."""
    import signal
    # Ctrl-C in the user's terminal reaches the whole process group: the caller handles
    # it, and a helper ends when the caller's socket closes (no second traceback)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def build(payload):
        globals().update(payload["consts"])
        w = CpuWorkers(payload["qg"], threads=payload["threads"], options=payload["options"],
                       features=payload["features"], _prepared=payload["prepared"])
        env = R.Env(w.qg)
        for t in w.qg.inputs:
            env.put(t.name, np.zeros(w.qg.shape(t.name), np.int8), "lg")
        _run_inline(w._step_progs, env, w._steps)
        return w
    serve(fd, build)


def _native_entry(fd):
    """Entry of the native helper process of ``Options(pool="processes")``
    (procpool.serve_native): the graph prepared unsliced on one thread, its engine sessions
    on onnxruntime's process-wide pool, run twice on zeros before it reports ready."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def build(payload):
        opts = payload["options"].replace(pool="threads", net_plan=False)
        w = CpuWorkers(payload["qg"], threads=1, options=opts, features=payload["features"])
        zeros = {t.name: np.zeros(w.qg.shape(t.name), np.int8) for t in w.qg.inputs}
        w.run(zeros)
        w.run(zeros)
        fail = payload.get("fail_step")
        if fail is not None:            # a fault injected in one layer (tests)
            p = w._step_progs[id(next(st for st in w._steps if st.name == fail))]

            def bind(env):
                raise RuntimeError("fault injected in the native helper (test)")
            p.bind = bind
        return w
    serve_native(fd, build)


def _shutdown(pool, pp_box):
    for h in pp_box:
        if h is not None:
            h.shutdown()
    pool.shutdown()


#: whole-graph runs with helper processes: after CALIBRATION_WARMUP runs with the helpers,
#: runs with the helpers and in the caller alone take turns, this many of each, and the
#: mode with the fastest run is kept (other tenants of a shared machine only ever add time;
#: a median of 3, or two blocks one after the other, picked the slower mode for alexnet
#: in benchmark runs here). A network of small layers is faster alone (measured:
#: squeezenet 6.9 ms alone, 9.7 ms with a helper; resnet50 43.3 / 33.4 ms)
CALIBRATION_RUNS = 3
#: whole-graph runs before the helper processes start (a one-off run does not pay for a
#: process that prepares for ~1 s and would never serve it); wait_ready() starts them now
PROC_START_AFTER_RUNS = 2
#: runs with the helpers not counted first (their first runs bind every step and touch the
#: shared memory's pages)
CALIBRATION_WARMUP = 2


#: whole-graph runs with helper processes also try the *native* helper (procpool.NativeHelper:
#: the graph unsliced in one process whose onnxruntime sessions share onnxruntime's own
#: process-wide thread pool) in calibration
NATIVE_HELPER = True
#: a native helper that gives no answer within NATIVE_TIMEOUT_S plus NATIVE_TIMEOUT_FACTOR
#: times the slowest calibration run (a hang) is killed and the run goes on in the caller
NATIVE_TIMEOUT_S = 60.0
NATIVE_TIMEOUT_FACTOR = 20


#: a step of a whole-graph run goes to a helper process (Options(pool="processes")) if its
#: work per slice is at least this; measured on squeezenet / resnet50 / inception_v1 (2^21,
#: 2^23, 2^25): smaller slices cost more in coordination (~0.1 ms per layer) than they save
PROC_HANDOFF_MIN_WORK = 1 << 23


class CpuWorkers:
    """The worker pool bound to one QuantizedGraph ``qg`` (see the module docstring).

    ``threads``: threads of execution (default ``options.workers``, else the CPU's cores);
    ``options``: :class:`~dnnfab.sw.cpu.options.Options` (default ``Options.from_env()``);
    ``features``: the :class:`~dnnfab.sw.cpu.engines.CpuFeatures` the engines are chosen
    for (default: this machine's -- pass another only to test the selector's choices on a
    machine that has them). ``profile``: a :class:`~dnnfab.sw.cpu.profile.CpuProfile`; a
    layer it measured no faster at ``threads`` threads than at 1 is not split (its
    ``engine_report`` entry says so in ``note``). ``share_pool``: another
    :class:`CpuWorkers` (same thread count) whose pool threads and run lock this one uses
    instead of starting its own -- one pool serving several graphs, one layer or run at a
    time (the real-time runtime's CPU resource); closing a sharer leaves the pool running,
    closing the owner stops it.
    """

    def __init__(self, qg, threads=None, options=None, features=None, profile=None,
                 share_pool=None, _prepared=None, _fail_step=None):
        if options is None:
            options = Options.from_env()
        if threads is None:
            threads = options.workers or default_workers()
        if int(threads) < 1:
            raise DnnfabError(f"CpuWorkers needs at least 1 thread, got {threads}; pass "
                              "threads=1 or more")
        self.threads = int(threads)
        self.options = options
        self.qg = qg
        self.features = features or CpuFeatures.detect()
        self._closed = False
        self._lock = threading.Lock()
        self._pos = {id(L): i for i, L in enumerate(qg.layers)}
        self._progs = {}
        self._notes = {}
        self._prepared = {}     # layer name -> the thread count its slices were cut for
        # [ProcPool, NativeHelper], started by a run() (see _helpers)
        self._pp = [None, None]
        self._want_procs = False
        self._started = False   # helper processes started (once; never after calibration)
        self._fail_step = _fail_step
        # whole-graph runs: 'helpers', 'native' or 'caller' once calibrated
        self._mode = None
        self._calib = {"helpers": [], "native": [], "caller": []}
        self._runs = 0
        # helper processes share no interpreter lock: one slice per thread is enough (two
        # per thread hedge against a preempted thread; measured slower with processes)
        self._two = options.pool != "processes"
        for L in qg.layers:
            # a helper process takes the caller's preparation (its profile decisions)
            t = self.threads if _prepared is None else _prepared[L.name]
            p = self._prepare(L, t)
            self._prepared[L.name] = t
            if _prepared is None and profile is not None and t > 1 and p.slices > 1:
                sig = layer_signature(qg, L, p.choice.engine)
                t1, tn = profile.latency_ms(sig, 1), profile.latency_ms(sig, self.threads)
                if t1 is not None and tn is not None and tn >= t1:
                    p = self._prepare(L, 1)
                    self._prepared[L.name] = 1
                    self._notes[L.name] = (f"not split: the profile measured {tn:.3f} ms at "
                                           f"{self.threads} threads, {t1:.3f} ms at 1")
            p.big = _work(qg, L) / p.slices >= HANDOFF_MIN_WORK
            self._progs[id(L)] = p
        self._steps, self._step_progs, self._fused_into = self._fuse()
        self._shuffles = self._shuffle_chains()
        # a small network runs whole as one prepared plan (netplan.py) in run()
        self._plan, self._plan_reason = None, "Options(net_plan=False)"
        if _prepared is None and options.net_plan:
            self._plan, self._plan_reason = NetPlan.build(qg, options, gemm=self._plan_gemm)
        if _prepared is not None:       # a helper process runs slices, it has no pool
            self._pool = None
            self._finalizer = weakref.finalize(self, lambda: None)
            return
        if share_pool is not None:
            if share_pool.threads != self.threads:
                raise DnnfabError(f"share_pool has {share_pool.threads} threads, this "
                                  f"CpuWorkers {self.threads}; share a pool of the same size")
            share_pool._check_open()
            self._owner = share_pool          # keeps the owner (and so its pool) alive
            self._pool, self._lock = share_pool._pool, share_pool._lock
            self._finalizer = weakref.finalize(self, lambda: None)
        else:
            self._pool = _Pool(self.threads)
            self._want_procs = options.pool == "processes" and self.threads > 1 and \
                self._plan is None
            self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._pp)
            self._remote = [self._shareable(s) for s in self._steps]

    # ------------------------------------------------------------------ preparation
    def _plan_gemm(self, L, w_kn):
        """The NetPlan's GEMM of dense conv ``L``: the onnxruntime engine the selector chose
        for it (exact on this machine, see engines.py), or None (the plan's numba dot)."""
        e = self._progs[id(L)].choice.engine
        return _matmul_session(w_kn, e) if e in ("ort-u8s8", "ort-u8u8") else None

    def _prepare(self, L, t):
        qg, opts = self.qg, self.options
        in_shape = tuple(qg.shape(L.inputs[0])) if L.inputs else ()
        numba = _K.AVAILABLE
        choice = select_engine(L, in_shape, self.features, opts, numba=numba, ort=_ort_ok())
        e = choice.engine
        if e == "numba-gemm" and L.op in ("conv", "gemm"):
            return _SmallGemmProg(L, choice, in_shape)
        if L.op == "conv" and len(in_shape) in (3, 4):
            shape_cl = _shape_cl(in_shape)
            if e == "numba-dw":
                if L.qweight.shape[2:] == (1, 1) and not any(L.pad):
                    return _Dw1x1Prog(L, EngineChoice("numba-lut", "1x1 depthwise (a BatchNorm "
                                      "that could not be folded; float64 not exact for its "
                                      "parameters): one 256-entry table per channel, the "
                                      "contract's formula for every code"),
                                      shape_cl, t)
                return _DwProg(L, choice, shape_cl, t)
            if e == "ort-f32-conv":
                return _F32ConvProg(L, choice, shape_cl, t)
            if e in ("ort-u8s8", "ort-u8u8") or (e == "blas-f32" and L.groups == 1):
                return _GemmConvProg(L, choice, shape_cl, t, self._two)
            if e == "blas-f32":
                cout, cig = L.qweight.shape[:2]
                if not (cig == 1 and cout == L.groups):
                    return _GemmConvProg(L, choice, shape_cl, t, self._two)
        if L.op == "gemm" and e in ("ort-u8s8", "ort-u8u8", "blas-f32"):
            return _GemmProg(L, choice, in_shape, t, self._two)
        if e in ("numba-pool", "numba-max", "numpy-max"):
            return _PoolProg(L, choice, _shape_cl(in_shape), t)
        if e == "numba-lut" and L.op == "add" and \
                tuple(qg.shape(L.inputs[0])) == tuple(qg.shape(L.inputs[1])):
            return _AddProg(L, choice, qg, t)
        if e == "numba-lut" and L.op in ("concat", "rescale"):
            return _ConcatProg(L, choice, qg, t)
        if e == "numba-lut" and L.op == "lut":
            return _LutProg(L, choice)
        if e == "numba-lrn" and len(in_shape) == 4:
            return _LrnProg(L, choice, qg, _shape_cl(in_shape), t)
        if e.startswith("numba") or e.startswith("ort") or e == "blas-f32":
            choice = EngineChoice("numpy", f"{L.op}: shape outside the {e} kernel; the reference kernel")
        return _RefProg(L, choice, qg, opts)


    # ------------------------------------------------------------------ fusion (run only)
    def _shuffle_chains(self):
        """{id(first reshape): (src, [reshape, transpose, reshape])} of every channel
        shuffle in the graph (whatever makes its input): :meth:`run_layers` runs each as
        one channel gather when the three come together."""
        qg, out = self.qg, {}
        cons, outputs = {}, {t.name for t in qg.outputs}
        for L in qg.layers:
            for t in L.inputs:
                cons.setdefault(t, []).append(L)
        producers = {X.output: X for X in qg.layers}
        for X in qg.layers:
            if X.op != "reshape" or X.input not in producers:
                continue
            sh = _shuffle_after(qg, producers[X.input], cons, outputs)
            if sh is not None and sh[1][0] is X:
                step = _Step(X, [X.input], sh[1][-1].output)
                self._pos[id(step)] = self._pos[id(X)]
                out[id(X)] = (sh[1], step, _ShuffleProg(sh[1], sh[0]))
        return out

    def _fuse(self):
        """The steps of :meth:`run`: every layer, except that a row-sliced GEMM conv absorbs
        a channel shuffle after it and/or the residual add consuming it (FastPlan's
        fusions; the intermediate tensors are never made). Returns (steps, progs by step
        id, {fused layer name: conv name})."""
        qg = self.qg
        cons, outputs = {}, {t.name for t in qg.outputs}
        for L in qg.layers:
            for t in L.inputs:
                cons.setdefault(t, []).append(L)
        steps, progs, fused_into, skip = [], {}, {}, set()
        producers = {X.output: X for X in qg.layers}
        for L in qg.layers:
            if id(L) in skip:
                continue
            p = self._progs[id(L)]
            step = None
            if isinstance(p, _GemmConvProg) and p.oshape[0] == 1 \
                    and len(qg.shape(L.input)) == 4 and _K.AVAILABLE:
                out, src, chain = L.output, None, []
                sh = None if p.split == "channels" else _shuffle_after(qg, L, cons, outputs)
                if sh is not None:
                    src, chain = sh
                    out = chain[-1].output
                add = _add_after(qg, L, out, cons, outputs, self._pos, producers)
                if sh is not None or add is not None:
                    other = first = None
                    if add is not None:
                        first = add.inputs[0] == out
                        other = add.inputs[1] if first else add.inputs[0]
                        chain = chain + [add]
                        out = add.output
                    fp = _FusedConvProg(p, src, add, other, first, out, [c.name for c in chain])
                    step = _Step(L, [L.input] + ([other] if other is not None else []), out)
                    progs[id(step)] = fp
                    self._pos[id(step)] = self._pos[id(L)]
                    for c in chain:
                        skip.add(id(c))
                        fused_into[c.name] = L.name
            if step is None:
                step = L
                progs[id(L)] = p
            steps.append(step)
        return steps, progs, fused_into

    def _shareable(self, step):
        """Whether a step's slices may run in a helper process: programs that read the
        environment only while binding (not the reference's run_layer), big enough."""
        p = self._step_progs[id(step)]
        if isinstance(p, _RefProg):
            return False
        L = step.L if isinstance(step, _Step) else step
        return _work(self.qg, L) / max(1, p.slices) >= PROC_HANDOFF_MIN_WORK

    def _helper_stop(self):
        """(helper process) release the engines."""
        self._progs.clear()
        self._step_progs.clear()

    @property
    def _procpool(self):
        return self._pp[0]

    def _helpers(self, start=True):
        """The ProcPool, started on first use with ``start`` together with the native
        helper (objects that never run a whole graph -- the fabric sessions' and the
        real-time runtime's -- or run it only PROC_START_AFTER_RUNS times never start
        processes)."""
        if start and self._want_procs and not self._started:
            self._started = True
            try:
                consts = {k: globals()[k] for k in SLICING_CONSTANTS}
                self._pp[0] = ProcPool(self, self.threads - 1, consts, self._fail_step)
            except (OSError, ValueError) as exc:   # no shared memory, no subprocesses
                self._pool_note = (f"helper processes not started ({type(exc).__name__}: "
                                   f"{exc}); run() uses threads")
            if NATIVE_HELPER:
                try:
                    self._pp[1] = NativeHelper(self, self.threads, self._fail_step)
                except (OSError, ValueError) as exc:
                    self._native_note = (f"native helper not started "
                                         f"({type(exc).__name__}: {exc})")
        return self._pp[0]

    def wait_ready(self, timeout=120.0):
        """With ``Options(pool="processes")``: start the helper processes if need be and
        block until they have prepared (runs before that use the threads); True when they
        all are. Without helper processes: True."""
        pp = self._helpers()
        nat = self._pp[1]
        if pp is None and nat is None:
            return not self._want_procs
        end = time.monotonic() + timeout
        ok = pp is not None and pp.wait_ready(timeout)
        if nat is not None:
            ok = nat.wait_ready(max(0.0, end - time.monotonic())) and ok
        return ok

    def _live_modes(self):
        """The helper modes a run can use now (['helpers', 'native'], those live), or None
        while one that was started is still preparing."""
        pp, nat = self._pp
        modes = []
        if pp is not None:
            live = pp.live()
            if any(not (h.ready or h.dead) for h in pp.helpers):
                return None
            if live:
                modes.append("helpers")
        if nat is not None:
            if not nat.settled():
                return None
            if nat.live():
                modes.append("native")
        return modes

    def _calibration_mode(self):
        """The mode of the next calibration run: each helper mode's warm-up runs first,
        then the modes (and the caller alone) in turn; None before anything is ready."""
        modes = self._live_modes()
        if not modes:
            return None
        c = self._calib
        for m in modes:
            if len(c[m]) < CALIBRATION_WARMUP:
                return m
        return min(modes + ["caller"], key=lambda m: len(c[m]) - (
            0 if m == "caller" else CALIBRATION_WARMUP))

    def pool_report(self):
        """{kind: 'threads' | 'processes' | 'plan', threads, helpers: live slice helper
        processes, native: whether the native helper is live, note, last_run:
        {caller_slices, helper_slices} or None, mode: None while calibrating, then
        'helpers' | 'native' | 'caller', calibration_ms: {mode: fastest calibration run}}:
        how :meth:`run` spreads its work ('plan': a small network, run whole as one
        :class:`NetPlan` in the caller)."""
        if self._plan is not None:
            return {"kind": "plan", "threads": self.threads, "helpers": 0,
                    "note": f"small-network plan: {self._plan.macs} MACs, one numba call per layer",
                    "last_run": None, "mode": "plan", "calibration_ms": {}}
        pp, nat = self._pp
        live = len(pp.live()) if pp is not None else 0
        notes = [getattr(self, "_pool_note", None) or (pp.note if pp is not None else None),
                 getattr(self, "_native_note", None) or (nat.note if nat is not None else None)]
        note = "; ".join(n for n in notes if n) or None
        cal = {k: round(float(min(v)), 3) for k, v in self._calib.items() if v}
        return {"kind": "processes" if pp is not None or nat is not None else "threads",
                "threads": self.threads, "helpers": live,
                "native": bool(nat is not None and nat.live()), "note": note,
                "last_run": pp.last_run if pp is not None else None,
                "mode": self._mode, "calibration_ms": cal}

    # ------------------------------------------------------------------ running
    def _check_open(self):
        if self._closed:
            raise DnnfabError("CpuWorkers is closed; create a new CpuWorkers(qg) to run again")

    def run_layers(self, env, layers, times=None):
        """Run ``layers`` (a list in topological order, layers of the bound graph) into
        ``env`` (a :class:`~dnnfab.sw.cpu.reference.Env` holding their inputs); layers
        whose inputs are ready run concurrently, big ones sliced over all threads.
        ``times``: a dict that receives ``{layer name: (start, end)}`` (perf_counter)."""
        self._check_open()
        for L in layers:
            if id(L) not in self._progs:
                raise DnnfabError(f"layer {L.name!r} is not a layer of the graph these "
                                  "CpuWorkers were built for; build CpuWorkers(qg) for its graph")
        progs, fused = self._progs, []
        if self._shuffles and len(layers) >= 3:
            steps, i = [], 0
            while i < len(layers):
                L = layers[i]
                sh = self._shuffles.get(id(L))
                if sh is not None and len(layers) >= i + 3 and \
                        all(a is b for a, b in zip(layers[i:i + 3], sh[0])):
                    chain, step, prog = sh
                    if progs is self._progs:
                        progs = dict(self._progs)
                    progs[id(step)] = prog
                    steps.append(step)
                    fused.append(chain)
                    i += 3
                    continue
                steps.append(L)
                i += 1
            layers = steps
        with self._lock:
            if self.threads == 1:
                _run_inline(progs, env, layers, times)
            else:
                _Run(self, env, layers, progs=progs, times=times).run()
        if times is not None:
            for chain in fused:                 # the shuffle's time is its first layer's
                end = times.get(chain[0].name, (None, None))[1]
                for L in chain[1:]:
                    times[L.name] = (end, end)
        return env

    def run_layer(self, env, L):
        """Run one layer into ``env``, its slices on all threads."""
        return self.run_layers(env, [L])

    def run(self, feed_q):
        """The whole graph on int8 inputs ``feed_q`` {name: int8 logical array}; returns
        ``{output name: int8 array}`` (logical layout), equal to ``run_reference``. Channel
        shuffles and residual adds after GEMM convs are fused into them here (see
        :meth:`_fuse`; ``run_layers`` runs every layer as it is)."""
        env = R.Env(self.qg)
        for t in self.qg.inputs:
            x = np.asarray(feed_q[t.name])
            if x.dtype != np.int8:
                raise DnnfabError(f"CpuWorkers.run needs int8 inputs; got {x.dtype} for "
                                  f"{t.name!r} (quantize_inputs first)")
            env.put(t.name, x, "lg")
        self._check_open()
        if self._plan is not None:
            with self._lock:
                self._runs += 1
                return self._plan.run({t.name: env.lg(t.name) for t in self.qg.inputs})
        with self._lock:
            self._runs += 1
            pp = self._helpers(self._runs > PROC_START_AFTER_RUNS)
            nat = self._pp[1]
            live = pp is not None and bool(pp.live())
            mode = self._mode
            if mode is None:            # calibrating: the helpers' warm-up, then in turn
                mode = self._calibration_mode()
            if mode == "native" and nat is not None and nat.live():
                t0 = time.perf_counter()
                slowest = max((max(v) for v in self._calib.values() if v), default=0.0)
                res = nat.run({t.name: env.lg(t.name) for t in self.qg.inputs},
                              timeout=NATIVE_TIMEOUT_S + NATIVE_TIMEOUT_FACTOR * slowest / 1e3)
                if isinstance(res, dict):
                    self._calibrated("native", t0)
                    return res
                if res is not None:     # ('err', layer, text): a layer raised there
                    raise CpuTaskError(f"{res[2]} (in the native helper process "
                                       f"{nat.proc.pid})", layer=res[1])
                mode = None             # the helper is gone: this run on the threads
            if mode == "caller":
                t0 = time.perf_counter()
                _run_inline(self._step_progs, env, self._steps)
                self._calibrated("caller", t0)
                return {t.name: env.lg(t.name) for t in self.qg.outputs}
            if mode == "helpers" and live:
                t0 = time.perf_counter()
                pp.arena.reset()
                aenv = ArenaEnv(self.qg, pp.arena)
                pp.arena.context(("inputs",))
                for name, (x, lay) in env.v.items():
                    aenv.put(name, x, lay)
                pp.arena.context(None)
                err = ProcRun(self, pp, aenv, self._steps,
                              [self._step_progs[id(s)] for s in self._steps],
                              self._remote).run()
                if err is not None:
                    _raise(*err)
                # the arena is rewritten by the next run: the outputs are copies
                out = {t.name: np.array(aenv.lg(t.name)) for t in self.qg.outputs}
                self._calibrated("helpers", t0)
                return out
            if self.threads == 1:
                _run_inline(self._step_progs, env, self._steps)
            else:
                _Run(self, env, self._steps, self._step_progs).run()
        return {t.name: env.lg(t.name) for t in self.qg.outputs}

    def _calibrated(self, mode, t0):
        if self._mode is not None:
            return
        c = self._calib
        c[mode].append((time.perf_counter() - t0) * 1e3)
        modes = (self._live_modes() or []) + ["caller"]
        if all(len(c[m]) >= CALIBRATION_RUNS + (0 if m == "caller" else CALIBRATION_WARMUP)
               for m in modes):
            for m in modes:
                if m != "caller":
                    del c[m][:CALIBRATION_WARMUP]
            for m in list(c):
                if m not in modes:      # a helper lost during calibration
                    c[m] = []
            self._mode = min(modes, key=lambda k: min(c[k]))
            ran = ", ".join(f"{m} {min(c[m]):.3f} ms" for m in modes)
            # the others are not worth their memory (a copy of every engine session)
            if self._mode != "helpers" and self._pp[0] is not None:
                self._pp[0].shutdown()
                self._pool_note = f"helpers stopped: {self._mode} was fastest ({ran})"
            if self._mode != "native" and self._pp[1] is not None:
                self._pp[1].shutdown()
                self._native_note = f"native helper stopped: {self._mode} was fastest ({ran})"

    # ------------------------------------------------------------------ reports
    def engine_report(self):
        """{layer name: {engine, reason, split, slices}}: the selector's choice and why; in
        :meth:`run`, a conv with layers fused into it lists them (``fused``) and each of
        those names it (``fused_into``)."""
        rep = {}
        for L in self.qg.layers:
            p = self._progs[id(L)]
            rep[L.name] = {"engine": p.choice.engine, "reason": p.choice.reason,
                           "split": p.split, "slices": p.slices}
            if L.name in self._fused_into:
                rep[L.name]["fused_into"] = self._fused_into[L.name]
            if L.name in self._notes:
                rep[L.name]["note"] = self._notes[L.name]
            if self._plan is not None:
                rep[L.name]["plan"] = ("run() runs the network as one small-network plan "
                                       f"(netplan.py, {self._plan.macs} MACs): one numba "
                                       "call per layer")
        for st in self._steps:
            fp = self._step_progs[id(st)]
            if isinstance(fp, _FusedConvProg):
                rep[st.name]["fused"] = fp.fused
        return rep

    def close(self):
        """Stop and join the pool threads (idempotent)."""
        self._closed = True
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<CpuWorkers {self.qg.name!r}: {self.threads} threads{', closed' if self._closed else ''}>"

"""The fast model's compiled form of a program: what the instruction stream computes, as
a few large operations per launch.

Addresses in this instruction set never depend on data. So once per program (cached by
its bytes) :func:`trace` plays the steps in the token machine's take order *on addresses
only*: it tracks, for every row of the activation, weight and aux scratchpads, the DRAM
row its bytes were loaded from and when. Each COMPUTE then reads DRAM directly: its
implicit im2col is the geometry's index array plus one offset (when the rows it reads
came from one contiguous load, the compiler's layout), its weight block and aux lane
are DRAM addresses. COMPUTEs that share their activations and start and finish their
accumulators are one matrix product (the M tiles of a band); chunked ones accumulate
into the model's accumulator array; STOREs copy the output scratchpad to DRAM as before.
The row bands of a layer (same weights) become one product computed at the first band
(:func:`_merge_bands`), each band's rows still written at its own place; products that
gather the same activations become one over their weight columns (:func:`_merge_tiles`).
Each product is a "prod" op with its gather and scatter as flat index arrays, run by one
numba call (:func:`~dnnfab.sw.cpu.kernels.plan_prod_f32`: float32 BLAS below
:data:`SMALL_MACS`) or a numba gather, an onnxruntime u8 x u8 product and a numba finish.

The trace is *checked*, never assumed: it gives up (the model then executes instruction
by instruction, :class:`~.fastmodel.FastModel`'s step path) when a COMPUTE reads a
scratchpad row no LOAD of this program filled, when the rows it reads did not come from
one contiguous DRAM range, or when a STORE overwrites a DRAM range between the LOAD that
read it and the COMPUTE that uses it (the scratchpad would hold the old bytes). At
launch the DMA's write window, DRAM bounds and injected bus faults are checked against
the program's transfer list; any hit sends that launch to the step path, which raises
the fault at the right instruction. Results are bit-identical either way (tested).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from ...hw.spec import TARGET_ACT, TARGET_WGT, TARGET_AUX, AUX_DTYPE, AUX_LANE_BYTES
from ..ir.qgraph import requantize
from ..compiler.fastmodel import _wrap32
from ..cpu import kernels as _kernels

__all__ = ["Plan", "trace", "run_plan", "exact_matmul", "EXACT_K"]

#: bytes per page of the fast model's DRAM write epochs (operand cache invalidation)
PAGE = 256

#: K chunk of the float32 products (see the module docstring)
EXACT_K = 1024


def exact_matmul(a, w):
    """int64 ``a @ w`` for int8-valued float32 ``a`` [P, K] and ``w`` [K, N]."""
    return exact_matmul_f(a, w).astype(np.int64)


def exact_matmul_f(a, w):
    """``a @ w`` as exact integers in float32 (K <= EXACT_K: every partial sum is below
    2^24) or float64 (the sum of float32 chunks; below 2^53)."""
    K = a.shape[1]
    if K <= EXACT_K:
        return a @ w
    acc = np.zeros((a.shape[0], w.shape[1]), np.float64)
    for k0 in range(0, K, EXACT_K):
        acc += a[:, k0:k0 + EXACT_K] @ w[k0:k0 + EXACT_K]
    return acc


class _U8U8:
    """``a @ w`` for int8 ``a`` [P, K] and ``w`` [K, N] through one onnxruntime
    ``MatMulInteger`` uint8 x uint8 session with both operands as inputs (any shape):
    ``a ^ 0x80`` and ``w ^ 0x80`` are the codes + 128 and both zero points are 128, so
    the session returns ``a @ w`` in int32. Exact on every CPU (MLAS widens u8 x u8 to 16
    bits; see dnnfab.sw.cpu.engines) while 255 * 255 * K < 2^31; one intra-op thread
    that sleeps when idle, like the rest of the fast model."""

    def __init__(self):
        from onnx import TensorProto, helper
        from ..cpu.reference import _ort_session
        node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
        z = [helper.make_tensor("az", TensorProto.UINT8, [], [128]),
             helper.make_tensor("bz", TensorProto.UINT8, [], [128])]
        self.sess = _ort_session([node],
                                 [helper.make_tensor_value_info("a", TensorProto.UINT8, ["P", "K"]),
                                  helper.make_tensor_value_info("b", TensorProto.UINT8, ["K", "N"])],
                                 [helper.make_tensor_value_info("y", TensorProto.INT32, ["P", "N"])],
                                 z, 1)

    def __call__(self, a_i8, w_u8):
        a = np.ascontiguousarray(a_i8).view(np.uint8) ^ np.uint8(0x80)
        return self.sess.run(None, {"a": a, "b": w_u8})[0]


_MM = []


def _matmul():
    """The process's :class:`_U8U8`, or None without onnxruntime (then float32 BLAS)."""
    if not _MM:
        try:
            from ..cpu.reference import _ort_available
            _MM.append(_U8U8() if _ort_available() else None)
        except Exception:                                   # pragma: no cover
            _MM.append(None)
    return _MM[0]


def _product(A, W):
    """Exact ``A @ W`` (int8 A gathered from DRAM) for a cached operand ``W``:
    (uint8 ``w + 128`` for onnxruntime, or float32 for BLAS; see :func:`_operand`)."""
    if W.dtype == np.uint8:
        return _matmul()(A, W)
    return exact_matmul_f(A.astype(np.float32), W)


def _operand(W):
    """The cached form of an int8 weight block [K, N]."""
    from ..cpu.engines import U8U8_MAX_K
    if W.shape[0] <= U8U8_MAX_K and _matmul() is not None:
        return np.ascontiguousarray(W, np.int8).view(np.uint8) ^ np.uint8(0x80)
    return W.astype(np.float32)


def _finish(acc, bias, m, n, zy, lo, hi):
    """int8 ``requantize(wrap32(acc + bias))`` (one compiled pass when numba is there)."""
    if _kernels.AVAILABLE:
        y = np.empty(acc.shape, np.int8)
        return _kernels.requant_wrap_rows(acc, bias, m, n, np.int64(zy), np.int64(lo),
                                          np.int64(hi), y)
    return requantize(_wrap32(acc.astype(np.int64) + bias), m, n, zy, lo, hi)




class Plan:
    """A traced program: ``ops`` in take order, the transfer list for the launch checks
    and the counters a run adds."""

    def __init__(self, ops, loads, stores, counters):
        self.ops = ops
        self.loads = loads          # int64 [n, 2]: DRAM [lo, hi) of every load row
        self.stores = stores        # int64 [n, 2]
        self.counters = counters


class _Track:
    """Per scratchpad row: the DRAM row it came from (-1: not loaded) and the load step."""

    def __init__(self, nrows, width):
        self.src = np.full(nrows, -1, np.int64)
        self.when = np.full(nrows, -1, np.int64)
        self.width = width


def _affine(track, r0, r1):
    """DRAM row of scratchpad row ``r0`` if rows [r0, r1) map to consecutive DRAM rows,
    plus the latest load step among them; None if not."""
    src = track.src[r0:r1]
    if len(src) == 0 or src[0] < 0:
        return None
    if not np.array_equal(src - src[0], np.arange(r1 - r0)):
        return None
    return int(src[0]), int(track.when[r0:r1].max())


def trace(fm, prog):
    """The :class:`Plan` of a prepared program (``prog.steps`` of the step path), or None
    when the program is outside what the plan handles (see the module docstring)."""
    cfg = fm.cfg
    R, C = cfg.rows, cfg.cols
    if prog.bad is not None:
        return None
    tracks = {TARGET_ACT: _Track(len(fm.act) // R, R), TARGET_WGT: _Track(len(fm.wgt) // C, C),
              TARGET_AUX: _Track(len(fm.aux) // (C * AUX_LANE_BYTES), C * AUX_LANE_BYTES)}
    sp_target = {id(fm.act): TARGET_ACT, id(fm.wgt): TARGET_WGT, id(fm.aux): TARGET_AUX}
    ops, loads, stores = [], [], []
    store_steps, store_rng = [], []
    counters = dict(macs=0, dma_rd_bytes=0, dma_wr_bytes=0, insns=0, array_beats=0)

    def clobbered(lo, hi, t0, t1):
        """A store between steps t0 and t1 wrote DRAM bytes [lo, hi)."""
        k = bisect_right(store_steps, t0)
        for s in range(k, len(store_steps)):
            if store_steps[s] >= t1:
                break
            a, b = store_rng[s]
            if a < hi and lo < b:
                return True
        return False

    for step, st in enumerate(prog.steps):
        kind = st[0]
        if kind == "fault":
            return None
        counters["insns"] += 1
        if kind == "load":
            _, ins, sp, rows, n, _, i = st
            tr = tracks[sp_target[id(sp)]]
            w = tr.width
            for a, off in rows:
                loads.append((a, a + n))
                if a % w or off % w or n % w:
                    return None
                r0, k = off // w, n // w
                tr.src[r0:r0 + k] = np.arange(a // w, a // w + k)
                tr.when[r0:r0 + k] = step
            counters["dma_rd_bytes"] += n * len(rows)
        elif kind == "store":
            _, ins, sp, rows, n, _, i = st
            for a, off in rows:
                stores.append((a, a + n))
                store_steps.append(step)
                store_rng.append((a, a + n))
            ops.append(("store", (rows, n)))
            counters["dma_wr_bytes"] += n * len(rows)
        else:
            _, c, idx, akey, a_range, P, kt, i = st
            counters["array_beats"] += kt * P
            counters["macs"] += kt * P * R * C
            valid = idx >= 0
            if not valid.any():
                return None
            lo_r = c.a_base + int(idx[valid].min())
            hi_r = c.a_base + int(idx.max()) + 1
            a = _affine(tracks[TARGET_ACT], lo_r, hi_r)
            wgt = _affine(tracks[TARGET_WGT], c.w_base, c.w_base + kt * R)
            need_aux = c.acc_init or c.finalize
            aux = _affine(tracks[TARGET_AUX], c.aux_addr, c.aux_addr + 1) if need_aux else (0, -1)
            if a is None or wgt is None or aux is None:
                return None
            a_row0, a_t = a
            w_row0, w_t = wgt
            x_row0, x_t = aux
            if clobbered(a_row0 * R, (a_row0 + hi_r - lo_r) * R, a_t, step) or \
               clobbered(w_row0 * C, (w_row0 + kt * R) * C, w_t, step) or \
               (need_aux and clobbered(x_row0 * C * AUX_LANE_BYTES,
                                       (x_row0 + 1) * C * AUX_LANE_BYTES, x_t, step)):
                return None
            a_off = a_row0 - lo_r + c.a_base     # DRAM row of scratchpad row a_base + idx
            pad = None if valid.all() else ~valid
            w_addr = w_row0 * C
            x_addr = x_row0 * C * AUX_LANE_BYTES
            ops.append(("job", {"c": c, "idx": idx, "pad": pad, "a_off": a_off, "P": P, "K": kt * R,
                                "w": w_addr, "x": x_addr, "step": step,
                                "a_rng": (a_row0 * R, (a_row0 + hi_r - lo_r) * R),
                                "w_rng": (w_addr, w_addr + kt * R * C)}))
    ops = _combine(ops, clobbered, R)
    guards = []
    for step_no, (kind, g) in enumerate(ops):
        if kind == "chunk":
            g["zx"] = g["c"].zx
            g["zx_row"] = np.full(R, g["zx"], np.int8).view(np.dtype((np.void, R)))[0]
            lo, hi = min(g["w"], g["x"]), max(g["w"] + g["K"] * C, g["x"] + C * AUX_LANE_BYTES)
        if kind == "group":
            ws = [a for segs in g["w_segs"] for a, _ in segs]
            wk = [a + k * C for segs in g["w_segs"] for a, k in segs]
            xs = g["xb"] + g["xm"]
            lo, hi = min(min(ws), min(xs)), max(max(wk), max(xs) + C * AUX_LANE_BYTES)
            g["parts"] = [(idx, pad, a_off, np.full(R, zx, np.int8).view(np.dtype((np.void, R)))[0], k)
                          for idx, pad, a_off, zx, k in g["parts"]]
        if kind in ("group", "chunk"):
            g["guard"] = (int(lo), int(hi))
            guards.append(g["guard"])
            g["gid"] = len(guards) - 1
        if kind == "group":
            ob = np.asarray([o for o, _ in g["out"]], np.int64)
            os_ = np.asarray([s for _, s in g["out"]], np.int64)
            g["out_rows"] = ob[None, :] + np.arange(g["P"])[:, None] * os_[None, :]   # [P, n]
    ops = _merge_bands(ops, R, C)
    ops = _merge_tiles([_flatten(op, R) for op in ops], R, C)
    # an operand block a store of this same program may overwrite is never cached
    st = np.asarray(stores, np.int64).reshape(-1, 2)
    gd = np.asarray(guards, np.int64).reshape(-1, 2)
    self_hit = ((st[None, :, 0] < gd[:, None, 1]) & (gd[:, None, 0] < st[None, :, 1])).any(1) \
        if len(st) and len(gd) else np.zeros(len(gd), bool)
    as_arr = lambda v: np.asarray(v, np.int64).reshape(-1, 2)
    plan = Plan(ops, as_arr(loads), st, counters)
    plan.guards = gd
    plan.cacheable = ~self_hit
    plan.cache = {}
    plan.mcache = {}
    plan.built = np.zeros(len(gd), np.int64)       # write epoch each cached operand was read at
    plan.seen_epoch = -1
    pages = [np.arange(lo // PAGE, (hi - 1) // PAGE + 1) for lo, hi in gd]
    plan.guard_pages = np.concatenate(pages) if pages else np.zeros(0, np.int64)
    plan.guard_off = np.cumsum([0] + [len(p) for p in pages[:-1]]).astype(np.int64)
    sp = [np.arange(lo // PAGE, (hi - 1) // PAGE + 1) for lo, hi in st if hi > lo]
    plan.store_pages = np.unique(np.concatenate(sp)) if sp else np.zeros(0, np.int64)
    return plan


def _wkey(g):
    """What makes two groups one product with stacked rows: the same weight blocks, aux
    lanes, requantize clamp and K split (the bands of one layer)."""
    return (tuple(tuple(x) for x in g["w_segs"]), tuple(g["xb"]), tuple(g["xm"]), g["zy"],
            g["lo"], g["hi"], tuple(p[4] for p in g["parts"]))


def _src_rng(g, R):
    """DRAM bytes [lo, hi) the group's activations are gathered from."""
    lo, hi = None, None
    for idx, pad, a_off, _, _ in g["parts"]:
        v = idx if pad is None else idx[~pad]
        if v.size:
            a, b = (int(v.min()) + a_off) * R, (int(v.max()) + a_off + 1) * R
            lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
    return (lo or 0, hi or 0)


#: products below this many MACs go to float32 BLAS (exact for K <= EXACT_K), not to
#: onnxruntime: its per-call cost (~30 us here) is more than a small product's whole time
#: (measured at 224x40x32: 42 us onnxruntime, 20 us float32 with the int8 -> float32
#: conversion; break-even near 2M MACs)
SMALL_MACS = 1 << 21

#: how far ahead (plan ops) :func:`_merge_bands` looks for a group with the same weights
MERGE_WINDOW = 256


def _ahead(ops, i, used, stores):
    """The ops after ``ops[i]`` that a merge may pull forward: (j, kind, op) within
    MERGE_WINDOW, skipping those already merged (``used``); the STOREs passed on the way
    are appended to ``stores`` (what a pulled-forward read must not overlap)."""
    for j in range(i + 1, min(len(ops), i + MERGE_WINDOW)):
        if j in used:
            continue
        k2, h = ops[j]
        if k2 == "store":
            stores.append(h)
            continue
        yield j, k2, h


def _merge_bands(ops, R, C):
    """Groups with the same weights (the row bands of a layer, also when the M tiles of a
    grouped conv interleave them) become one product over their stacked rows ("bands"),
    computed at the first one's place; each later band's output rows are still written
    at that band's own place in the plan (a "scatter" op), so every write to the output
    scratchpad keeps its order and a STORE in between copies what it copied before. What
    moves is only the later bands' reads (activations, weights, aux): they move across
    STOREs that must not write those DRAM bytes. A chunked job ends the search. The
    per-band products are the expensive part of small-channel layers (one product each)."""
    out, used, n = [], {}, len(ops)
    for i in range(n):
        if i in used:
            out.append(("scatter", used.pop(i)))
            continue
        kind, g = ops[i]
        if kind != "group":
            out.append(ops[i])
            continue
        key, members = _wkey(g), [g]
        bands = {"members": members, "gid": g["gid"]}
        stores = []
        for j, k2, h in _ahead(ops, i, used, stores):
            if k2 != "group":
                break
            if _wkey(h) != key:
                continue
            if _stores_write(stores, [_src_rng(h, R), h["guard"]]):
                break                               # a store in between writes what it reads
            used[j] = (bands, len(members))
            members.append(h)
        out.append(("group", g) if len(members) == 1 else ("bands", bands))
    return out


def _flatten(op, R):
    """A "group" or "bands" op as one "prod": its whole im2col as a single gather (absolute
    DRAM row indices [P, K/R], the padding mask and its fill) and all its output rows as a
    single scatter ([P, tiles]), so a run costs one fancy index each way whatever the
    number of bands and K parts. Other ops pass through."""
    kind, g = op
    if kind not in ("group", "bands"):
        return op
    ms = g["members"] if kind == "bands" else [g]
    idx_rows, pad_rows, fills = [], [], []
    for h in ms:
        cols, pads, fl = [], [], []
        for idx, pad, a_off, zx_row, k in h["parts"]:
            cols.append((idx + a_off).reshape(h["P"], k // R))
            pm = np.zeros(idx.shape, bool) if pad is None else pad
            pads.append(pm.reshape(h["P"], k // R))
            fl.append(np.full((h["P"], k // R), zx_row))
        ci, cp = np.concatenate(cols, 1), np.concatenate(pads, 1)
        idx_rows.append(np.where(cp, 0, ci))
        pad_rows.append(cp)
        fills.append(np.concatenate(fl, 1)[cp])
    idx, pad = np.concatenate(idx_rows), np.concatenate(pad_rows)
    fill = np.concatenate(fills)
    if not pad.any():
        pad = fill = None
    elif (fill == fill[0]).all():
        fill = fill[0]
    g0 = ms[0]
    prod = {"idx": idx, "pad": pad, "fill": fill, "P": idx.shape[0],
            "K": g0["K"], "zy": g0["zy"], "lo": g0["lo"], "hi": g0["hi"],
            "gids": [g0["gid"]], "ops": [g0], "out_rows": g0["out_rows"],
            "src": [_src_rng(h, R) for h in ms], "guards": [g0["guard"]]}
    if len(ms) > 1:                 # hoisted bands: the product into a buffer, then scatters
        tiles = g0["out_rows"].shape[1]
        prod["segs"] = []
        r = 0
        for h in ms:
            prod["segs"].append((r, r + h["P"], np.ascontiguousarray(h["out_rows"], np.int64)))
            r += h["P"]
        prod["buf_rows"] = np.arange(r * tiles, dtype=np.int64).reshape(r, tiles)
        g["prod"] = prod            # the "scatter" ops of the later bands find it here
    return ("prod", prod)


def _stores_write(stores, ranges):
    """Any of ``stores`` ((rows, n) ops) writes DRAM bytes in one of ``ranges`` [(lo, hi)]."""
    return any(a < hi and lo < a + nb for srows, nb in stores for a, _ in srows
               for lo, hi in ranges)


def _same_gather(g, h):
    """Two "prod" ops gather the same activations (indices, padding and its fill) and
    requantize with the same clamp."""
    if (h["K"], h["P"], h["zy"], h["lo"], h["hi"]) != (g["K"], g["P"], g["zy"], g["lo"], g["hi"]):
        return False
    if not np.array_equal(h["idx"], g["idx"]) or (h["pad"] is None) != (g["pad"] is None):
        return False
    return g["pad"] is None or (np.array_equal(h["pad"], g["pad"]) and
                                np.array_equal(h["fill"], g["fill"]))


def _merge_tiles(ops, R, C):
    """"prod" ops that gather the same activations with the same requantize clamp (the M
    tiles of a layer that the instruction order visits one weight tile at a time, e.g.
    every group of a grouped conv) become one product over their concatenated weight
    columns -- under :func:`_merge_bands`' conditions for pulling a later op forward."""
    out, used, n = [], set(), len(ops)
    for i in range(n):
        if i in used:
            continue
        kind, g = ops[i]
        if kind != "prod" or "segs" in g:
            if kind == "prod":
                _engine(g, R, C)
            out.append(ops[i])
            continue
        members, stores, others = [g], [], [g["out_rows"].ravel()]
        for j, k2, h in _ahead(ops, i, used, stores):
            if k2 == "scatter":
                break                       # a write to the output rows in between
            if k2 != "prod" or "segs" in h:
                break
            rows = h["out_rows"].ravel()
            if not _same_gather(g, h):
                others.append(rows)
                continue
            ob = rows * C
            if any(np.intersect1d(rows, o).size for o in others) or \
                    any(((ob + C > off) & (ob < off + nb)).any()     # overwrites what it reads
                        for srows, nb in stores for _, off in srows) or \
                    _stores_write(stores, h["src"] + h["guards"]):   # writes what it reads
                break
            members.append(h)
            others.append(rows)
            used.add(j)
        if len(members) > 1:
            g = dict(g, gids=[x for h in members for x in h["gids"]],
                     ops=[x for h in members for x in h["ops"]],
                     out_rows=np.concatenate([h["out_rows"] for h in members], 1))
        _engine(g, R, C)
        out.append(("prod", g))
    return out


def _engine(g, R, C):
    """A "prod"'s product engine (float32 BLAS below SMALL_MACS) and its padding as the
    kernels take it."""
    g["f32"] = g["K"] <= EXACT_K and g["P"] * g["K"] * g["out_rows"].shape[1] * C < SMALL_MACS
    if g["pad"] is None:
        g["padv"] = np.zeros((1, 1), np.int16)
    else:
        g["padv"] = np.full(g["pad"].shape, 256, np.int16)
        fill = g["fill"]
        fz = (np.frombuffer(fill.tobytes(), np.int8)[::R] if np.ndim(fill)
              else np.int8(np.frombuffer(fill.tobytes(), np.int8)[0]))
        g["padv"][g["pad"]] = fz
    g["out_rows"] = np.ascontiguousarray(g["out_rows"], np.int64)
    g["idx"] = np.ascontiguousarray(g["idx"], np.int64)


def _combine(ops, clobbered, R):
    """Turn the per-COMPUTE jobs into the plan's ops: a K-chunked chain (first chunk starts
    the accumulators, the last finalizes, same pixels) becomes one job over the whole K
    (int32 wrap-around is associative, so one wrap at the end gives the same bits), unless
    a STORE between its chunks overwrites what an earlier chunk read; consecutive
    finalizing jobs over the same activations become one group (one product over all
    their M tiles). A chain that cannot be fused stays as "chunk" ops."""
    out = []
    i, n = 0, len(ops)

    def single(j):
        c = j["c"]
        return {"parts": [(j["idx"], j["pad"], j["a_off"], c.zx, j["K"])], "P": j["P"],
                "K": j["K"], "zy": c.zy, "lo": c.lo, "hi": c.hi, "w_segs": [[(j["w"], j["K"])]],
                "xb": [j["x"]], "xm": [j["x"]], "out": [(c.out_base, c.out_stride)]}

    jobs = []                     # ("store", ...) | ("fused", group dict) | ("chunk", job)
    while i < n:
        kind, j = ops[i]
        if kind != "job":
            jobs.append((kind, j))
            i += 1
            continue
        c = j["c"]
        if c.acc_init and c.finalize:
            jobs.append(("fused", single(j)))
            i += 1
            continue
        chain, stores, k = [j], [], i + 1
        ok = bool(c.acc_init and not c.finalize)
        while ok and k < n:
            kk, jj = ops[k]
            if kk == "store":
                stores.append(ops[k])
                k += 1
                continue
            if kk != "job":
                ok = False
                break
            cc = jj["c"]
            if cc.acc_init or cc.acc_base != c.acc_base or jj["P"] != j["P"] or cc.zx != c.zx:
                ok = False
                break
            chain.append(jj)
            k += 1
            if cc.finalize:
                break
        ok = ok and chain[-1]["c"].finalize and len(chain) > 1
        if ok:
            t1 = chain[-1]["step"]
            for jj in chain[:-1]:
                if clobbered(*jj["a_rng"], jj["step"], t1) or clobbered(*jj["w_rng"], jj["step"], t1):
                    ok = False
                    break
        if not ok:
            jobs.append(("chunk", j))
            i += 1
            continue
        last = chain[-1]["c"]
        jobs.extend(stores)        # they ran before the chain's finalizing chunk
        jobs.append(("fused", {
            "parts": [(jj["idx"], jj["pad"], jj["a_off"], jj["c"].zx, jj["K"]) for jj in chain],
            "P": j["P"], "K": sum(jj["K"] for jj in chain), "zy": last.zy, "lo": last.lo,
            "hi": last.hi, "w_segs": [[(jj["w"], jj["K"]) for jj in chain]],
            "xb": [j["x"]], "xm": [chain[-1]["x"]], "out": [(last.out_base, last.out_stride)]}))
        i = k
    # consecutive finalizing jobs over the same activations: one group
    for kind, g in jobs:
        if kind == "fused":
            key = (tuple((id(p[0]), p[2], p[3], p[4]) for p in g["parts"]), g["P"], g["zy"],
                   g["lo"], g["hi"])
            if out and out[-1][0] == "group" and out[-1][1]["key"] == key:
                h = out[-1][1]
                h["w_segs"] += g["w_segs"]
                h["xb"] += g["xb"]
                h["xm"] += g["xm"]
                h["out"] += g["out"]
            else:
                g["key"] = key
                out.append(("group", g))
        elif kind == "chunk":
            out.append(("chunk", {k: g[k] for k in ("idx", "pad", "a_off", "P", "K", "w", "x", "c")}))
        else:
            out.append((kind, g))
    return out


def _activations(dram_rows, g):
    """A chunk's im2col [P, K] as float32: one gather of R-byte rows (``dram_rows`` is DRAM
    viewed as one opaque R-byte element per row, so each element is one copy)."""
    return _gather(dram_rows, g["idx"], g["pad"], g["a_off"], g["zx_row"]).reshape(g["P"], g["K"])


def _gather(dram_rows, idx, pad, a_off, zx_row):
    A = dram_rows[idx + a_off if pad is None else np.where(pad, 0, idx + a_off)]
    if pad is not None:
        A[pad] = zx_row
    return A.view(np.int8)


def _lanes(dram, addrs, C):
    nb = C * AUX_LANE_BYTES
    raw = dram[np.add.outer(addrs, np.arange(nb)).ravel()]
    return raw.view(AUX_DTYPE)


def _invalidate(fm, plan):
    """Drop cached operands whose DRAM pages were written since they were read (host
    writes and every launch's stores bump the pages' write epochs in ``fm``)."""
    if plan.seen_epoch == fm.epoch:
        return
    plan.seen_epoch = fm.epoch
    if not plan.cache:
        return
    last = np.maximum.reduceat(fm.page_epoch[plan.guard_pages], plan.guard_off)
    for k in [k for k in plan.cache if last[k] > plan.built[k]]:
        del plan.cache[k]


def _operands(dram, dram_i8, plan, g, C, kind, f32=False):
    """(W [K, n*C] in its product's form, aux lanes) of a group or chunk, cached when
    allowed; ``f32``: float32 for BLAS whatever :func:`_operand` would pick."""
    hit = plan.cache.get(g["gid"])
    if hit is not None:
        return hit
    K = g["K"]
    if kind == "group":
        segs = g["w_segs"]
        n = len(segs)
        blocks = []
        for p in range(len(segs[0])):
            kp = segs[0][p][1]
            addrs = np.asarray([s[p][0] for s in segs], np.int64)
            blk = dram_i8[np.add.outer(addrs, np.arange(kp * C)).ravel()].reshape(n, kp, C)
            blocks.append(blk.transpose(1, 0, 2).reshape(kp, n * C))
        W = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        lb = _lanes(dram, np.asarray(g["xb"], np.int64), C)
        lm = lb if g["xb"] == g["xm"] else _lanes(dram, np.asarray(g["xm"], np.int64), C)
        lanes = (np.ascontiguousarray(lb["bias"], np.int64), np.ascontiguousarray(lm["m"], np.int64),
                 np.ascontiguousarray(lm["n"], np.int64))
    else:
        W = dram_i8[g["w"]:g["w"] + K * C].reshape(K, C)
        lane = _lanes(dram, np.asarray([g["x"]]), C)
        lanes = (np.ascontiguousarray(lane["bias"], np.int64).ravel(),
                 np.ascontiguousarray(lane["m"], np.int64).ravel(),
                 np.ascontiguousarray(lane["n"], np.int64).ravel())
    W = W.astype(np.float32) if f32 else _operand(W)
    if plan.cacheable[g["gid"]]:
        plan.cache[g["gid"]] = (W, lanes)
        plan.built[g["gid"]] = plan.seen_epoch
    return W, lanes


def _prod_operands(dram, dram_i8, plan, g, C):
    """The operands of a "prod": those of its one group, or its groups' side by side (kept
    while every part is the cached object it was built from)."""
    f32 = g["f32"]
    if len(g["ops"]) == 1:
        return _operands(dram, dram_i8, plan, g["ops"][0], C, "group", f32)
    parts = [_operands(dram, dram_i8, plan, h, C, "group", f32) for h in g["ops"]]
    key = id(g)
    hit = plan.mcache.get(key)
    if hit is not None and len(hit[0]) == len(parts) and all(a is b for a, b in zip(hit[0], parts)):
        return hit[1]
    W = np.concatenate([p[0] for p in parts], 1)
    lanes = tuple(np.concatenate([p[1][i] for p in parts]) for i in range(3))
    plan.mcache[key] = (parts, (W, lanes))
    return W, lanes


_NO_WORDS = np.zeros((0, 1), np.uint64)


def _scatter(out, rows, buf, r0, P, C):
    """A hoisted band's output rows from its product's buffer."""
    if _kernels.AVAILABLE:
        _kernels.plan_scatter(out, rows, buf, r0)
    else:
        out[rows] = buf.reshape(P, -1, C)[r0:r0 + len(rows)]


def run_plan(fm, plan):
    """Execute ``plan`` on ``fm``'s DRAM, output scratchpad and accumulators."""
    _invalidate(fm, plan)
    cfg = fm.cfg
    R, C = cfg.rows, cfg.cols
    dram = fm.dram
    n8 = len(dram) // R * R
    dram_rows = dram[:n8].view(np.dtype((np.void, R)))
    dram_i8 = dram.view(np.int8)
    dram2 = dram_i8[:n8].reshape(-1, R)
    words = dram[:n8].view(np.uint64).reshape(-1, R // 8) if R % 8 == 0 else _NO_WORDS
    out = fm.out.reshape(-1, C)
    out_u8 = fm.out.view(np.uint8)
    bufs = {}
    for kind, g in plan.ops:
        if kind == "prod":
            if "segs" in g:             # hoisted bands: into a buffer, the first band's rows now
                tgt = np.empty((g["buf_rows"].size, C), np.int8)
                tgt_rows = g["buf_rows"]
            else:
                tgt, tgt_rows = out, g["out_rows"]
            W, (bias, m, nn) = _prod_operands(dram, dram_i8, plan, g, C)
            zy, lo, hi = np.int64(g["zy"]), np.int64(g["lo"]), np.int64(g["hi"])
            if _kernels.AVAILABLE and g["f32"]:
                _kernels.plan_prod_f32(dram2, words, g["idx"], g["pad"] is not None, g["padv"],
                                       W, bias, m, nn, zy, lo, hi, tgt, tgt_rows)
            elif _kernels.AVAILABLE and W.dtype == np.uint8:
                A = _kernels.plan_gather_u8(dram2, words, g["idx"], g["pad"] is not None, g["padv"])
                acc = _matmul().sess.run(None, {"a": A, "b": W})[0]
                _kernels.plan_finish(acc, bias, m, nn, zy, lo, hi, tgt, tgt_rows)
            else:
                A = dram_rows[g["idx"]]
                if g["pad"] is not None:
                    A[g["pad"]] = g["fill"]
                A = A.view(np.int8).reshape(g["P"], g["K"])
                y = _finish(_product(A, W), bias, m, nn, g["zy"], g["lo"], g["hi"])
                tgt[tgt_rows] = y.reshape(g["P"], -1, C)
            if "segs" in g:
                bufs[id(g)] = tgt
                r0, r1, rows = g["segs"][0]
                _scatter(out, rows, tgt, r0, g["P"], C)
        elif kind == "scatter":
            bands, k = g
            p = bands["prod"]
            r0, r1, rows = p["segs"][k]
            _scatter(out, rows, bufs[id(p)], r0, p["P"], C)
        elif kind == "chunk":
            c = g["c"]
            A = _activations(dram_rows, g)
            P = g["P"]
            W, (bias, m, nn) = _operands(dram, dram_i8, plan, g, C, kind)
            psum = _product(A, W).astype(np.int64)
            if c.acc_init:
                acc = bias[None, :] + psum
            else:
                acc = fm.acc[c.acc_base:c.acc_base + P] + psum
            acc = _wrap32(acc)
            if c.finalize:
                out[c.out_base + np.arange(P) * c.out_stride] = requantize(acc, m, nn, c.zy, c.lo, c.hi)
            else:
                fm.acc[c.acc_base:c.acc_base + P] = acc
        else:
            rows, n = g
            for a, off in rows:
                dram[a:a + n] = out_u8[off:off + n]
    fm.mark_pages(plan.store_pages)

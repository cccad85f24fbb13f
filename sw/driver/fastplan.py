"""The fast model's compiled form of a program: what the instruction stream computes, as
a few large numpy operations per launch.

Addresses in this instruction set never depend on data. So once per program (cached by
its bytes) :func:`trace` plays the steps in the token machine's take order *on addresses
only*: it tracks, for every row of the activation, weight and aux scratchpads, the DRAM
row its bytes were loaded from and when. Each COMPUTE then reads DRAM directly: its
implicit im2col is the geometry's index array plus one offset (when the rows it reads
came from one contiguous load, the compiler's layout), its weight block and aux lane
are DRAM addresses. COMPUTEs that share their activations and start and finish their
accumulators are one matrix product (the M tiles of a band); chunked ones accumulate
into the model's accumulator array; STOREs copy the output scratchpad to DRAM as before.

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

__all__ = ["Plan", "trace", "run_plan", "exact_matmul", "EXACT_K"]

#: K chunk of the float32 products (see the module docstring)
EXACT_K = 1024


def exact_matmul(a, w):
    """int64 ``a @ w`` for int8-valued float32 ``a`` [P, K] and ``w`` [K, N]."""
    K = a.shape[1]
    if K <= EXACT_K:
        return (a @ w).astype(np.int64)
    acc = np.zeros((a.shape[0], w.shape[1]), np.float64)
    for k0 in range(0, K, EXACT_K):
        acc += a[:, k0:k0 + EXACT_K] @ w[k0:k0 + EXACT_K]
    return acc.astype(np.int64)




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
    R, C, bus = cfg.rows, cfg.cols, cfg.bus_bytes
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
    plan.log_pos = 0
    return plan


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


def _group_activations(dram_rows, g):
    parts = g["parts"]
    if len(parts) == 1:
        idx, pad, a_off, zx_row, k = parts[0]
        return _gather(dram_rows, idx, pad, a_off, zx_row).reshape(g["P"], k)
    return np.concatenate([_gather(dram_rows, idx, pad, a_off, zx_row).reshape(g["P"], k)
                           for idx, pad, a_off, zx_row, k in parts], axis=1)


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
    """Drop cached operands whose DRAM bytes were written since this plan last ran (host
    writes and every launch's stores go to ``fm``'s write log)."""
    lo, hi = fm.writes_since(plan.log_pos)
    plan.log_pos = fm.write_log_len()
    if not plan.cache or not len(lo):
        return
    gd = plan.guards
    ids = np.fromiter(plan.cache.keys(), np.int64)
    g = gd[ids]
    hit = ((lo[None, :] < g[:, 1:2]) & (g[:, 0:1] < hi[None, :])).any(1)
    for k in ids[hit]:
        del plan.cache[int(k)]


def _operands(dram, dram_i8, plan, g, C, kind):
    """(W float32 [K, n*C], aux lanes) of a group or chunk, cached when allowed."""
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
        lanes = (lb["bias"].astype(np.int64)[None, :], lm["m"].astype(np.int64),
                 lm["n"].astype(np.int64))
    else:
        W = dram_i8[g["w"]:g["w"] + K * C].reshape(K, C)
        lane = _lanes(dram, np.asarray([g["x"]]), C)
        lanes = (lane["bias"].astype(np.int64)[None, :], lane["m"].astype(np.int64),
                 lane["n"].astype(np.int64))
    W = W.astype(np.float32)
    if plan.cacheable[g["gid"]]:
        plan.cache[g["gid"]] = (W, lanes)
    return W, lanes


def run_plan(fm, plan):
    """Execute ``plan`` on ``fm``'s DRAM, output scratchpad and accumulators."""
    _invalidate(fm, plan)
    cfg = fm.cfg
    R, C = cfg.rows, cfg.cols
    dram = fm.dram
    n8 = len(dram) // R * R
    dram_rows = dram[:n8].view(np.dtype((np.void, R)))
    dram_i8 = dram.view(np.int8)
    out = fm.out.reshape(-1, C)
    out_u8 = fm.out.view(np.uint8)
    for kind, g in plan.ops:
        if kind == "group":
            A = _group_activations(dram_rows, g)
            W, (bias, m, nn) = _operands(dram, dram_i8, plan, g, C, kind)
            acc = _wrap32(exact_matmul(A.astype(np.float32), W) + bias)
            y = requantize(acc, m, nn, g["zy"], g["lo"], g["hi"])
            out[g["out_rows"]] = y.reshape(g["P"], len(g["w_segs"]), C)
        elif kind == "chunk":
            c = g["c"]
            A = _activations(dram_rows, g)
            P = g["P"]
            W, (bias, m, nn) = _operands(dram, dram_i8, plan, g, C, kind)
            psum = exact_matmul(A.astype(np.float32), W)
            if c.acc_init:
                acc = bias + psum
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
    fm.log_writes(plan.stores)

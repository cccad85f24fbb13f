"""cocotb testbench: GEMM through the bare systolic array, checked against numpy exactly.

Parameters (``DNNFAB_PARAMS``): ``rows, cols, input_bits, weight_bits, acc_bits,
tag_bits`` of the generated array, and ``cases``: a list of GEMMs
``{"n": N, "k": K, "m": M, "seed": s, "stall": p, "fill": "random"|"min"|"max"|"zero"}``.
Each GEMM is cut into weight tiles (K split by rows, M by columns) that are streamed back
to back; the testbench adds the int32 partial sums of the K tiles (the accelerator does
that in its accumulator scratchpad). With ``stall == 0`` the measured cycles must equal
:func:`dnnfab.hw.systolic.stream_cycles`. ``report`` names a JSON file for the figures.
"""

import json
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly
import numpy as np

from dnnfab.cosim import params, pack, unpack
from dnnfab.hw.systolic import stream_cycles


def make_case(case, ib, wb):
    rng = np.random.default_rng(case["seed"])
    n, k, m = case["n"], case["k"], case["m"]
    lo_a, hi_a = -(1 << (ib - 1)), (1 << (ib - 1)) - 1
    lo_w, hi_w = -(1 << (wb - 1)), (1 << (wb - 1)) - 1
    fill = case.get("fill", "random")
    if fill == "zero":
        a = np.zeros((n, k), np.int64)
        w = np.zeros((k, m), np.int64)
    elif fill == "min":
        a = np.full((n, k), lo_a, np.int64)
        w = np.full((k, m), lo_w, np.int64)
    elif fill == "max":
        a = np.full((n, k), hi_a, np.int64)
        w = np.full((k, m), lo_w, np.int64)
    else:
        a = rng.integers(lo_a, hi_a + 1, size=(n, k))
        w = rng.integers(lo_w, hi_w + 1, size=(k, m))
        # sprinkle extremes
        a.flat[rng.choice(a.size, size=max(1, a.size // 8))] = lo_a
        a.flat[rng.choice(a.size, size=max(1, a.size // 8))] = hi_a
        w.flat[rng.choice(w.size, size=max(1, w.size // 8))] = lo_w
        w.flat[rng.choice(w.size, size=max(1, w.size // 8))] = hi_w
    return a, w


def tiles_of(a, w, rows, cols):
    n, k = a.shape
    m = w.shape[1]
    kt, mt = -(-k // rows), -(-m // cols)
    ap = np.zeros((n, kt * rows), np.int64)
    ap[:, :k] = a
    wp = np.zeros((kt * rows, mt * cols), np.int64)
    wp[:k, :m] = w
    tiles = []
    for j in range(mt):
        for i in range(kt):
            tiles.append((j, ap[:, i * rows:(i + 1) * rows], wp[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]))
    return tiles


@cocotb.test()
async def gemm_cases(dut):
    p = params()
    R, C = p["rows"], p["cols"]
    ib, wb, accb, tb = p["input_bits"], p["weight_bits"], p["acc_bits"], p["tag_bits"]
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.act__valid.value = 0
    dut.wgt__valid.value = 0
    dut.out__ready.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)

    report = []
    for case in p["cases"]:
        a, w = make_case(case, ib, wb)
        tiles = tiles_of(a, w, R, C)
        rng = np.random.default_rng(case["seed"] + 1)
        stall = case.get("stall", 0.0)
        wrows = [pack(wt[r], wb) for _, _, wt in tiles for r in range(R)]
        arows = []
        for t, (_, at, _) in enumerate(tiles):
            for px in range(at.shape[0]):
                tag = (t * 131 + px) & ((1 << tb) - 1)
                word = pack(at[px], ib) | ((px == 0) << (R * ib)) | (tag << (R * ib + 1))
                arows.append((word, tag))
        expect_tags = [tag for _, tag in arows]
        outs = []
        wi = ai = 0
        cycle = 0
        first_w = last_o = None
        t0 = time.monotonic()
        limit = 50 * (len(arows) + len(wrows)) + 1000
        while len(outs) < len(arows):
            wv = wi < len(wrows)
            av = ai < len(arows)
            dut.wgt__valid.value = int(wv)
            if wv:
                dut.wgt__payload.value = wrows[wi]
            dut.act__valid.value = int(av)
            if av:
                dut.act__payload.value = arows[ai][0]
            ready = int(stall == 0 or rng.random() >= stall)
            dut.out__ready.value = ready
            await ReadOnly()
            if wv and dut.wgt__ready.value:
                if first_w is None:
                    first_w = cycle
                wi += 1
            if av and dut.act__ready.value:
                ai += 1
            if ready and dut.out__valid.value:
                outs.append(int(dut.out__payload.value))
                last_o = cycle
            await RisingEdge(dut.clk)
            cycle += 1
            assert cycle < limit, f"array hung: {len(outs)} of {len(arows)} outputs after {cycle} cycles"
        wall = time.monotonic() - t0
        dut.wgt__valid.value = 0
        dut.act__valid.value = 0

        # reassemble and compare bit for bit
        n, m = a.shape[0], w.shape[1]
        mt = -(-m // C)
        acc = np.zeros((n, mt * C), np.int64)
        tags = []
        for idx, (j, at, _) in enumerate(tiles):
            for px in range(n):
                word = outs[idx * n + px]
                acc[px, j * C:(j + 1) * C] += unpack(word, accb, C)
                tags.append(word >> (C * accb))
        assert tags == expect_tags, "tags did not travel with their rows"
        ref = a @ w
        got = acc[:, :m]
        if not np.array_equal(got, ref):
            bad = np.argwhere(got != ref)[:5]
            raise AssertionError(f"mismatch in case {case}: first bad (row, col) {bad.tolist()}; "
                                 f"got {[got[tuple(i)] for i in bad]} expected {[ref[tuple(i)] for i in bad]}")
        measured = last_o - first_w + 1
        model = stream_cycles(R, C, [n] * len(tiles))
        if stall == 0:
            assert measured == model, f"cycles {measured} != model {model} for case {case}"
        report.append({"case": case, "tiles": len(tiles), "cycles": measured, "model_cycles": model,
                       "sim_cycles": cycle, "wall_s": wall})
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(report, f, indent=1)

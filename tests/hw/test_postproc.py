"""Requantizer (Amaranth simulation) against the contract's Python reference."""

import numpy as np
from amaranth.sim import Simulator

from dnnfab.hw.postproc import Requantizer, requantize_ref
from dnnfab.hw.spec import RQ_LATENCY as LATENCY


def test_requantizer_matches_reference():
    lanes = 4
    dut = Requantizer(lanes, side_bits=5)
    rng = np.random.default_rng(0)
    vectors = []
    for i in range(300):
        acc = rng.integers(-(1 << 31), 1 << 31, size=lanes)
        if i % 7 == 0:
            acc[:] = [-(1 << 31), (1 << 31) - 1, 0, -1]
        mm = rng.integers(1 << 14, 1 << 15, size=lanes)
        n = rng.integers(1, 64, size=lanes)
        if i % 3 == 0:
            n = rng.integers(10, 40, size=lanes)
        zy = int(rng.integers(-128, 128))
        lo = int(rng.choice([-128, zy, int(rng.integers(-128, 0))]))
        hi = int(rng.choice([127, int(rng.integers(max(lo, 0), 128))]))
        vectors.append((acc, mm, n, zy, lo, hi, i % 32))
    # results just past a power of two (2^10 .. 2^23, either sign), for every n % 8: the
    # requantizer saturates to 11 bits before the clamp, checking the high bits in two
    # parts around its shifter; a value misjudged as in range would wrap to a small one
    for i in range(300):
        mm = rng.integers(1 << 14, 1 << 16, size=lanes)
        n = rng.integers(1, 40, size=lanes)
        k = rng.integers(10, 24, size=lanes).astype(object)
        t = (rng.choice([-1, 1], size=lanes) * ((1 << k) + rng.integers(-2, 3, size=lanes))).astype(object)
        acc = np.clip((t << n.astype(object)) // mm.astype(object), -(1 << 31), (1 << 31) - 1).astype(np.int64)
        vectors.append((acc, mm, n, int(rng.integers(-128, 128)), -128, 127, i % 32))
    got = []

    async def bench(ctx):
        for vec in vectors + [None] * (LATENCY + 1):
            if vec is None:
                ctx.set(dut.i_valid, 0)
            else:
                acc, mm, n, zy, lo, hi, side = vec
                ctx.set(dut.i_valid, 1)
                ctx.set(dut.i_acc, [int(x) for x in acc])
                ctx.set(dut.i_m, [int(x) for x in mm])
                ctx.set(dut.i_n, [int(x) for x in n])
                ctx.set(dut.i_zy, zy)
                ctx.set(dut.i_lo, lo)
                ctx.set(dut.i_hi, hi)
                ctx.set(dut.i_side, side)
            await ctx.tick()
            if ctx.get(dut.o_valid):
                got.append(([int(x) for x in ctx.get(dut.o_y)], ctx.get(dut.o_side)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(got) == len(vectors)
    for (acc, mm, n, zy, lo, hi, side), (y, s) in zip(vectors, got):
        assert s == side
        assert y == [requantize_ref(int(a), int(b), int(c), zy, lo, hi) for a, b, c in zip(acc, mm, n)]

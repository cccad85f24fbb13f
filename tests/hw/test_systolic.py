"""Amaranth-simulator tests of the PE and the systolic array against numpy."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.pe import ProcessingElement
from dnnfab.hw.systolic import SystolicArray, stream_cycles
from dnnfab.hw.spec import array_latency as latency


def test_pe_mac_and_weight_swap():
    dut = ProcessingElement(8, 8, 32)

    async def bench(ctx):
        ctx.set(dut.en, 1)
        ctx.set(dut.w_in, -128)
        ctx.set(dut.w_we, 1)
        await ctx.tick()
        ctx.set(dut.w_we, 0)
        # first activation switches to the shadow weight
        ctx.set(dut.a_in, 127)
        ctx.set(dut.f_in, 1)
        ctx.set(dut.psum_in, 1000)
        await ctx.tick()
        ctx.set(dut.f_in, 0)
        ctx.set(dut.w_in, 5)
        ctx.set(dut.w_we, 1)             # a new shadow weight must not disturb the active one
        await ctx.tick()
        ctx.set(dut.w_we, 0)
        await ctx.tick()
        # (a_reg, product, product in the fabric, sum: the sum is out 4 edges after a_in)
        assert ctx.get(dut.psum_out) != 1000 + 127 * -128
        await ctx.tick()
        assert ctx.get(dut.psum_out) == 1000 + 127 * -128
        # stalled: nothing moves
        ctx.set(dut.en, 0)
        ctx.set(dut.psum_in, 0)
        await ctx.tick().repeat(3)
        assert ctx.get(dut.psum_out) == 1000 + 127 * -128

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def run_array(rows, cols, tiles, out_ready_pattern=None, seed=0, tag_bits=4):
    """Stream ``tiles`` = [(A[npx,R], W[R,C]), ...] through the array.

    Returns (outputs per tile, cycle count from first weight transfer to last output).
    """
    cfg = AcceleratorConfig(rows=rows, cols=cols)
    dut = SystolicArray(cfg, tag_bits=tag_bits)
    rng = np.random.default_rng(seed)
    results = []
    cycles = {}

    async def feed_weights(ctx):
        first = True
        for _, w in tiles:
            for r in range(rows):
                ctx.set(dut.wgt.valid, 1)
                ctx.set(dut.wgt.payload, [int(v) for v in w[r]])
                await ctx.tick().until(dut.wgt.ready)
                if first:
                    cycles["start"] = ctx.get(cnt)
                    first = False
        ctx.set(dut.wgt.valid, 0)

    async def feed_acts(ctx):
        for t, (a, _) in enumerate(tiles):
            for p in range(a.shape[0]):
                ctx.set(dut.act.valid, 1)
                ctx.set(dut.act.payload, {"data": [int(v) for v in a[p]], "first": int(p == 0),
                                          "tag": (t * 7 + p) % (1 << tag_bits)})
                await ctx.tick().until(dut.act.ready)
        ctx.set(dut.act.valid, 0)

    async def drain(ctx):
        total = sum(a.shape[0] for a, _ in tiles)
        got = 0
        i = 0
        while got < total:
            ready = 1 if out_ready_pattern is None else out_ready_pattern(i, rng)
            ctx.set(dut.out.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.out.valid, dut.out.payload)
            i += 1
            if valid and ready:
                results.append(([int(x) for x in payload.data], int(payload.tag)))
                got += 1
                cycles["end"] = ctx.get(cnt)

    from amaranth.hdl import Module, Signal
    cnt = Signal(32)
    m = Module()
    m.submodules.dut = dut
    m.d.sync += cnt.eq(cnt + 1)
    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(feed_weights)
    sim.add_testbench(feed_acts)
    sim.add_testbench(drain)
    sim.run()
    outs, idx = [], 0
    for t, (a, _) in enumerate(tiles):
        block = results[idx: idx + a.shape[0]]
        idx += a.shape[0]
        assert [tag for _, tag in block] == [(t * 7 + p) % (1 << tag_bits) for p in range(a.shape[0])]
        outs.append(np.array([v for v, _ in block], dtype=np.int64))
    return outs, cycles["end"] - cycles["start"] + 1


def random_tiles(rng, rows, cols, npx_list):
    tiles = []
    for npx in npx_list:
        a = rng.integers(-128, 128, size=(npx, rows))
        w = rng.integers(-128, 128, size=(rows, cols))
        tiles.append((a, w))
    # extremes in the first tile: the largest (-128 * -128 down a whole column) and the
    # smallest (127 * -128) partial sums, which set the array's partial-sum widths
    tiles[0][0][0, :] = -128
    tiles[0][1][:, 0] = -128
    if tiles[0][0].shape[0] > 1 and cols > 1:
        tiles[0][0][1, :] = 127
        tiles[0][1][:, 1] = -128
    return tiles


@pytest.mark.parametrize("rows,cols", [(2, 2), (4, 4), (8, 2), (4, 8)])
def test_array_matches_numpy_and_cycle_model(rows, cols):
    rng = np.random.default_rng(rows * 31 + cols)
    npx_list = [40, 3, 17, 1, 25]
    tiles = random_tiles(rng, rows, cols, npx_list)
    outs, cycles = run_array(rows, cols, tiles)
    for (a, w), o in zip(tiles, outs):
        assert np.array_equal(o, a @ w)
    assert cycles == stream_cycles(rows, cols, npx_list)


def test_array_backpressure():
    rows, cols = 4, 4
    rng = np.random.default_rng(5)
    tiles = random_tiles(rng, rows, cols, [30, 9, 30])
    outs, cycles = run_array(rows, cols, tiles,
                             out_ready_pattern=lambda i, r: int(r.integers(0, 3) != 0))
    for (a, w), o in zip(tiles, outs):
        assert np.array_equal(o, a @ w)
    assert cycles > stream_cycles(rows, cols, [30, 9, 30])

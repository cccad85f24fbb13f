"""Amaranth-simulator tests of the DMA's burst generation (the data path is co-simulated
in tests/cosim/test_dma_cosim.py) and of the Python :class:`Descriptor` model."""

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from dnnfab.errors import ConfigError
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.dma import DMA, Descriptor, desc_layout


def test_descriptor_pack_matches_layout():
    cfg = AcceleratorConfig(addr_bits=40)
    d = Descriptor(0xAB_CDEF_0010, 7, 3, 0x1230, 2, 0x45670, 0x1234, 3)
    word = d.pack(cfg)
    view = data.Const(desc_layout(cfg), word)
    for name in ("addr", "len0", "n1", "stride1", "n2", "stride2", "sp_addr", "target"):
        assert view[name] == getattr(d, name), name
    assert Descriptor.unpack(word, cfg) == d
    assert d.beats == 42
    assert word < (1 << desc_layout(cfg).size)


def test_descriptor_model_bursts():
    cfg = AcceleratorConfig(bus_bits=128, max_burst=16)
    # a 40-beat row starting 3 beats before a 4 KiB boundary
    d = Descriptor(0x1000 - 48, 40)
    assert d.bursts(cfg) == [(0x1000 - 48, 3), (0x1000, 16), (0x1100, 16), (0x1200, 5)]
    assert sum(n for _, n in d.bursts(cfg)) == d.beats
    assert d.extent(16) == (0x1000 - 48, 0x1000 - 48 + 640)
    with pytest.raises(ConfigError, match="multiple of the bus width"):
        Descriptor(8, 1).check(cfg)
    with pytest.raises(ConfigError, match="len0=0"):
        Descriptor(0, 0).check(cfg)


def _run_bursts(cfg, descs, kind, window=None, ready_every=1):
    """Feed ``descs`` to one engine with an always-responding bus; return the A-channel bursts
    and the cycles at which they were accepted."""
    dut = DMA(cfg)
    got, cycles, errors = [], [], []

    async def bench(ctx):
        bus = dut.bus
        ctx.set(bus.arready, 1)
        ctx.set(bus.awready, 1)
        ctx.set(bus.wready, 1)
        ctx.set(dut.window_lo, window[0] if window else 0)
        ctx.set(dut.window_hi, window[1] if window else (1 << cfg.addr_bits) - 1)
        cmd = dut.rd_cmd if kind == "rd" else dut.wr_cmd
        queue = list(descs)
        for cycle in range(20000):
            # R and B: answer every beat with "last", so in-flight bursts retire at once
            ctx.set(bus.rvalid, 1)
            ctx.set(bus.rlast, 1)
            ctx.set(bus.bvalid, 1)
            if queue:
                ctx.set(cmd.valid, 1)
                ctx.set(cmd.payload.as_value(), queue[0].pack(cfg))
            else:
                ctx.set(cmd.valid, 0)
            ready = (cycle % ready_every) == 0
            ctx.set(bus.arready, ready)
            ctx.set(bus.awready, ready)
            taken = queue and ctx.get(cmd.ready)
            if kind == "rd" and ctx.get(bus.arvalid) and ready:
                got.append((ctx.get(bus.araddr), ctx.get(bus.arlen) + 1))
                cycles.append(cycle)
            if kind == "wr" and ctx.get(bus.awvalid) and ready:
                got.append((ctx.get(bus.awaddr), ctx.get(bus.awlen) + 1))
                cycles.append(cycle)
            if ctx.get(dut.error):
                errors.append((ctx.get(dut.error_code), ctx.get(dut.error_addr)))
            await ctx.tick()
            if taken:
                queue.pop(0)
            if not queue and not ctx.get(dut.busy) and cycle > 4:
                if ctx.get(dut.error) and not errors:   # an error raised on the last edge
                    errors.append((ctx.get(dut.error_code), ctx.get(dut.error_addr)))
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got, cycles, errors


@pytest.mark.parametrize("bus_bits,max_burst", [(64, 16), (128, 64), (256, 256)])
@pytest.mark.parametrize("kind", ["rd", "wr"])
def test_bursts_match_model(bus_bits, max_burst, kind):
    cfg = AcceleratorConfig(bus_bits=bus_bits, max_burst=max_burst)
    bb = cfg.bus_bytes
    rng = random.Random(bus_bits + max_burst)
    descs = []
    for _ in range(12):
        len0 = rng.choice((1, 2, max_burst - 1 or 1, max_burst, max_burst + 1, rng.randint(1, 3 * max_burst)))
        n1, n2 = rng.randint(1, 4), rng.randint(1, 3)
        s1 = bb * rng.randint(len0, len0 + 50)
        s2 = s1 * n1 + bb * rng.randint(0, 300)
        addr = bb * rng.randint(0, 5000)
        descs.append(Descriptor(addr, len0, n1, s1, n2, s2))
    got, cycles, errors = _run_bursts(cfg, descs, kind)
    assert not errors
    want = [b for d in descs for b in d.bursts(cfg)]
    assert got == want
    if kind == "wr":
        return          # AWs are paced by the W data (max_wr_bursts ahead), not checked here
    # within one descriptor, an AR is issued every cycle
    i = 0
    for d in descs:
        n = len(d.bursts(cfg))
        span = cycles[i + n - 1] - cycles[i]
        assert span == n - 1, f"{n} bursts of {d} took {span + 1} cycles"
        i += n


def test_bursts_under_arready_stalls():
    cfg = AcceleratorConfig(bus_bits=64, max_burst=8)
    descs = [Descriptor(0x1000 - 24, 30, 3, 0x2000, 2, 0x10000)]
    got, _, _ = _run_bursts(cfg, descs, "rd", ready_every=3)
    assert got == descs[0].bursts(cfg)


def test_window_rejects_without_aw():
    cfg = AcceleratorConfig(bus_bits=128, max_burst=16)
    lo, hi = 0x10000, 0x12000
    ok = Descriptor(lo, 256, 2, 0x1000)                     # exactly [lo, hi)
    got, _, errors = _run_bursts(cfg, [ok], "wr", window=(lo, hi))
    assert not errors and got == ok.bursts(cfg)
    for bad in (Descriptor(lo - 16, 1), Descriptor(hi - 16, 2), Descriptor(lo, 1, 2, 0x2000),
                Descriptor(0xFFFF_FF00, 32)):             # wraps around the address space
        got, _, errors = _run_bursts(cfg, [bad], "wr", window=(lo, hi))
        assert got == [], bad
        assert errors and errors[0] == (5, bad.addr), (bad, errors[:1])


def test_window_check_long_multiplier():
    """The window check multiplies (n - 1) * stride by shift-and-add over the multiplier's
    bits: a command whose extent ends exactly at window_hi passes, one beat more fails."""
    cfg = AcceleratorConfig(bus_bits=128, max_burst=16)
    d = Descriptor(0x10000, 1, 700, 0x30, 3, 0x9000)
    lo, end = d.extent(cfg.bus_bytes)
    got, _, errors = _run_bursts(cfg, [d], "wr", window=(lo, end))
    assert not errors and got == d.bursts(cfg)
    got, _, errors = _run_bursts(cfg, [d], "wr", window=(lo, end - 16))
    assert got == [] and errors and errors[0] == (5, d.addr)

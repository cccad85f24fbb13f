"""cocotb testbench: the DMA (in :class:`dnnfab.cosim.dma_harness.DMAHarness`) against an AXI RAM.

Parameters (``DNNFAB_PARAMS``): ``bus_bits, addr_bits, max_burst, sp_depth`` of the
harness, ``seed``, ``groups`` (random round-trip groups), ``stream_beats`` (length of the
contiguous read/write whose cycles are measured), ``slack`` / ``write_slack`` (allowed
cycles over the beat count), ``report`` (JSON file for the measured figures).

Tests:

* ``roundtrip``: random 1-D/2-D/3-D read descriptors (odd lengths, rows crossing 4 KiB,
  ``len0 > max_burst``) gather DRAM into the scratchpad; differently shaped write
  descriptors scatter it back to another region, while the next group's reads run
  concurrently. The whole output region is compared byte for byte with a Python model.
* ``throughput``: a long contiguous read must take at most ``beats + slack`` cycles from
  command acceptance to ``rd_done`` (and the same for a write, to ``wr_done``);
  short-row 2-D reads are measured and reported.
* ``errors``: SLVERR on a chosen read beat -> code 1; SLVERR on a write -> code 2;
  a write outside the window -> code 5 with the DRAM untouched. Every case must drain
  (``busy`` low) within a bounded time, and a normal transfer must work after ``clear``.
"""

import itertools
import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly, ClockCycles, gather
from cocotbext.axi import AxiBus, AxiRam

from dnnfab.cosim import params
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.dma import Descriptor

MEM = 1 << 20           # DRAM model size
SRC, DST = 0x00000, 0x80000   # source and destination regions (512 KiB each)


class Bench:
    def __init__(self, dut):
        self.dut = dut
        p = params()
        self.p = p
        self.cfg = AcceleratorConfig(bus_bits=p["bus_bits"], addr_bits=p["addr_bits"],
                                     max_burst=p["max_burst"])
        self.bb = self.cfg.bus_bytes
        self.sp_depth = p["sp_depth"]
        self.rng = random.Random(p.get("seed", 1))

    async def start(self):
        dut = self.dut
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        dut.rst.value = 1
        dut.rd_cmd__valid.value = 0
        dut.wr_cmd__valid.value = 0
        dut.clear.value = 0
        dut.window_lo.value = DST
        dut.window_hi.value = MEM
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi_"), dut.clk, dut.rst, size=MEM)
        self.ram.write(0, self.rng.randbytes(MEM))
        for _ in range(4):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)

    # -- stimulus --------------------------------------------------------------------
    async def push(self, kind, desc):
        """Present ``desc`` on ``rd_cmd``/``wr_cmd`` until accepted."""
        valid = getattr(self.dut, f"{kind}_cmd__valid")
        ready = getattr(self.dut, f"{kind}_cmd__ready")
        getattr(self.dut, f"{kind}_cmd__payload").value = desc.pack(self.cfg)
        valid.value = 1
        for _ in range(100000):
            await ReadOnly()
            taken = int(ready.value)
            await RisingEdge(self.dut.clk)
            if taken:
                valid.value = 0
                return
        raise AssertionError(f"{kind} command not accepted in 100000 cycles")

    async def wait_count(self, name, target, limit):
        sig = getattr(self.dut, name)
        for _ in range(limit // 8 + 1):
            if int(sig.value) >= target:
                return
            await ClockCycles(self.dut.clk, 8)
        raise AssertionError(f"{name} reached {int(sig.value)}, expected {target}, "
                             f"within {limit} cycles (DMA hung?)")

    async def wait_idle(self, limit=20000):
        for _ in range(limit // 4 + 1):
            await ReadOnly()
            if not int(self.dut.busy.value):
                await RisingEdge(self.dut.clk)
                return
            await ClockCycles(self.dut.clk, 4)
        raise AssertionError(f"DMA still busy after {limit} cycles")

    # -- Python model --------------------------------------------------------------------
    def gather(self, mem, d):
        words = []
        for addr, n in d.rows(self.bb):
            for k in range(0, n, self.bb):
                a = (addr + k) % MEM
                words.append(bytes(mem[a:a + self.bb]))
        return words

    def scatter(self, mem, d, words):
        it = iter(words)
        for addr, n in d.rows(self.bb):
            for k in range(0, n, self.bb):
                a = addr + k
                mem[a:a + self.bb] = next(it)

    # -- random descriptors ----------------------------------------------------------------
    def rand_shape(self, max_beats):
        """(len0, n1, n2) with some rows longer than max_burst and odd lengths."""
        r = self.rng
        mb = self.cfg.max_burst
        dims = r.choice((1, 2, 3))
        if dims == 1:
            len0 = r.choice((1, 2, 3, mb - 1, mb, mb + 1, 2 * mb + 3, r.randint(1, 4 * mb)))
            n1 = n2 = 1
        elif dims == 2:
            len0 = r.choice((1, 3, r.randint(1, mb), mb + 5, r.randint(1, 2 * mb)))
            n1 = r.randint(2, 9)
            n2 = 1
        else:
            len0 = r.choice((1, 2, 5, r.randint(1, mb + 3)))
            n1 = r.randint(1, 4)
            n2 = r.randint(2, 4)
        while len0 * n1 * n2 > max_beats:
            if n2 > 1:
                n2 -= 1
            elif n1 > 1:
                n1 -= 1
            else:
                len0 = max(1, len0 // 2)
        return len0, n1, n2

    def place(self, base, span, len0, n1, n2, overlap_ok):
        """A descriptor of that shape inside [base, base + span), often crossing 4 KiB."""
        r, bb = self.rng, self.bb
        row = len0 * bb
        s1 = row + bb * r.choice((0, 0, 1, 3, r.randint(0, 40)))
        if overlap_ok and n1 > 1 and r.random() < 0.2:
            s1 = bb * r.randint(1, max(1, len0))        # rows overlap (reads only)
        plane = (n1 - 1) * s1 + row
        s2 = plane + bb * r.choice((0, 2, r.randint(0, 100)))
        total = (n2 - 1) * s2 + plane
        if total > span:            # too sparse for the region: pack densely
            s1, s2 = row, n1 * row
            plane = (n1 - 1) * s1 + row
            total = (n2 - 1) * s2 + plane
        assert total <= span, (total, span)
        if r.random() < 0.5:
            # start a few beats before a 4 KiB boundary so rows straddle it
            k = r.randint(1, max(1, (span - total) // 4096))
            addr = base + k * 4096 - bb * r.randint(1, 7)
            if addr < base or addr + total > base + span:
                addr = base
        else:
            addr = base + bb * r.randint(0, (span - total) // bb)
        return addr, s1, s2

    def rand_read(self, sp_addr, target, max_beats):
        len0, n1, n2 = self.rand_shape(max_beats)
        addr, s1, s2 = self.place(SRC, DST - SRC, len0, n1, n2, overlap_ok=True)
        return Descriptor(addr, len0, n1, s1, n2, s2, sp_addr, target).check(self.cfg)

    def rand_write_like(self, beats, sp_addr, target, lo, span):
        """A write of exactly ``beats`` beats (another factorisation), inside [lo, lo+span)."""
        r = self.rng
        facs = [(beats, 1, 1)]
        for a in range(1, beats + 1):
            if beats % a == 0:
                rest = beats // a
                for b in range(1, rest + 1):
                    if rest % b == 0:
                        facs.append((a, b, rest // b))
        len0, n1, n2 = r.choice(facs)
        addr, s1, s2 = self.place(lo, span, len0, n1, n2, overlap_ok=False)
        return Descriptor(addr, len0, n1, s1, n2, s2, sp_addr, target).check(self.cfg)


async def reset_counts(b):
    return {k: int(getattr(b.dut, k).value) for k in ("rd_dones", "wr_dones", "rd_beats", "wr_beats")}


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def roundtrip(dut):
    await _roundtrip(dut, stalls=False)


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def roundtrip_stalls(dut):
    """The same with random pauses on all five AXI channels (W backpressure, R gaps)."""
    await _roundtrip(dut, stalls=True)


def _pauses(rng, p):
    pattern = [rng.random() < p for _ in range(211)]
    return itertools.cycle(pattern)


async def _roundtrip(dut, stalls):
    b = Bench(dut)
    await b.start()
    if stalls:
        for ch, p in ((b.ram.write_if.aw_channel, 0.3), (b.ram.write_if.w_channel, 0.4),
                      (b.ram.write_if.b_channel, 0.3), (b.ram.read_if.ar_channel, 0.3),
                      (b.ram.read_if.r_channel, 0.3)):
            ch.set_pause_generator(_pauses(b.rng, p))
    bb, depth = b.bb, b.sp_depth
    shadow = bytearray(b.ram.read(0, MEM))
    pending_writes = []          # (descriptor, words) of the previous group
    n_rd = n_wr = 0
    beats_rd = beats_wr = 0
    groups = b.p.get("groups", 6)
    # each group: two reads into two targets; the previous group's writes run concurrently
    for g in range(groups + 1):
        reads = []
        if g < groups:
            tgts = (0, 1) if g % 2 == 0 else (2, 3)
            for t in tgts:
                sp_addr = b.rng.choice((0, 1, b.rng.randint(0, depth // 2)))
                d = b.rand_read(sp_addr, t, depth - sp_addr)
                reads.append((d, b.gather(shadow, d)))
        # the writes of the previous group go to disjoint slices of DST
        writes = []
        slice_span = (MEM - DST) // 2
        for i, (rd, words) in enumerate(pending_writes):
            lo = DST + i * slice_span
            wd = b.rand_write_like(rd.beats, rd.sp_addr, rd.target, lo, slice_span)
            writes.append((wd, words))

        # sprinkle empty commands (len0/n1/n2 = 0): they move nothing but still complete
        n_empty_rd = n_empty_wr = 0

        async def do_reads():
            nonlocal n_empty_rd
            for d, _ in reads:
                if b.rng.random() < 0.15:
                    await b.push("rd", Descriptor(SRC, 0, 1, 0, 1, 0, 0, 0))
                    n_empty_rd += 1
                await b.push("rd", d)

        async def do_writes():
            nonlocal n_empty_wr
            for d, _ in writes:
                await b.push("wr", d)
                if b.rng.random() < 0.15:
                    await b.push("wr", Descriptor(0, 3, 0, 0, 2, 0, 0, 0))   # outside any window too
                    n_empty_wr += 1

        await gather(do_reads(), do_writes())
        n_rd += len(reads) + n_empty_rd
        n_wr += len(writes) + n_empty_wr
        beats_rd += sum(d.beats for d, _ in reads)
        beats_wr += sum(d.beats for d, _ in writes)
        limit = 40 * (beats_rd + beats_wr) + 5000
        await b.wait_count("rd_dones", n_rd, limit)
        await b.wait_count("wr_dones", n_wr, limit)
        for wd, words in writes:
            b.scatter(shadow, wd, words)
        pending_writes = reads
        await b.wait_idle()
        assert not int(dut.error.value), f"unexpected DMA error {int(dut.error_code.value)}"

    got = b.ram.read(DST, MEM - DST)
    want = bytes(shadow[DST:])
    if got != want:
        bad = next(i for i in range(len(got)) if got[i] != want[i])
        raise AssertionError(f"DRAM mismatch at {DST + bad:#x}: got {got[bad:bad + 16].hex()} "
                             f"want {want[bad:bad + 16].hex()}")
    assert b.ram.read(SRC, DST - SRC) == bytes(shadow[SRC:DST]), "source region was modified"
    assert int(dut.rd_beats.value) == beats_rd, (int(dut.rd_beats.value), beats_rd)
    assert int(dut.wr_beats.value) == beats_wr, (int(dut.wr_beats.value), beats_wr)
    assert int(dut.sp_writes.value) == beats_rd
    _report(b, "roundtrip_stalls" if stalls else "roundtrip", {"reads": n_rd, "writes": n_wr, "beats_rd": beats_rd,
                             "beats_wr": beats_wr})


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def throughput(dut):
    b = Bench(dut)
    await b.start()
    bb = b.bb
    figures = {}
    n = b.p.get("stream_beats", 1024)
    slack = b.p["slack"]
    # long contiguous read, starting mid-page so it also crosses 4 KiB boundaries
    d = Descriptor(SRC + 4096 - 3 * bb, n, sp_addr=0, target=0).check(b.cfg)
    await b.push("rd", d)
    await b.wait_count("rd_dones", 1, 10 * n + 1000)
    cyc = int(dut.rd_end.value) - int(dut.rd_start.value)
    figures["read_1d"] = {"beats": n, "cycles": cyc, "beats_per_cycle": n / cyc,
                          "bursts": len(d.bursts(b.cfg))}
    assert cyc <= n + slack, f"contiguous read of {n} beats took {cyc} cycles (> {n} + {slack})"
    # write it back: contiguous write throughput
    w = Descriptor(DST + 4096 - 5 * bb, n, sp_addr=0, target=0).check(b.cfg)
    await b.wait_idle()
    await b.push("wr", w)
    await b.wait_count("wr_dones", 1, 10 * n + 1000)
    cyc = int(dut.wr_end.value) - int(dut.wr_start.value)
    figures["write_1d"] = {"beats": n, "cycles": cyc, "beats_per_cycle": n / cyc}
    assert b.ram.read(w.addr, n * bb) == b.ram.read(d.addr, n * bb)
    wslack = b.p["write_slack"]
    assert cyc <= n + wslack, f"contiguous write of {n} beats took {cyc} cycles (> {n} + {wslack})"
    # short rows (2-D): one burst per row
    for len0 in (1, 2, 4):
        rows = max(8, n // (4 * len0))
        d2 = Descriptor(SRC + 0x10000, len0, rows, 8 * len0 * bb, sp_addr=0, target=1).check(b.cfg)
        await b.wait_idle()
        before = int(dut.rd_dones.value)
        await b.push("rd", d2)
        await b.wait_count("rd_dones", before + 1, 20 * d2.beats + 1000)
        cyc = int(dut.rd_end.value) - int(dut.rd_start.value)
        figures[f"read_2d_len{len0}"] = {"beats": d2.beats, "cycles": cyc,
                                         "beats_per_cycle": d2.beats / cyc}
    _report(b, "throughput", figures)


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def ordering(dut):
    """An empty command queued behind a long one completes after it (done pulses in order)."""
    b = Bench(dut)
    await b.start()
    for kind, counter, beats_sig in (("rd", "rd_dones", "sp_writes"), ("wr", "wr_dones", "wr_beats")):
        base = SRC if kind == "rd" else DST
        d = Descriptor(base + 0x1000, 5 * b.cfg.max_burst + 3, sp_addr=0, target=0).check(b.cfg)
        empty = Descriptor(base, 0, 1, 0, 1, 0, 0, 0)
        before = int(getattr(dut, beats_sig).value)
        await b.push(kind, d)
        await b.push(kind, empty)
        await RisingEdge(getattr(dut, f"{kind}_done"))
        await ReadOnly()
        moved = int(getattr(dut, beats_sig).value) - before
        assert moved >= d.beats - 1, f"{kind}: first done after {moved} of {d.beats} beats (out of order)"
        await RisingEdge(dut.clk)
        await b.wait_idle()
        assert int(getattr(dut, counter).value) == 2


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def errors(dut):
    b = Bench(dut)
    await b.start()
    bb, mb = b.bb, b.cfg.max_burst
    ram = b.ram
    figures = {}

    # -- 1: SLVERR on one read beat in the middle of a long, multi-burst row -----------------
    d = Descriptor(SRC + 0x3000, 4 * mb + 3, 2, 8 * mb * bb, sp_addr=0, target=0).check(b.cfg)
    bad_addr = d.addr + (2 * mb + 1) * bb
    orig_read = ram.read_if._read

    async def bad_read(address, length):
        if address == bad_addr:
            raise IOError("injected read error")
        return await orig_read(address, length)

    ram.read_if._read = bad_read
    before = int(dut.rd_dones.value)
    await b.push("rd", d)
    await b.wait_idle(limit=20 * d.beats + 2000)
    ram.read_if._read = orig_read
    assert int(dut.error.value) == 1
    assert int(dut.error_code.value) == 1, int(dut.error_code.value)
    assert int(dut.error_addr.value) == bad_addr, (hex(int(dut.error_addr.value)), hex(bad_addr))
    assert int(dut.rd_dones.value) == before, "rd_done must not pulse for a failed read"
    assert not int(dut.m_axi__arvalid.value)
    # while the error is set, commands wait
    dut.rd_cmd__payload.value = Descriptor(SRC, 1).pack(b.cfg)
    dut.rd_cmd__valid.value = 1
    await ReadOnly()
    assert not int(dut.rd_cmd__ready.value), "DMA accepted a command while in error"
    await RisingEdge(dut.clk)
    dut.rd_cmd__valid.value = 0
    await _clear(b)

    # -- 2: SLVERR on a write (B response of the burst holding bad_w) -------------------------
    rd = Descriptor(SRC + 0x5000, 3 * mb + 1, sp_addr=0, target=0).check(b.cfg)
    await b.push("rd", rd)
    await b.wait_idle()
    wd = Descriptor(DST + 0x7000 - bb, 3 * mb + 1, sp_addr=0, target=0).check(b.cfg)
    bursts = wd.bursts(b.cfg)
    bad_burst = bursts[len(bursts) // 2]
    bad_w = bad_burst[0] + bb * (bad_burst[1] - 1)
    orig_write = ram.write_if._write

    async def bad_write(address, data):
        if address == bad_w:
            raise IOError("injected write error")
        return await orig_write(address, data)

    ram.write_if._write = bad_write
    before = int(dut.wr_dones.value)
    await b.push("wr", wd)
    await b.wait_idle(limit=20 * wd.beats + 2000)
    ram.write_if._write = orig_write
    assert int(dut.error_code.value) == 2, int(dut.error_code.value)
    assert int(dut.error_addr.value) == bad_burst[0], (hex(int(dut.error_addr.value)), hex(bad_burst[0]))
    assert int(dut.wr_dones.value) == before
    assert not int(dut.m_axi__awvalid.value) and not int(dut.m_axi__wvalid.value)
    await _clear(b)

    # -- 3: writes outside the window are rejected, nothing is written -----------------------
    lo, hi = DST + 0x10000, DST + 0x12000
    dut.window_lo.value = lo
    dut.window_hi.value = hi
    snapshot = ram.read(DST, MEM - DST)
    cases = [
        Descriptor(lo - bb, 4, sp_addr=0),                            # starts below
        Descriptor(hi - 3 * bb, 4, sp_addr=0),                        # ends one beat past hi
        Descriptor(lo, 2, 3, 0x1000, sp_addr=0),                      # third row outside
        Descriptor(lo, 1, 1, 0, 2, 0x2000, sp_addr=0),                # second plane at hi
    ]
    for wd in cases:
        before = int(dut.wr_dones.value)
        await b.push("wr", wd)
        await b.wait_idle()
        assert int(dut.error_code.value) == 5, (wd, int(dut.error_code.value))
        assert int(dut.error_addr.value) == wd.addr, (hex(int(dut.error_addr.value)), wd)
        assert int(dut.wr_dones.value) == before
        await _clear(b)
    assert ram.read(DST, MEM - DST) == snapshot, "a rejected write modified DRAM"
    # exactly filling the window is fine: [lo, hi)
    fill = Descriptor(lo, (hi - lo) // bb // 2, 2, (hi - lo) // 2, sp_addr=0).check(b.cfg)
    assert fill.extent(bb) == (lo, hi)
    before = int(dut.wr_dones.value)
    await b.push("wr", fill)
    await b.wait_count("wr_dones", before + 1, 20 * fill.beats + 1000)
    assert not int(dut.error.value)

    # -- 4: a read error while reads and writes are both in flight ----------------------------
    dut.window_lo.value = DST
    dut.window_hi.value = MEM
    rbig = Descriptor(SRC + 0x20000, 2 * mb, 6, 4 * mb * bb, sp_addr=0, target=2).check(b.cfg)
    wbig = Descriptor(DST + 0x20000, 2 * mb, 6, 4 * mb * bb, sp_addr=0, target=0).check(b.cfg)
    bad_addr = rbig.addr + 2 * (4 * mb * bb) + 5 * bb
    ram.read_if._read = bad_read
    await gather(b.push("rd", rbig), b.push("wr", wbig))
    await b.wait_idle(limit=40 * (rbig.beats + wbig.beats) + 2000)
    ram.read_if._read = orig_read
    assert int(dut.error_code.value) == 1 and int(dut.error_addr.value) == bad_addr
    await _clear(b)

    # -- recovery: a normal round trip after all that ------------------------------------------
    rd = Descriptor(SRC + 0x4000 - 2 * bb, mb + 7, 3, (mb + 9) * bb, sp_addr=5, target=3).check(b.cfg)
    wd = Descriptor(DST + 0x30000, rd.beats, sp_addr=5, target=3).check(b.cfg)
    await b.push("rd", rd)
    await b.wait_idle()
    await b.push("wr", wd)
    await b.wait_idle()
    assert not int(dut.error.value)
    want = b"".join(b.gather(ram.read(0, MEM), rd))
    assert ram.read(wd.addr, wd.beats * bb) == want, "round trip after clear failed"
    _report(b, "errors", figures)


async def _clear(b):
    b.dut.clear.value = 1
    await RisingEdge(b.dut.clk)
    b.dut.clear.value = 0
    await RisingEdge(b.dut.clk)
    assert not int(b.dut.error.value)
    await b.wait_idle()


def _report(b, name, figures):
    path = b.p.get("report")
    if not path:
        return
    path = f"{path}.{name}.json"
    with open(path, "w") as f:
        json.dump(figures, f, indent=1)

"""cocotb testbench: the accelerator's CSR bank (AXI4-Lite) driven by cocotbext-axi's AxiLiteMaster.

Parameters (``DNNFAB_PARAMS``): ``regmap`` (the :meth:`RegisterMap.to_json` of the bank
under test), ``stalls`` (random pauses on all five AXI-Lite channels, so AW and W arrive
in either order and responses are back-pressured).

Checks: const registers (ID, VERSION, CONFIGn) read their values; rw registers read back
and drive their ports, honouring ``wstrb`` and the register width; ro registers show their
inputs; w1c bits are set by hardware and cleared by writing 1; pulse registers produce
exactly one cycle of the written value and read as 0; unmapped addresses read 0 (OKAY) and
ignore writes; reading ``X_LO`` latches ``X_HI``; concurrent reads and writes.
"""

import itertools
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly, gather
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiResp

from dnnfab.cosim import params


class Bench:
    def __init__(self, dut):
        self.dut = dut
        self.p = params()
        self.regs = {r["name"]: r for r in self.p["regmap"]["registers"]}
        self.rng = random.Random(self.p.get("seed", 3))
        self.pulses = []          # (cycle, register, value) seen on pulse ports
        self.cycle = 0

    def port(self, name):
        return getattr(self.dut, name.lower())

    async def start(self):
        dut = self.dut
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        dut.rst.value = 1
        for r in self.regs.values():
            if r["access"] == "ro":
                self.port(r["name"]).value = 0
            if r["access"] == "w1c":
                getattr(dut, r["name"].lower() + "_set").value = 0
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "bus_"), dut.clk, dut.rst)
        if self.p.get("stalls"):
            for ch in (self.axil.write_if.aw_channel, self.axil.write_if.w_channel,
                       self.axil.write_if.b_channel, self.axil.read_if.ar_channel,
                       self.axil.read_if.r_channel):
                ch.set_pause_generator(itertools.cycle([self.rng.random() < 0.4 for _ in range(97)]))
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        cocotb.start_soon(self._watch_pulses())

    async def _watch_pulses(self):
        names = [r["name"] for r in self.regs.values() if r["access"] == "pulse"]
        while True:
            await RisingEdge(self.dut.clk)
            await ReadOnly()
            self.cycle += 1
            for n in names:
                v = int(self.port(n).value)
                if v:
                    self.pulses.append((self.cycle, n, v))

    async def read(self, offset):
        resp = await self.axil.read(offset, 4)
        assert resp.resp == AxiResp.OKAY, (hex(offset), resp.resp)
        return int.from_bytes(resp.data, "little")

    async def write(self, offset, value, nbytes=4):
        resp = await self.axil.write(offset, int(value).to_bytes(nbytes, "little"))
        assert resp.resp == AxiResp.OKAY, (hex(offset), resp.resp)


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def registers(dut):
    b = Bench(dut)
    await b.start()
    regs = b.regs
    mask = lambda r: (1 << r["width"]) - 1  # noqa: E731

    # -- const -----------------------------------------------------------------------
    for r in regs.values():
        if r["access"] == "const":
            got = await b.read(r["offset"])
            assert got == r["reset"], f"{r['name']}: read {got:#x}, expected {r['reset']:#x}"
    assert await b.read(regs["ID"]["offset"]) == 0x444E4E46

    # -- rw: reset values, read back, port value, width, byte strobes --------------------
    rws = [r for r in regs.values() if r["access"] == "rw"]
    for r in rws:
        assert await b.read(r["offset"]) == r["reset"]
    vals = {}
    for r in rws:
        v = b.rng.getrandbits(32)
        await b.write(r["offset"], v)
        vals[r["name"]] = v & mask(r)
    for r in rws:
        got = await b.read(r["offset"])
        assert got == vals[r["name"]], f"{r['name']}: {got:#x} != {vals[r['name']]:#x}"
        assert int(b.port(r["name"]).value) == vals[r["name"]]
    wide = next(r for r in rws if r["width"] == 32)
    await b.write(wide["offset"], 0x11223344)
    await b.write(wide["offset"] + 2, 0xAB, nbytes=1)        # wstrb = 0b0100
    assert await b.read(wide["offset"]) == 0x11AB3344
    await b.write(wide["offset"] + 1, 0xCDEF, nbytes=2)      # wstrb = 0b0110
    assert await b.read(wide["offset"]) == 0x11CDEF44

    # -- ro: live inputs ---------------------------------------------------------------
    status = regs["STATUS"]
    b.port("STATUS").value = 0x0507 & mask(status)
    await RisingEdge(dut.clk)
    assert await b.read(status["offset"]) == 0x0507
    await b.write(status["offset"], 0)                      # writes to ro are ignored
    assert await b.read(status["offset"]) == 0x0507

    # -- w1c -----------------------------------------------------------------------------
    irq = regs["IRQ_STATUS"]
    setp = dut.irq_status_set
    assert await b.read(irq["offset"]) == 0
    for bit in (0, 1):
        setp.value = 1 << bit
        await RisingEdge(dut.clk)
        setp.value = 0
        await RisingEdge(dut.clk)
    assert await b.read(irq["offset"]) == 3
    assert int(dut.irq_status.value) == 3
    await b.write(irq["offset"], 1)
    assert await b.read(irq["offset"]) == 2
    await b.write(irq["offset"], 0)                         # writing 0 changes nothing
    assert await b.read(irq["offset"]) == 2
    # an event that keeps firing while software clears stays set
    setp.value = 2
    await b.write(irq["offset"], 3)
    setp.value = 0
    await RisingEdge(dut.clk)
    assert await b.read(irq["offset"]) == 2, "an event during the clearing write was lost"
    await b.write(irq["offset"], 2)
    assert await b.read(irq["offset"]) == 0

    # -- pulse ---------------------------------------------------------------------------
    ctrl = regs["CTRL"]
    for v in (1, 4, 5):
        b.pulses.clear()
        await b.write(ctrl["offset"], v)
        for _ in range(3):
            await RisingEdge(dut.clk)
        assert [(n, x) for _, n, x in b.pulses] == [("CTRL", v)], b.pulses
    assert await b.read(ctrl["offset"]) == 0

    # -- 64-bit counters: reading LO latches HI ------------------------------------------------
    for r in regs.values():
        if r.get("latch"):
            lo, hi = r, regs[r["latch"]]
            b.port(lo["name"]).value = 0xFFFFFFF0
            b.port(hi["name"]).value = 7
            await RisingEdge(dut.clk)
            assert await b.read(lo["offset"]) == 0xFFFFFFF0
            b.port(hi["name"]).value = 8                     # the counter carried meanwhile
            await RisingEdge(dut.clk)
            assert await b.read(hi["offset"]) == 7, f"{hi['name']} was not latched by the {lo['name']} read"
            assert await b.read(lo["offset"]) == 0xFFFFFFF0
            assert await b.read(hi["offset"]) == 8

    # -- unmapped addresses: read 0 with OKAY, writes ignored -----------------------------------
    used = {r["offset"] for r in regs.values()}
    holes = [o for o in range(0, 0x100, 4) if o not in used][:4] + [0x400, 0xFFC]
    for off in holes:
        await b.write(off, 0xDEADBEEF)
        assert await b.read(off) == 0, hex(off)
    for r in rws:
        assert int(b.port(r["name"]).value) == (await b.read(r["offset"]))

    # -- concurrent traffic: reads of consts interleaved with writes --------------------------
    prog = regs["PROG_BASE"]["offset"]

    async def writer():
        for i in range(20):
            await b.write(prog, 0x1000 * i)

    async def reader():
        for _ in range(20):
            assert await b.read(regs["ID"]["offset"]) == 0x444E4E46

    await gather(writer(), reader())
    assert await b.read(prog) == 0x1000 * 19
    # several reads queued at once (ARs back to back while an R is still pending)
    consts = [r for r in regs.values() if r["access"] == "const"] * 3
    got = await gather(*[b.read(r["offset"]) for r in consts])
    assert list(got) == [r["reset"] for r in consts]
    writes = [(r, b.rng.getrandbits(32) & mask(r)) for r in rws]
    await gather(*[b.write(r["offset"], v) for r, v in writes])
    # (a write lands on the port the cycle after the master sees its B response: before
    # any read it can issue, as the bus read-backs above check)
    await RisingEdge(dut.clk)
    for r, v in writes:
        assert int(b.port(r["name"]).value) == v, r["name"]

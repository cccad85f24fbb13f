"""cocotb testbench: whole layers through the generated accelerator, DRAM to DRAM.

The DUT's AXI4 master talks to a cocotbext-axi ``AxiRam`` (the DRAM); the testbench is
the host: it writes the program, weights and input into DRAM, programs the registers over
AXI4-Lite (``AxiLiteMaster``), starts, waits for the interrupt (bounded), then checks

* the int8 output region equals :meth:`ConvLayer.reference` bit for bit, and every
  byte of the output region's padding and of DRAM beyond it is untouched;
* the performance counters equal what the testbench observed / can derive.

Parameters (``DNNFAB_PARAMS``): ``config`` (AcceleratorConfig dict), ``layers``: list of
``{"cin", "cout", "k", "stride", "pad", "hw", "dilation", "seed"}``, optional ``report``
(JSON path), ``inject``: error-injection case (see :func:`error_cases`).
"""

import json
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ClockCycles, ReadOnly
from cocotbext.axi import AxiBus, AxiRam, AxiLiteBus, AxiLiteMaster
from cocotbext.axi.constants import AxiResp
import numpy as np

from dnnfab.cosim import params
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.regmap import accelerator_regmap, COUNTERS
from cocotb.utils import get_sim_time
from dnnfab.cosim.fuzz import layer_from_spec
from dnnfab.sw.compiler.layer import random_layer
from dnnfab.sw.compiler.program import compile_layer

GUARD = 0xA5


class Host:
    def __init__(self, dut, cfg, mem_size):
        self.dut = dut
        self.cfg = cfg
        self.regs = accelerator_regmap(cfg)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi_"), dut.clk, dut.rst, size=mem_size)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil_"), dut.clk, dut.rst)
        self.cycle = 0

    async def count_cycles(self):
        watch = []
        if params().get("xwatch"):
            for path in params()["xwatch"]:
                h = self.dut
                for part in path.split("."):
                    h = getattr(h, part)
                watch.append((path, h))
        reported = set()
        while True:
            await RisingEdge(self.dut.clk)
            self.cycle += 1
            for path, h in watch:
                if path not in reported and not h.value.is_resolvable:
                    reported.add(path)
                    self.dut._log.error(f"X: {path} at cycle {self.cycle}")

    def dump_state(self):
        """Log internal state (hierarchical names of the generated Verilog) after a hang;
        returns it as one line."""
        out = []
        names = {
            "controller": ["running", "dispatched", "tok_l2c", "tok_c2l", "tok_c2s", "tok_s2c",
                           "tok_l2c_avail", "tok_c2l_avail", "tok_c2s_avail", "tok_s2c_avail",
                           "load_h_valid", "comp_h_valid", "store_h_valid",
                           "insn_valid", "stopped", "all_idle", "comp_ok", "c_idle"],
            "compute": ["dstate", "started", "a_ahead", "w_ahead", "idle"],
            "dma": ["busy", "error"],
        }
        for block, sigs in names.items():
            h = getattr(self.dut, block)
            vals = {}
            for sname in sigs:
                try:
                    vals[sname] = int(getattr(h, sname).value)
                except Exception as exc:  # noqa: BLE001 - best effort diagnostics
                    vals[sname] = f"? {exc}"[:60]
            self.dut._log.error(f"{block}: {vals}")
            out.append(f"{block} " + ", ".join(f"{k} {v}" for k, v in vals.items()))
        return "; ".join(out)

    def controller_handles(self):
        c = self.dut.controller
        return [(n, getattr(c, n)) for n in ("fetch_go", "load_sel", "comp_sel", "store_sel", "insn_take")]

    def off(self, name):
        return self.regs[name].offset

    async def wr(self, name, value):
        await self.axil.write_dword(self.off(name), value & 0xFFFFFFFF)

    async def rd(self, name):
        return await self.axil.read_dword(self.off(name))

    async def counter(self, name):
        lo = await self.rd(f"{name}_LO")
        hi = await self.rd(f"{name}_HI")
        return lo | (hi << 32)

    async def run(self, prog_base, prog_len, out_lo, out_hi, limit):
        await self.wr("PROG_BASE", prog_base)
        await self.wr("PROG_LEN", prog_len)
        await self.wr("OUT_LO", out_lo)
        await self.wr("OUT_HI", out_hi)
        await self.wr("IRQ_ENABLE", 3)
        await self.wr("IRQ_STATUS", 3)
        await self.wr("CTRL", 1)
        t0 = self.cycle
        while not self.dut.irq.value:
            await RisingEdge(self.dut.clk)
            if self.cycle - t0 > limit:
                state = self.dump_state()
                status = await self.rd("STATUS")
                raise AssertionError(f"accelerator hung: no interrupt after {limit} cycles, STATUS={status:#x}; "
                                     f"{state}")
        t1 = self.cycle
        status = await self.rd("STATUS")
        return status, t1 - t0


async def setup(dut, cfg, mem_size):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    host = Host(dut, cfg, mem_size)
    cocotb.start_soon(host.count_cycles())
    dut.rst.value = 1
    await ClockCycles(dut.clk, 5)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 5)
    assert await host.rd("ID") == 0x444E4E46, "ID register does not read 'DNNF'"
    return host


def expected_rd_bytes(prog, cfg):
    from dnnfab.hw.spec import FETCH_CHUNK
    load_bytes = sum(i.len0 * i.n1 * i.n2 for i in prog.insns if type(i).__name__ == "Load") * cfg.bus_bytes
    return load_bytes + len(prog.insns) * 32


@cocotb.test()
async def layers(dut):
    p = params()
    cfg = AcceleratorConfig.from_dict(p["config"])
    specs = p["layers"]
    keep_going = bool(p.get("keep_going"))
    progs = []
    for s in specs:
        layer, x = layer_from_spec(s)
        progs.append((layer, x, compile_layer(layer, cfg)))
    mem = 1 << max(16, (max(pr.dram_size for _, _, pr in progs) + 8192 - 1).bit_length())
    host = await setup(dut, cfg, mem)
    report = []
    progress = open(p["progress"], "a") if p.get("progress") else None
    for (layer, x, prog), s in zip(progs, specs):
        if not keep_going:
            report.append(await run_layer(host, cfg, mem, layer, x, prog, s))
            continue
        # fuzzing: record the outcome of every layer and go on (a hang is recovered with
        # SOFT_RESET, which resets the controller's queues and token counters)
        t_sim = get_sim_time("ns")
        try:
            rec = await run_layer(host, cfg, mem, layer, x, prog, s)
        except AssertionError as exc:
            rec = {"layer": s, "bit_exact": False, "error": str(exc).splitlines()[0][:2000],
                   "fail_time_ns": get_sim_time("ns"), "start_time_ns": t_sim}
            await host.wr("CTRL", 2 | 4)
            await ClockCycles(dut.clk, 4)
            await host.wr("IRQ_STATUS", 3)
        report.append(rec)
        if progress:
            progress.write(json.dumps(rec) + "\n")
            progress.flush()
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(report, f, indent=1)


async def run_layer(host, cfg, mem, layer, x, prog, s):
    """Run one compiled layer from DRAM to DRAM and check it; returns its record."""
    host.ram.write(0, bytes([GUARD]) * mem)
    for addr, blob in prog.dram_images(x):
        host.ram.write(addr, blob)
    out_addr, out_size = prog.regions["output"]
    # the hardware may only write its output region
    trace = []
    if s.get("trace"):
        # debugging aid: the cycle of every fetch / load / compute / store / dispatch
        # selection of the controller (relative to START)
        async def tracer():
            c = host.controller_handles()
            t = 0
            while True:
                await RisingEdge(host.dut.clk)
                t += 1
                for name, h in c:
                    if h.value.is_resolvable and int(h.value):
                        trace.append((t, name))
        tr = cocotb.start_soon(tracer())
    t_wall = time.monotonic()
    limit = s.get("limit") or 20 * prog.hw_macs // (cfg.rows * cfg.cols) + 200000
    status, cycles = await host.run(prog.regions["program"][0], len(prog.insns), out_addr,
                                    out_addr + out_size, limit=limit)
    wall = time.monotonic() - t_wall
    if s.get("trace"):
        tr.cancel()
    assert status & 0x4 == 0, f"error bit set: STATUS={status:#x}, ERROR_INFO={await host.rd('ERROR_INFO'):#x}"
    assert status & 0x2, f"DONE not set: STATUS={status:#x}"
    raw = host.ram.read(out_addr, out_size)
    y = prog.unpack_output(raw)
    ref = layer.reference(x)
    if not np.array_equal(y, ref):
        bad = np.argwhere(y != ref)
        raise AssertionError(f"{s}: {len(bad)} of {ref.size} outputs differ; first (h,w,c) {bad[:4].tolist()} "
                             f"got {[int(y[tuple(i)]) for i in bad[:4]]} want {[int(ref[tuple(i)]) for i in bad[:4]]}")
    # padding channels of the output stay as computed (zero-weight lanes) but nothing
    # outside the output region may change
    whole = host.ram.read(0, mem)
    outside = np.frombuffer(whole, np.uint8).copy()
    outside[out_addr:out_addr + out_size] = GUARD
    for addr, blob in prog.dram_images(x):
        outside[addr:addr + len(blob)] = GUARD
    assert np.all(outside == GUARD), "DRAM outside the output region was modified"
    counters = {n: await host.counter(n) for n in COUNTERS}
    assert counters["MACS"] == prog.hw_macs, (counters["MACS"], prog.hw_macs)
    assert counters["BUSY_CYCLES"] == prog.array_beats
    assert counters["INSNS"] == len(prog.insns)
    assert counters["DMA_RD_BYTES"] == expected_rd_bytes(prog, cfg), (counters["DMA_RD_BYTES"], expected_rd_bytes(prog, cfg))
    st_bytes = sum(i.len0 * i.n1 * i.n2 for i in prog.insns if type(i).__name__ == "Store") * cfg.bus_bytes
    assert counters["DMA_WR_BYTES"] == st_bytes
    # CYCLES counts the controller's run (its registered start acts two cycles after the
    # CTRL write's B response: the CSR bank applies writes a cycle later) up to DONE;
    # the testbench sees the interrupt one or two cycles after that
    assert 2 <= cycles - counters["CYCLES"] <= 5, (cycles, counters["CYCLES"])
    await host.wr("IRQ_STATUS", 3)
    return {"layer": s, "cycles": counters["CYCLES"], "macs": layer.macs, "hw_macs": prog.hw_macs,
            "counters": counters, "tb_cycles": cycles, "wall_s": wall, "bit_exact": True,
            **({"trace": trace} if trace else {})}


def error_layer(cfg):
    rng = np.random.default_rng(11)
    layer = random_layer(rng, 8, 8, k=3, stride=1, pad=1, in_hw=(6, 6))
    x = layer.random_input(rng)
    return layer, x, compile_layer(layer, cfg)


@cocotb.test()
async def errors(dut):
    """Fault injection: each case ends with the right code, DONE and the error interrupt,
    within a bounded number of cycles, with DRAM outside the output window untouched;
    a soft reset then brings the accelerator back (a clean run is bit-exact)."""
    p = params()
    cfg = AcceleratorConfig.from_dict(p["config"])
    layer, x, prog = error_layer(cfg)
    mem = 1 << max(16, (prog.dram_size + 8192).bit_length())
    host = await setup(dut, cfg, mem)
    out_addr, out_size = prog.regions["output"]
    prog_addr = prog.regions["program"][0]
    limit = 50000
    figures = {}

    def load_images():
        host.ram.write(0, bytes([GUARD]) * mem)
        for addr, blob in prog.dram_images(x):
            host.ram.write(addr, blob)

    def untouched_outside(lo, hi):
        whole = np.frombuffer(host.ram.read(0, mem), np.uint8).copy()
        whole[lo:hi] = GUARD
        for addr, blob in prog.dram_images(x):
            whole[addr:addr + len(blob)] = GUARD
        return bool(np.all(whole == GUARD))

    async def recover():
        await host.wr("CTRL", 2 | 4)         # soft reset + clear error
        await ClockCycles(dut.clk, 4)
        await host.wr("IRQ_STATUS", 3)

    async def expect_error(code, what, lo=out_addr, hi=out_addr + out_size, n_insns=len(prog.insns)):
        status, cycles = await host.run(prog_addr, n_insns, out_addr, hi, limit)
        got = (status >> 8) & 0xFF
        assert status & 0x4, f"{what}: ERROR not set (STATUS={status:#x})"
        assert status & 0x2 and not status & 0x1, f"{what}: expected DONE and not BUSY (STATUS={status:#x})"
        assert got == code, f"{what}: error code {got}, expected {code}"
        irq = await host.rd("IRQ_STATUS")
        assert irq & 0x2, f"{what}: error interrupt not raised (IRQ_STATUS={irq:#x})"
        assert untouched_outside(lo, hi), f"{what}: DRAM outside [{lo:#x}, {hi:#x}) was modified"
        figures[what] = {"code": got, "cycles_to_irq": cycles, "error_info": await host.rd("ERROR_INFO")}
        await recover()

    # 1. SLVERR on one read beat of the weights
    load_images()
    bad = prog.regions["weights"][0] + cfg.bus_bytes * 3
    orig_read = host.ram.read_if._read

    async def bad_read(address, length):
        if address == bad:
            raise IOError("injected read error")
        return await orig_read(address, length)

    host.ram.read_if._read = bad_read
    await expect_error(1, "axi_read_slverr")
    host.ram.read_if._read = orig_read
    assert figures["axi_read_slverr"]["error_info"] == bad

    # 2. SLVERR on a write beat of the output
    load_images()
    badw = out_addr + cfg.bus_bytes
    orig_write = host.ram.write_if._write

    async def bad_write(address, data):
        if address <= badw < address + len(data):
            raise IOError("injected write error")
        return await orig_write(address, data)

    host.ram.write_if._write = bad_write
    await expect_error(2, "axi_write_slverr")
    host.ram.write_if._write = orig_write

    # 3. illegal opcode in the middle of the program
    load_images()
    k = len(prog.insns) // 2
    host.ram.write(prog_addr + 32 * k, (7).to_bytes(32, "little"))
    await expect_error(3, "illegal_opcode")
    assert figures["illegal_opcode"]["error_info"] == k

    # 4. store outside the output window (window one beat short)
    load_images()
    await expect_error(5, "outside_window", hi=out_addr + out_size - cfg.bus_bytes)

    # 5. clean run after the faults
    load_images()
    status, cycles = await host.run(prog_addr, len(prog.insns), out_addr, out_addr + out_size, limit)
    assert status & 0x6 == 0x2, f"clean run after faults: STATUS={status:#x}"
    y = prog.unpack_output(host.ram.read(out_addr, out_size))
    assert np.array_equal(y, layer.reference(x)), "clean run after faults is not bit-exact"
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(figures, f, indent=1)

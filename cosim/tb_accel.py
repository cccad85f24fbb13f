"""cocotb testbench: whole layers through the generated accelerator, DRAM to DRAM.

The DUT's AXI4 master talks to the DRAM (:mod:`dnnfab.cosim.dram`): the Verilog memory
``dnnfab_axi_dram`` inside the simulated top ``dnnfab_tb_top`` (``dram="verilog"``, the
default), or cocotbext-axi's ``AxiRam`` on the top's ``m_axi__*`` port (``"axiram"``);
which one is decided by the top the harness built (:func:`dnnfab.cosim.dram.run_accel`). The
testbench is the host: it writes the program, weights and input into DRAM (in bulk),
programs the registers over AXI4-Lite (``AxiLiteMaster``), starts, waits for the interrupt
edge (bounded by a timer; no Python runs per cycle), then checks

* the int8 output region equals :meth:`ConvLayer.reference` bit for bit, and every
  byte of the output region's padding and of DRAM beyond it is untouched;
* the performance counters equal what the testbench observed / can derive.

Parameters (``DNNFAB_PARAMS``): ``config`` (AcceleratorConfig dict), ``layers``: list of
``{"cin", "cout", "k", "stride", "pad", "hw", "dilation", "seed"}``, optional ``report``
(JSON path), ``axi_trace`` (true: each layer's record gets every AXI handshake,
``[cycle from START, channel, payload]``, for comparing DRAM models; Python per cycle),
``xwatch`` (signals to watch for X, per cycle; needs an all-public build), ``keep_going``
and ``progress`` (fuzzing, :mod:`dnnfab.cosim.fuzz`). Testcase ``errors``: the fault cases.

Cycles are counted from simulated time (``CLOCK_NS`` per cycle), so nothing counts clock
edges in Python.
"""

import json
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ClockCycles, First, Timer
from cocotbext.axi import AxiLiteBus, AxiLiteMaster
import numpy as np

from dnnfab.cosim import params
from dnnfab.cosim.dram import open_dram, DEBUG_SIGNALS, CLOCK_NS
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.regmap import accelerator_regmap, COUNTERS
from cocotb.utils import get_sim_time, get_sim_steps
from dnnfab.cosim.fuzz import layer_from_spec
from dnnfab.sw.compiler.layer import random_layer
from dnnfab.sw.compiler.program import compile_layer

GUARD = 0xA5


class Host:
    def __init__(self, dut, cfg, mem_size, axil=None):
        self.dut = dut
        self.cfg = cfg
        self.regs = accelerator_regmap(cfg)
        self.clk = dut.clk
        self.dram = open_dram(dut, cfg, mem_size, self.clk)
        # the accelerator: instance ``accel`` of dnnfab_tb_top (or the top itself)
        self.acc = dut.accel if hasattr(dut, "accel") else dut
        # the AXI4-Lite master: cocotbext-axi's, unless the caller brings its own
        # (``read_dword`` / ``write_dword``, e.g. cosim/tb_rtl.py's)
        self.axil = axil or AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil_"), self.clk, dut.rst)

    @property
    def cycle(self):
        """Simulated time in clock periods (rising edges at half a period past each multiple)."""
        return get_sim_time("step") // get_sim_steps(CLOCK_NS, "ns")

    async def xwatch(self, paths):
        watch = []
        for path in paths:
            h = self.acc
            for part in path.split("."):
                h = getattr(h, part)
            watch.append((path, h))
        reported = set()
        while True:
            await RisingEdge(self.clk)
            for path, h in watch:
                if path not in reported and not h.value.is_resolvable:
                    reported.add(path)
                    self.dut._log.error(f"X: {path} at cycle {self.cycle}")

    def dump_state(self):
        """Log internal state (hierarchical names of the generated Verilog) after a hang;
        returns it as one line."""
        out = []
        names = {b: [n for n in sigs if not n.endswith(("_go", "_sel", "_take"))]
                 for b, sigs in DEBUG_SIGNALS.items()}
        for block, sigs in names.items():
            h = getattr(self.acc, block)
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
        c = self.acc.controller
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
        t0 = self.start_cycle = self.cycle
        if not self.dut.irq.value:
            # the interrupt edge or the watchdog, whichever first; cycles as a loop sampling
            # irq at every rising edge would count them (up to the first edge that sees it)
            fired = await First(RisingEdge(self.dut.irq), Timer((limit + 1) * CLOCK_NS, "ns"))
            if not isinstance(fired, RisingEdge):
                bad = self.dram.protocol_error()
                state = self.dump_state()
                status = await self.rd("STATUS")
                raise AssertionError(f"accelerator hung: no interrupt after {limit} cycles, STATUS={status:#x}; "
                                     f"{state}" + (f"; {bad}" if bad else ""))
            await RisingEdge(self.clk)
        t1 = self.cycle
        bad = self.dram.protocol_error()
        if bad:
            raise AssertionError(bad)
        status = await self.rd("STATUS")
        return status, t1 - t0


async def setup(dut, cfg, mem_size, axil=None):
    dut.rst.value = 1
    host = Host(dut, cfg, mem_size, axil(dut) if axil else None)
    # the clock in the GPI layer (C), not a Python task toggling it; the first rising edge
    # at half a period, after the reset and the bus models' initial values are applied
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start(start_high=False))
    if params().get("xwatch"):
        cocotb.start_soon(host.xwatch(params()["xwatch"]))
    await ClockCycles(host.clk, 5)
    dut.rst.value = 0
    await ClockCycles(host.clk, 5)
    await host.dram.fill(0)
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
            await ClockCycles(host.clk, 4)
            await host.wr("IRQ_STATUS", 3)
        report.append(rec)
        if progress:
            progress.write(json.dumps(rec) + "\n")
            progress.flush()
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(report, f, indent=1)


async def load_layer(host, mem, prog, x):
    """DRAM = GUARD everywhere, then the program, weights, aux and input images (bulk)."""
    await host.dram.fill(GUARD, 0, mem)
    await host.dram.load(prog.dram_images(x))


async def outside_changed(host, prog, x, lo, hi):
    """First DRAM address outside ``[lo, hi)`` and the images that is not GUARD, or None."""
    keep = [(lo, hi)] + [(addr, addr + len(blob)) for addr, blob in prog.dram_images(x)]
    return await host.dram.first_change(GUARD, keep)


AXI_CHANNELS = {   # channel: (valid, ready, payload signals)
    "ar": ("arvalid", "arready", ("arid", "araddr", "arlen", "arsize", "arburst")),
    "aw": ("awvalid", "awready", ("awid", "awaddr", "awlen", "awsize", "awburst")),
    "w": ("wvalid", "wready", ("wdata", "wstrb", "wlast")),
    "r": ("rvalid", "rready", ("rid", "rdata", "rresp", "rlast")),
    "b": ("bvalid", "bready", ("bid", "bresp")),
}


async def axi_tracer(host, out):
    """Debugging / model comparison: ``(cycle, channel, payload)`` of every AXI handshake
    on the accelerator's m_axi port (its own port or the wires of dnnfab_tb_top); per
    cycle Python, so only when asked for."""
    sig = {ch: (getattr(host.dut, f"m_axi__{v}"), getattr(host.dut, f"m_axi__{r}"),
                [getattr(host.dut, f"m_axi__{n}") for n in pay]) for ch, (v, r, pay) in AXI_CHANNELS.items()}
    while True:
        await RisingEdge(host.clk)
        c = host.cycle
        for ch, (v, r, pay) in sig.items():
            if v.value.is_resolvable and r.value.is_resolvable and int(v.value) and int(r.value):
                out.append((c, ch, [int(h.value) if h.value.is_resolvable else str(h.value) for h in pay]))


async def run_layer(host, cfg, mem, layer, x, prog, s):
    """Run one compiled layer from DRAM to DRAM and check it; returns its record."""
    await load_layer(host, mem, prog, x)
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
                await RisingEdge(host.clk)
                t += 1
                for name, h in c:
                    if h.value.is_resolvable and int(h.value):
                        trace.append((t, name))
        tr = cocotb.start_soon(tracer())
    axi = []
    if params().get("axi_trace"):
        atr = cocotb.start_soon(axi_tracer(host, axi))
    t_wall, t_cpu = time.monotonic(), time.process_time()
    limit = s.get("limit") or 20 * prog.hw_macs // (cfg.rows * cfg.cols) + 200000
    status, cycles = await host.run(prog.regions["program"][0], len(prog.insns), out_addr,
                                    out_addr + out_size, limit=limit)
    wall, cpu = time.monotonic() - t_wall, time.process_time() - t_cpu
    if s.get("trace"):
        tr.cancel()
    if params().get("axi_trace"):
        atr.cancel()
    assert status & 0x4 == 0, f"error bit set: STATUS={status:#x}, ERROR_INFO={await host.rd('ERROR_INFO'):#x}"
    assert status & 0x2, f"DONE not set: STATUS={status:#x}"
    raw = await host.dram.read(out_addr, out_size)
    y = prog.unpack_output(raw)
    ref = layer.reference(x)
    if not np.array_equal(y, ref):
        bad = np.argwhere(y != ref)
        raise AssertionError(f"{s}: {len(bad)} of {ref.size} outputs differ; first (h,w,c) {bad[:4].tolist()} "
                             f"got {[int(y[tuple(i)]) for i in bad[:4]]} want {[int(ref[tuple(i)]) for i in bad[:4]]}")
    # padding channels of the output stay as computed (zero-weight lanes) but nothing
    # outside the output region may change
    changed = await outside_changed(host, prog, x, out_addr, out_addr + out_size)
    assert changed is None, f"DRAM outside the output region was modified (first at {changed:#x})"
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
            "counters": counters, "tb_cycles": cycles, "start_cycle": host.start_cycle, "wall_s": wall, "cpu_s": cpu,
            "bit_exact": True,
            **({"trace": trace} if trace else {}),
            **({"axi": [(c - host.start_cycle, ch, pay) for c, ch, pay in axi]} if params().get("axi_trace") else {})}


def error_layer(cfg):
    rng = np.random.default_rng(11)
    layer = random_layer(rng, 8, 8, k=3, stride=1, pad=1, in_hw=(6, 6))
    x = layer.random_input(rng)
    return layer, x, compile_layer(layer, cfg)


@cocotb.test()
async def errors(dut):
    """Fault injection: each case ends with the right code, DONE and the error interrupt,
    within a bounded number of cycles, with DRAM outside the output window untouched;
    a program that never finishes trips the watchdog; a soft reset then brings the
    accelerator back (a clean run is bit-exact)."""
    p = params()
    cfg = AcceleratorConfig.from_dict(p["config"])
    layer, x, prog = error_layer(cfg)
    mem = 1 << max(16, (prog.dram_size + 8192).bit_length())
    host = await setup(dut, cfg, mem)
    out_addr, out_size = prog.regions["output"]
    prog_addr = prog.regions["program"][0]
    limit = 50000
    figures = {}

    async def recover():
        await host.wr("CTRL", 2 | 4)         # soft reset + clear error
        await ClockCycles(host.clk, 4)
        await host.wr("IRQ_STATUS", 3)

    async def expect_error(code, what, lo=out_addr, hi=out_addr + out_size, n_insns=len(prog.insns)):
        status, cycles = await host.run(prog_addr, n_insns, out_addr, hi, limit)
        host.dram.clear_faults()
        got = (status >> 8) & 0xFF
        assert status & 0x4, f"{what}: ERROR not set (STATUS={status:#x})"
        assert status & 0x2 and not status & 0x1, f"{what}: expected DONE and not BUSY (STATUS={status:#x})"
        assert got == code, f"{what}: error code {got}, expected {code}"
        irq = await host.rd("IRQ_STATUS")
        assert irq & 0x2, f"{what}: error interrupt not raised (IRQ_STATUS={irq:#x})"
        changed = await outside_changed(host, prog, x, lo, hi)
        assert changed is None, f"{what}: DRAM outside [{lo:#x}, {hi:#x}) was modified (first at {changed:#x})"
        figures[what] = {"code": got, "cycles_to_irq": cycles, "error_info": await host.rd("ERROR_INFO")}
        await recover()

    # 1. SLVERR on one read beat of the weights (by address)
    await load_layer(host, mem, prog, x)
    bad = prog.regions["weights"][0] + cfg.bus_bytes * 3
    host.dram.fail_reads(addr=bad)
    await expect_error(1, "axi_read_slverr")
    assert figures["axi_read_slverr"]["error_info"] == bad

    # 1b. SLVERR on read beat number N of the run (counted: the program fetch is beat 0..)
    await load_layer(host, mem, prog, x)
    nth = len(prog.insns) * 32 // cfg.bus_bytes + 5        # a beat of the first loads
    host.dram.fail_reads(beat=nth)
    await expect_error(1, "axi_read_slverr_beat")

    # 2. SLVERR on a write beat of the output (that beat is not written)
    await load_layer(host, mem, prog, x)
    host.dram.fail_writes(addr=out_addr + cfg.bus_bytes)
    await expect_error(2, "axi_write_slverr")
    assert figures["axi_write_slverr"]["error_info"] == out_addr

    # 2b. SLVERR on the response of the run's first write burst (nothing of it written)
    await load_layer(host, mem, prog, x)
    host.dram.fail_writes(burst=0)
    await expect_error(2, "axi_write_slverr_burst")
    assert figures["axi_write_slverr_burst"]["error_info"] == out_addr

    # 3. illegal opcode in the middle of the program
    await load_layer(host, mem, prog, x)
    k = len(prog.insns) // 2
    await host.dram.write(prog_addr + 32 * k, (7).to_bytes(32, "little"))
    await expect_error(3, "illegal_opcode")
    assert figures["illegal_opcode"]["error_info"] == k

    # 4. store outside the output window (window one beat short)
    await load_layer(host, mem, prog, x)
    await expect_error(5, "outside_window", hi=out_addr + out_size - cfg.bus_bytes)

    # 5. a program that never finishes: the first LOAD also waits for a compute->load
    # token that no COMPUTE can push (they wait for that load): the watchdog fires
    await load_layer(host, mem, prog, x)
    first = bytearray(prog.program_bytes[:32])
    assert first[0] & 7 == 1, "the program does not start with a LOAD"
    first[0] |= 1 << 4                      # pop_next
    await host.dram.write(prog_addr, bytes(first))
    t0 = host.cycle
    try:
        await host.run(prog_addr, len(prog.insns), out_addr, out_addr + out_size, 2000)
    except AssertionError as exc:
        assert "accelerator hung: no interrupt after 2000 cycles" in str(exc), exc
    else:
        raise AssertionError("a deadlocked program raised the interrupt")
    status = await host.rd("STATUS")
    assert status & 0x1 and not status & 0x2, f"hung program: expected BUSY, not DONE (STATUS={status:#x})"
    assert host.cycle - t0 >= 2000, "the watchdog fired early"
    figures["hang"] = {"watchdog_limit": 2000, "status": status}
    await recover()

    # 6. clean run after the faults
    await load_layer(host, mem, prog, x)
    status, cycles = await host.run(prog_addr, len(prog.insns), out_addr, out_addr + out_size, limit)
    assert status & 0x6 == 0x2, f"clean run after faults: STATUS={status:#x}"
    y = prog.unpack_output(await host.dram.read(out_addr, out_size))
    assert np.array_equal(y, layer.reference(x)), "clean run after faults is not bit-exact"
    figures["clean"] = {"cycles": cycles}
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(figures, f, indent=1)

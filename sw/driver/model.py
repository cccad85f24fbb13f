"""The ``model`` backend: the fast model acting as the device.

It answers register reads and writes as the generated register bank does (same map, from
:func:`dnnfab.hw.regmap.accelerator_regmap`), runs a program on START with the bit-exact
executor (:class:`~.fastmodel.FastModel`) on its own DRAM, sets STATUS / ERROR_INFO /
IRQ_STATUS as the controller does, and fills the performance counters: CYCLES and
BUSY_CYCLES from the compiler's cycle model (cached per program), the others counted.

A program the hardware would deadlock on (the token machine proves it cannot finish)
leaves the device BUSY with no interrupt, as the RTL would: the driver's wait times out
and :meth:`diagnose` gives the token machine's report (blocked engines, token counts).

The simulated DRAM can fail a beat: ``read_fault`` / ``write_fault`` (a byte address)
make the DMA's read or write that covers it answer SLVERR, as the co-simulation's AXI
memory does (used by the fault tests).
"""

from __future__ import annotations

from ...errors import FabricDeadlock, FabricError
from ...hw.config import AcceleratorConfig
from ...hw.regmap import accelerator_regmap, COUNTERS
from ...hw.spec import ERR_ILLEGAL_INSN, ERR_SP_RANGE
from ..compiler.fastmodel import estimate_cycles
from .backend import Backend
from .fastmodel import FastModel, ModelFault

__all__ = ["ModelBackend"]


class _P:
    def __init__(self, cfg, insns, raw=None):
        self.cfg, self.insns, self.raw = cfg, insns, raw


class ModelBackend(Backend):
    name = "model"

    def __init__(self, cfg: AcceleratorConfig, dram_bytes=1 << 26, options=None):
        self.cfg = cfg
        self.fm = FastModel(cfg, dram_bytes=0, options=options)
        self._dram_size = int(dram_bytes)
        self.regmap = accelerator_regmap(cfg)
        self._by_off = {r.offset: r for r in self.regmap}
        self._read_kind = {}              # offset -> (what a read returns, name)
        for r in self.regmap:
            base = r.name[:-3]
            if r.name.endswith("_LO") and base in COUNTERS:
                self._read_kind[r.offset] = ("lo", base)
            elif r.name.endswith("_HI") and base in COUNTERS:
                self._read_kind[r.offset] = ("hi", base)
            elif r.access == "pulse":
                self._read_kind[r.offset] = ("pulse", r.name)
            else:
                self._read_kind[r.offset] = ("value", r.name)
        self.values = {r.name: (r.reset if r.access in ("const", "rw") else 0) for r in self.regmap}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._latched = {}
        self._next = 0
        self._busy = False
        self._diagnosis = ""
        self._cycles = {}
        self.read_fault = None
        self.write_fault = None
        self.launches = 0

    # -- DRAM ------------------------------------------------------------------------
    def allocate(self, nbytes, align=4096):
        addr = -(-self._next // align) * align
        if addr + nbytes > self._dram_size:
            raise FabricError(f"device DRAM exhausted: {nbytes} bytes at {addr:#x} exceed the "
                              f"model's {self._dram_size} bytes; open the device with a larger "
                              "dram_bytes")
        self._next = addr + nbytes
        self.fm.ensure_dram(self._next)
        return addr

    def dram_write(self, addr, data):
        self.fm.write(addr, data)

    def dram_read(self, addr, n):
        return self.fm.read(addr, n)

    def batch(self):
        return self.fm.blas_held()

    def dram_read_into(self, addr, dst):
        self.fm.read_into(addr, dst)

    # -- registers ---------------------------------------------------------------------
    def read_reg(self, offset):
        kind, name = self._read_kind.get(offset, (None, None))
        if kind is None:
            return 0                      # unmapped: the bank answers 0
        if kind == "lo":
            v = self.counters[name]
            self._latched[name] = v >> 32
            return v & 0xFFFFFFFF
        if kind == "hi":
            return self._latched.get(name, 0)
        if kind == "pulse":
            return 0
        return self.values[name] & 0xFFFFFFFF

    def write_reg(self, offset, value):
        r = self._by_off.get(offset)
        if r is None or r.access in ("const", "ro"):
            return
        value &= (1 << r.width) - 1 if r.width < 32 else 0xFFFFFFFF
        if r.name == "CTRL":
            if value & 2:
                self._soft_reset()
            if value & 4:
                self.values["STATUS"] &= ~(0x4 | 0xFF00)
            if value & 1:
                self._start()
        elif r.access == "w1c":
            self.values[r.name] &= ~value
        else:
            self.values[r.name] = value

    def _irq(self, bits):
        self.values["IRQ_STATUS"] |= bits

    def _soft_reset(self):
        self._busy = False
        self._diagnosis = ""
        self.fm.soft_reset()
        self.values["STATUS"] = 0

    def _start(self):
        if self._busy:
            return                        # START while busy is ignored by the controller
        v = self.values
        base, count = v["PROG_BASE"], v["PROG_LEN"]
        self.launches += 1
        fm = self.fm
        fm.out_window = (v["OUT_LO"], v["OUT_HI"]) if v["OUT_HI"] > v["OUT_LO"] else None
        fm.read_fault, fm.write_fault = self.read_fault, self.write_fault
        before = dict(fm.counters)
        self.counters = dict.fromkeys(COUNTERS, 0)
        v["STATUS"] = 0x1                 # BUSY
        try:
            fm.run_program(base, count)
        except FabricDeadlock as exc:
            self._busy = True             # the hardware hangs: BUSY, no interrupt
            self._diagnosis = str(exc)
            return
        except ModelFault as exc:
            self._count(before, fm.counters)
            v["STATUS"] = 0x2 | 0x4 | ((exc.code & 0xFF) << 8)
            # the controller reports an illegal instruction by its program index (the
            # dispatch count), a DMA fault by its byte address
            v["ERROR_INFO"] = (exc.index if exc.code == ERR_ILLEGAL_INSN else exc.info) & 0xFFFFFFFF
            self._irq(0x2)
            return
        except FabricError as exc:        # a DRAM access beyond the model: a bus error
            self._count(before, fm.counters)
            v["STATUS"] = 0x2 | 0x4 | (ERR_SP_RANGE << 8)
            v["ERROR_INFO"] = base
            self._diagnosis = str(exc)
            self._irq(0x2)
            return
        self._count(before, fm.counters)
        prog = fm._prepare(base, count)
        rep = self._cycles.get(id(prog))
        if rep is None or rep[0] is not prog:
            rep = (prog, estimate_cycles(_P(self.cfg, prog.insns, getattr(prog, "raw", None))))
            self._cycles[id(prog)] = rep
        cyc = rep[1]
        self.counters["CYCLES"] = cyc.cycles
        self.counters["BUSY_CYCLES"] = cyc.compute_cycles
        self.counters["STALL_CYCLES"] = max(0, cyc.cycles - cyc.compute_cycles)
        v["STATUS"] = 0x2                 # DONE
        self._irq(0x1)

    def _count(self, before, after):
        c = self.counters
        c["MACS"] = after["macs"] - before["macs"]
        c["DMA_RD_BYTES"] = after["dma_rd_bytes"] - before["dma_rd_bytes"]
        c["DMA_WR_BYTES"] = after["dma_wr_bytes"] - before["dma_wr_bytes"]
        c["INSNS"] = after["insns"] - before["insns"]

    def wait_irq(self, timeout_s):
        # the model runs a program to completion inside START; a program that cannot
        # finish never raises the interrupt, which the token machine proves at once, so
        # there is nothing to wait for
        return bool(self.values["IRQ_STATUS"] & self.values["IRQ_ENABLE"])

    def diagnose(self):
        return self._diagnosis

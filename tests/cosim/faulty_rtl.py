"""Test-only fault injection on the RTL: an rtl backend that breaks one launch on purpose
(the RTL twin of tests/sw/faulty_backend.py).

Each fault is a real condition of the simulated system: a DRAM read beat answering SLVERR
(the Verilog DRAM's injection), a write burst answering SLVERR, an illegal instruction
word in the program in DRAM, or a program whose dependency tokens can never all be met
(the accelerator never finishes). The program image is restored after the launch.
"""

from dnnfab.cosim.rtl_backend import RtlBackend
from dnnfab.hw.regmap import accelerator_regmap
from dnnfab.hw.spec import INSN_BYTES, decode

FAULTS = ("dma_read", "dma_write", "illegal", "hang")


class FaultyRtlBackend(RtlBackend):
    """Breaks launch number ``at`` (0-based, counting every START) with ``fault``."""

    def __init__(self, cfg, fault, at=0, **kw):
        assert fault in FAULTS
        self.fault, self.at = fault, at
        self.starts = 0
        self.fired = 0
        self._saved = None
        super().__init__(cfg, **kw)
        rm = accelerator_regmap(cfg)
        self._off = {n: rm[n].offset for n in ("CTRL", "PROG_BASE", "PROG_LEN")}

    def write_regs(self, items):
        items = list(items)
        off = self._off
        if (off["CTRL"], 1) in items:
            if self.starts == self.at:
                vals = dict(items)
                self._inject(vals[off["PROG_BASE"]], vals[off["PROG_LEN"]])
            self.starts += 1
        super().write_regs(items)

    def _inject(self, base, count):
        insns = [decode(int.from_bytes(self.dram_read(base + i * INSN_BYTES, INSN_BYTES), "little"))
                 for i in range(count)]
        kinds = [type(i).__name__ for i in insns]
        if self.fault == "dma_read":
            self.fail_reads(addr=insns[kinds.index("Load")].addr)
        elif self.fault == "dma_write":
            self.fail_writes(addr=insns[kinds.index("Store")].addr + self.cfg.bus_bytes)
        elif self.fault == "illegal":
            k = count // 2
            self._saved = (base + k * INSN_BYTES, self.dram_read(base + k * INSN_BYTES, INSN_BYTES))
            self.dram_write(self._saved[0], bytes(INSN_BYTES))
        else:   # hang: drop the first push the first COMPUTE waits for
            k = next(k for k, i in enumerate(insns) if kinds[k] == "Load" and i.push_next)
            ins = insns[k]
            ins.push_next = 0
            self._saved = (base + k * INSN_BYTES, self.dram_read(base + k * INSN_BYTES, INSN_BYTES))
            self.dram_write(self._saved[0], ins.to_bytes())
        self.fired += 1

    def wait_irq(self, timeout_s):
        try:
            return super().wait_irq(timeout_s)
        finally:
            self.clear_faults()
            if self._saved is not None:           # the image itself is not damaged
                self.dram_write(*self._saved)
                self._saved = None

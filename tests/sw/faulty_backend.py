"""Test-only fault injection: a model backend that breaks one launch on purpose.

Not part of the package: the session has no fault-injection argument; tests hand it this
backend instead (``InferenceSession(..., backend=FaultyBackend(cfg, ...))``). Each fault is
a real condition of the device, as the model backend simulates it: a DRAM beat that
answers SLVERR (read or write), an illegal instruction word in the program, or a program
whose dependency tokens can never all be met (it never finishes).
"""

from dnnfab.hw.spec import INSN_BYTES, decode
from dnnfab.sw.driver.model import ModelBackend

FAULTS = ("dma_read", "dma_write", "illegal", "hang")


class FaultyBackend(ModelBackend):
    """Breaks launch number ``at`` (0-based, counting every START) with ``fault``."""

    def __init__(self, cfg, fault, at=0, **kw):
        super().__init__(cfg, **kw)
        assert fault in FAULTS
        self.fault, self.at = fault, at
        self.fired = 0

    def _start(self):
        n = self.launches
        if n != self.at:
            self.read_fault = self.write_fault = None
            return super()._start()
        v = self.values
        base, count = v["PROG_BASE"], v["PROG_LEN"]
        insns = [decode(int.from_bytes(self.fm.read(base + i * INSN_BYTES, INSN_BYTES), "little"))
                 for i in range(count)]
        saved = None
        if self.fault == "dma_read":
            # the first weight/activation load's source: its first beat fails
            ld = next(i for i in insns if type(i).__name__ == "Load")
            self.read_fault = ld.addr
        elif self.fault == "dma_write":
            st = next(i for i in insns if type(i).__name__ == "Store")
            self.write_fault = st.addr + self.cfg.bus_bytes
        elif self.fault == "illegal":
            k = count // 2
            saved = (base + k * INSN_BYTES, self.fm.read(base + k * INSN_BYTES, INSN_BYTES))
            self.fm.write(saved[0], bytes(INSN_BYTES))
        else:   # hang: drop the first push the first COMPUTE waits for
            k, ins = next((k, i) for k, i in enumerate(insns) if type(i).__name__ == "Load"
                          and i.push_next)
            ins.push_next = 0
            saved = (base + k * INSN_BYTES, self.fm.read(base + k * INSN_BYTES, INSN_BYTES))
            self.fm.write(saved[0], ins.to_bytes())
        self.fired += 1
        try:
            super()._start()
        finally:
            self.read_fault = self.write_fault = None
            if saved is not None:                 # the image itself is not damaged
                self.fm.write(*saved)

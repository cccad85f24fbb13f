"""Test top for the DMA: the DMA plus simple scratchpad memories and cycle bookkeeping.

The scratchpad is one memory of ``4 * sp_depth`` words addressed by ``{target, addr}``, so
a read into target ``t`` can be written back from source ``t``. The harness latches cycle
numbers at command acceptance and at the done pulses, and counts done pulses and beats,
so a cocotb bench measures exact cycle counts without sampling every cycle from Python.
"""

from amaranth.hdl import Module, Cat
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from ..hw.axi import axi4_signature
from ..hw.config import AcceleratorConfig
from ..hw.dma import DMA, desc_layout
from ..hw.scratchpad import Scratchpad

__all__ = ["DMAHarness"]


class DMAHarness(wiring.Component):
    """DMA + ``4 x sp_depth`` scratchpad words + counters (co-simulation only).

    Members
    -------
    m_axi : ``Out(axi4_signature(...))``
        The DMA's AXI4 master port.
    rd_cmd, wr_cmd : ``In(stream.Signature(desc_layout(cfg)))``
        Passed to the DMA.
    window_lo, window_hi, clear : ``In``
        Passed to the DMA.
    error, error_code, error_addr, busy, rd_done, wr_done : ``Out``
        From the DMA.
    cycle : ``Out(32)``
        Free-running cycle counter.
    rd_start, rd_end, wr_start, wr_end : ``Out(32)``
        ``cycle`` at the last read/write command acceptance and the last done pulse.
    rd_dones, wr_dones : ``Out(16)``
        Done pulses seen.
    rd_beats, wr_beats : ``Out(32)``
        ``rd_beat`` / ``wr_beat`` pulses seen.
    sp_writes : ``Out(32)``
        ``sp_we`` pulses seen.
    """

    def __init__(self, cfg: AcceleratorConfig, sp_depth=1024):
        self.cfg = cfg
        self.sp_depth = sp_depth
        layout = desc_layout(cfg)
        super().__init__({
            "m_axi": Out(axi4_signature(cfg.addr_bits, cfg.bus_bits, cfg.id_bits)),
            "rd_cmd": In(stream.Signature(layout)),
            "wr_cmd": In(stream.Signature(layout)),
            "window_lo": In(cfg.addr_bits),
            "window_hi": In(cfg.addr_bits),
            "clear": In(1),
            "error": Out(1),
            "error_code": Out(4),
            "error_addr": Out(cfg.addr_bits),
            "busy": Out(1),
            "rd_done": Out(1),
            "wr_done": Out(1),
            "cycle": Out(32),
            "rd_start": Out(32),
            "rd_end": Out(32),
            "wr_start": Out(32),
            "wr_end": Out(32),
            "rd_dones": Out(16),
            "wr_dones": Out(16),
            "rd_beats": Out(32),
            "wr_beats": Out(32),
            "sp_writes": Out(32),
        })

    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        dma = m.submodules.dma = DMA(cfg)
        wiring.connect(m, wiring.flipped(self.m_axi), dma.bus)
        wiring.connect(m, wiring.flipped(self.rd_cmd), dma.rd_cmd)
        wiring.connect(m, wiring.flipped(self.wr_cmd), dma.wr_cmd)
        m.d.comb += [
            dma.window_lo.eq(self.window_lo),
            dma.window_hi.eq(self.window_hi),
            dma.clear.eq(self.clear),
            self.error.eq(dma.error),
            self.error_code.eq(dma.error_code),
            self.error_addr.eq(dma.error_addr),
            self.busy.eq(dma.busy),
            self.rd_done.eq(dma.rd_done),
            self.wr_done.eq(dma.wr_done),
        ]

        abits = (self.sp_depth - 1).bit_length()
        # a scratchpad as in the accelerator (registered requests, SP_READ_LATENCY)
        sp = m.submodules.sp = Scratchpad(4 * self.sp_depth * cfg.bus_bytes, cfg.bus_bits, cfg.bus_bits)
        m.d.comb += [
            sp.w_en.eq(dma.sp_we),
            sp.w_addr.eq(Cat(dma.sp_waddr[:abits], dma.sp_wtarget)),
            sp.w_data.eq(dma.sp_wdata),
            sp.r_en.eq(dma.sp_re),
            sp.r_addr.eq(Cat(dma.sp_raddr[:abits], dma.sp_rsrc)),
            dma.sp_rdata.eq(sp.r_data),
        ]

        m.d.sync += self.cycle.eq(self.cycle + 1)
        with m.If(self.rd_cmd.valid & self.rd_cmd.ready):
            m.d.sync += self.rd_start.eq(self.cycle)
        with m.If(self.wr_cmd.valid & self.wr_cmd.ready):
            m.d.sync += self.wr_start.eq(self.cycle)
        with m.If(dma.rd_done):
            m.d.sync += [self.rd_end.eq(self.cycle), self.rd_dones.eq(self.rd_dones + 1)]
        with m.If(dma.wr_done):
            m.d.sync += [self.wr_end.eq(self.cycle), self.wr_dones.eq(self.wr_dones + 1)]
        with m.If(dma.rd_beat):
            m.d.sync += self.rd_beats.eq(self.rd_beats + 1)
        with m.If(dma.wr_beat):
            m.d.sync += self.wr_beats.eq(self.wr_beats + 1)
        with m.If(dma.sp_we):
            m.d.sync += self.sp_writes.eq(self.sp_writes + 1)
        return m

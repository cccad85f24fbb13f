"""AXI4 DMA between DRAM and the scratchpads: 3-D strided descriptors, bursts in flight.

A descriptor (:func:`desc_layout`, Python side :class:`Descriptor`) names ``n2`` planes of
``n1`` rows of ``len0`` bus beats each::

    for i2 in range(n2):                       # planes, stride2 bytes apart
        for i1 in range(n1):                   # rows, stride1 bytes apart
            for i0 in range(len0):             # beats, contiguous
                DRAM[addr + i2*stride2 + i1*stride1 + i0*bus_bytes]  <->  SP[sp_addr + beat]

The scratchpad side is dense: beat ``k`` of the command (in the order above) is scratchpad
word ``sp_addr + k``. The low ``log2(bus_bytes)`` bits of ``addr``, ``stride1`` and
``stride2`` are ignored (every access is a full, aligned bus word). Strides are unsigned
and address arithmetic wraps modulo ``2**addr_bits`` (reads; a wrapping write is outside
any window and rejected). A descriptor with ``len0``, ``n1`` or ``n2`` equal to 0 moves
nothing; its ``*_done`` pulse still comes, in order after the earlier commands.

Two independent engines, running concurrently:

* **Read** (``rd_cmd``, DRAM -> scratchpad): rows are cut into INCR bursts of at most
  ``cfg.max_burst`` beats that never cross a 4 KiB boundary; up to ``max_rd_bursts``
  bursts are in flight (one AXI ID, so data returns in order). A new AR issues every cycle
  while the in-flight budget allows, without waiting for data. ``rready`` is always high;
  each R beat appears on ``sp_we``/``sp_waddr``/``sp_wdata`` one cycle later.
* **Write** (``wr_cmd``, scratchpad -> DRAM): each command is first checked against the
  output window (five cycles, overlapped with the previous command's bursts); a command
  touching a byte outside ``[window_lo, window_hi)`` is rejected with error 5 and issues
  nothing. AWs run ahead of the data up to ``max_wr_bursts`` outstanding bursts; the
  scratchpad is read with credits so that no more than ``w_buffer`` words are in flight
  between ``sp_re`` and the W channel (``wvalid`` may stall freely). ``bready`` is always
  high.

Errors (codes in :mod:`dnnfab.hw.regmap`): an R beat with SLVERR/DECERR -> 1 (address of
that beat); a B response with SLVERR/DECERR -> 2 (start address of that burst); a write
outside the window -> 5 (the command's aligned start address). The first error is kept
(``error``, ``error_code``, ``error_addr``) until ``clear``. From the cycle after an
error both engines issue no new AR/AW (an AR/AW already presented stays valid until
accepted, as AXI requires), send the W data of every AW already issued, accept every
outstanding R and B, write nothing more to the scratchpads, emit no more ``*_done``
pulses and accept no command until ``clear`` and the drain are both complete.

Timing (no bus stalls; deterministic, see docs/dma_csr.md): a read command accepted in
cycle 0 presents its first AR in cycle 2 and ARs follow one per cycle; each R beat reaches
``sp_we`` one cycle later, so a contiguous read of N beats finishes (``rd_done``) in cycle
``N + 2 + L`` where L is the slave's AR-to-first-R latency (2 for cocotbext-axi's AxiRam).
A write command accepted in cycle 0 presents its first AW in cycle 7 (five cycles of window
check) and its first W beat in cycle 7 (scratchpad read + W buffer); a contiguous write of
N beats gets ``wr_done`` in cycle N + 12 against AxiRam (window check: five cycles). The next command of the same engine
is accepted once the burst generator has issued the previous command's last burst.
"""

from dataclasses import dataclass

from amaranth.hdl import Signal, Module, Const, Cat, Mux, Elaboratable, unsigned
from amaranth.lib import wiring, stream, data
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .axi import axi4_signature, BURST_INCR
from .config import AcceleratorConfig
from .regmap import ERR_AXI_READ, ERR_AXI_WRITE, ERR_OUT_WINDOW
from ..errors import ConfigError

__all__ = ["DMA", "desc_layout", "Descriptor", "TARGET_ACT", "TARGET_WGT", "TARGET_INSN",
           "TARGET_AUX", "TARGET_OUT"]

#: ``target`` of read descriptors (destination scratchpad).
TARGET_ACT, TARGET_WGT, TARGET_INSN, TARGET_AUX = 0, 1, 2, 3
#: ``target`` of write descriptors (source buffer).
TARGET_OUT = 0

_BOUNDARY = 4096        # AXI: a burst never crosses a 4 KiB boundary


def desc_layout(cfg: AcceleratorConfig):
    """Layout of one DMA descriptor (fields packed LSB first in this order)."""
    return data.StructLayout({
        "addr": unsigned(cfg.addr_bits),
        "len0": unsigned(16),
        "n1": unsigned(16),
        "stride1": unsigned(32),
        "n2": unsigned(16),
        "stride2": unsigned(32),
        "sp_addr": unsigned(16),
        "target": unsigned(2),
    })


def _addr_bits(cfg):
    if cfg is None:
        return 32
    if isinstance(cfg, int):
        return cfg
    return cfg.addr_bits


@dataclass(frozen=True)
class Descriptor:
    """Python twin of :func:`desc_layout` (used by tests and the program builder).

    ``addr``/``stride1``/``stride2`` are byte quantities, ``len0`` counts bus beats.
    """
    addr: int
    len0: int = 1
    n1: int = 1
    stride1: int = 0
    n2: int = 1
    stride2: int = 0
    sp_addr: int = 0
    target: int = 0

    @property
    def beats(self):
        """Bus beats moved (= scratchpad words touched)."""
        return self.len0 * self.n1 * self.n2

    @staticmethod
    def _widths(addr_bits):
        return [("addr", addr_bits), ("len0", 16), ("n1", 16), ("stride1", 32), ("n2", 16),
                ("stride2", 32), ("sp_addr", 16), ("target", 2)]

    def check(self, cfg: AcceleratorConfig):
        """Raise :class:`ConfigError` unless the descriptor is well formed for ``cfg``."""
        bb = cfg.bus_bytes
        for name, width in self._widths(cfg.addr_bits):
            v = getattr(self, name)
            if not 0 <= v < (1 << width):
                raise ConfigError(f"DMA descriptor {name}={v} does not fit {width} bits")
        for name in ("addr", "stride1", "stride2"):
            if getattr(self, name) % bb:
                raise ConfigError(f"DMA descriptor {name}={getattr(self, name):#x} is not a multiple "
                                  f"of the bus width ({bb} bytes); align the tensor in DRAM")
        for name in ("len0", "n1", "n2"):
            if getattr(self, name) < 1:
                raise ConfigError(f"DMA descriptor {name}=0 moves nothing; use >= 1")
        if self.sp_addr + self.beats > (1 << 16):
            raise ConfigError(f"DMA descriptor writes scratchpad words up to {self.sp_addr + self.beats - 1}, "
                              f"beyond the 16-bit scratchpad address")
        return self

    def pack(self, cfg=None) -> int:
        """The descriptor as an integer in :func:`desc_layout` (``cfg``: config or addr_bits)."""
        word, pos = 0, 0
        for name, width in self._widths(_addr_bits(cfg)):
            word |= (getattr(self, name) & ((1 << width) - 1)) << pos
            pos += width
        return word

    @classmethod
    def unpack(cls, word, cfg=None):
        vals, pos = {}, 0
        for name, width in cls._widths(_addr_bits(cfg)):
            vals[name] = (word >> pos) & ((1 << width) - 1)
            pos += width
        return cls(**vals)

    def rows(self, bus_bytes):
        """[(byte address, byte length)] of each row, in transfer order."""
        return [(self.addr + i2 * self.stride2 + i1 * self.stride1, self.len0 * bus_bytes)
                for i2 in range(self.n2) for i1 in range(self.n1)]

    def extent(self, bus_bytes):
        """(lowest byte, end byte) touched; the window check of writes uses exactly this."""
        if not self.beats:
            return (self.addr, self.addr)
        return (self.addr, self.addr + (self.n2 - 1) * self.stride2 + (self.n1 - 1) * self.stride1
                + self.len0 * bus_bytes)

    def bursts(self, cfg: AcceleratorConfig):
        """[(byte address, beats)] of the AXI bursts the DMA issues for this descriptor."""
        bb = cfg.bus_bytes
        out = []
        for addr, nbytes in self.rows(bb):
            rem = nbytes // bb
            addr %= 1 << cfg.addr_bits
            while rem:
                to4k = (_BOUNDARY - addr % _BOUNDARY) // bb
                n = min(rem, cfg.max_burst, to4k)
                out.append((addr, n))
                addr = (addr + n * bb) % (1 << cfg.addr_bits)
                rem -= n
        return out


class _BurstGen(Elaboratable):
    """Walks one descriptor and presents its bursts one by one (shared by both engines).

    ``start`` loads ``desc`` (the engine only starts it when ``active`` is low and the
    descriptor is non-empty). While ``active``, ``addr``/``blen``/``sp``/``target``/``last``
    describe the current burst; ``next`` consumes it. ``abort`` drops the rest.
    """

    def __init__(self, cfg: AcceleratorConfig):
        self.cfg = cfg
        self.start = Signal()
        self.desc = Signal(desc_layout(cfg))
        self.abort = Signal()
        self.next = Signal()
        self.active = Signal()
        self.addr = Signal(cfg.addr_bits)
        self.blen = Signal(range(cfg.max_burst + 1))
        self.sp = Signal(16)
        self.target = Signal(2)
        self.last = Signal()

    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        lb = (cfg.bus_bytes - 1).bit_length()
        ab = cfg.addr_bits

        def align(v, width):
            return Cat(Const(0, lb), v[lb:width])

        cur = Signal(ab)
        row_base = Signal(ab)
        plane_base = Signal(ab)
        rem = Signal(16)
        rows_left = Signal(16)
        planes_left = Signal(16)
        len0 = Signal(16)
        n1 = Signal(16)
        stride1 = Signal(32)
        stride2 = Signal(32)

        to4k = Signal(range(_BOUNDARY // cfg.bus_bytes + 1))
        b1 = Signal(range(cfg.max_burst + 1))
        m.d.comb += [
            to4k.eq((_BOUNDARY >> lb) - cur[lb:12]),
            b1.eq(Mux(rem < cfg.max_burst, rem, cfg.max_burst)),
            self.blen.eq(Mux(to4k < b1, to4k, b1)),
            self.addr.eq(cur),
        ]
        row_end = Signal()
        m.d.comb += [
            row_end.eq(rem == self.blen),
            self.last.eq(row_end & (rows_left == 1) & (planes_left == 1)),
        ]

        with m.If(self.start):
            d = self.desc
            a = align(d.addr, ab)
            m.d.sync += [
                self.active.eq(1),
                cur.eq(a), row_base.eq(a), plane_base.eq(a),
                rem.eq(d.len0), len0.eq(d.len0),
                rows_left.eq(d.n1), n1.eq(d.n1),
                planes_left.eq(d.n2),
                stride1.eq(align(d.stride1, 32)), stride2.eq(align(d.stride2, 32)),
                self.sp.eq(d.sp_addr), self.target.eq(d.target),
            ]
        with m.Elif(self.abort):
            m.d.sync += self.active.eq(0)
        with m.Elif(self.next & self.active):
            m.d.sync += self.sp.eq(self.sp + self.blen)
            with m.If(~row_end):
                m.d.sync += [cur.eq(cur + (self.blen << lb)), rem.eq(rem - self.blen)]
            with m.Elif(rows_left != 1):
                nrow = row_base + stride1
                m.d.sync += [row_base.eq(nrow), cur.eq(nrow), rem.eq(len0),
                             rows_left.eq(rows_left - 1)]
            with m.Elif(planes_left != 1):
                nplane = plane_base + stride2
                m.d.sync += [plane_base.eq(nplane), row_base.eq(nplane), cur.eq(nplane),
                             rem.eq(len0), rows_left.eq(n1), planes_left.eq(planes_left - 1)]
            with m.Else():
                m.d.sync += self.active.eq(0)
        return m


def _empty(desc):
    return (desc.len0 == 0) | (desc.n1 == 0) | (desc.n2 == 0)


class DMA(wiring.Component):
    """AXI4 master DMA: DRAM -> scratchpad reads and scratchpad -> DRAM writes.

    See the module docstring for descriptors, bursts, timing and error behaviour.

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``bus_bits``, ``addr_bits``, ``id_bits``, ``max_burst``.
    max_rd_bursts : int
        Read bursts in flight (AR issued, last R beat not yet received).
    max_wr_bursts : int
        Write bursts in flight (AW issued, B not yet received).
    w_buffer : int
        Words of write data buffered between the scratchpad read port and the W channel
        (>= 4 sustains one beat per cycle).

    Members
    -------
    bus : ``Out(axi4_signature(addr_bits, bus_bits, id_bits))``
        AXI4 master. IDs are always 0; bursts INCR, full width; ``wstrb`` all ones.
    rd_cmd : ``In(stream.Signature(desc_layout))``
        Read commands (DRAM -> scratchpad ``target``: 0 act, 1 weights, 2 instructions, 3 aux).
    wr_cmd : ``In(stream.Signature(desc_layout))``
        Write commands (scratchpad ``target`` -> DRAM; 0 = output buffer).
    sp_we, sp_waddr, sp_wdata, sp_wtarget : ``Out(1)``, ``Out(16)``, ``Out(bus_bits)``, ``Out(2)``
        Scratchpad write port of the read engine; no backpressure.
    sp_re, sp_raddr, sp_rsrc : ``Out(1)``, ``Out(16)``, ``Out(2)``
        Scratchpad read request of the write engine ...
    sp_rdata : ``In(bus_bits)``
        ... whose data must be valid exactly one cycle after ``sp_re``.
    rd_done : ``Out(1)``
        One-cycle pulse with the ``sp_we`` of a read command's last beat.
    wr_done : ``Out(1)``
        One-cycle pulse the cycle after a write command's last B response.
    window_lo, window_hi : ``In(addr_bits)``
        Writes must stay inside ``[window_lo, window_hi)``.
    error : ``Out(1)``
        Sticky error flag, with ``error_code : Out(4)`` and ``error_addr : Out(addr_bits)``.
    clear : ``In(1)``
        Clears ``error``/``error_code``/``error_addr``.
    busy : ``Out(1)``
        A command is queued, bursts are in flight, or a done pulse is being emitted.
    rd_beat, wr_beat : ``Out(1)``
        One pulse per R / W data beat that crossed the bus (registered: one cycle later).
    """

    def __init__(self, config: AcceleratorConfig, max_rd_bursts=8, max_wr_bursts=8, w_buffer=8):
        if w_buffer < 2:
            raise ConfigError("DMA w_buffer must be at least 2 words")
        self.config = config
        self.max_rd_bursts = max_rd_bursts
        self.max_wr_bursts = max_wr_bursts
        self.w_buffer = w_buffer
        cfg = config
        layout = desc_layout(cfg)
        super().__init__({
            "bus": Out(axi4_signature(cfg.addr_bits, cfg.bus_bits, cfg.id_bits)),
            "rd_cmd": In(stream.Signature(layout)),
            "wr_cmd": In(stream.Signature(layout)),
            "sp_we": Out(1),
            "sp_waddr": Out(16),
            "sp_wdata": Out(cfg.bus_bits),
            "sp_wtarget": Out(2),
            "sp_re": Out(1),
            "sp_raddr": Out(16),
            "sp_rsrc": Out(2),
            "sp_rdata": In(cfg.bus_bits),
            "rd_done": Out(1),
            "wr_done": Out(1),
            "window_lo": In(cfg.addr_bits),
            "window_hi": In(cfg.addr_bits),
            "error": Out(1),
            "error_code": Out(4),
            "error_addr": Out(cfg.addr_bits),
            "clear": In(1),
            "busy": Out(1),
            "rd_beat": Out(1),
            "wr_beat": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        bus = self.bus
        lb = (cfg.bus_bytes - 1).bit_length()
        ab = cfg.addr_bits
        error = self.error

        # ================================================================ read engine
        agr = m.submodules.rd_bursts = _BurstGen(cfg)
        rinfo_layout = data.StructLayout({"addr": unsigned(ab), "sp": unsigned(16),
                                          "target": unsigned(2), "last": unsigned(1)})
        rinfo = m.submodules.rd_inflight = SyncFIFO(width=rinfo_layout.size, depth=self.max_rd_bursts)
        rd_kill = Signal()          # draining after an error: suppress writes and done pulses
        rd_kill_r = Signal()
        rd_empty_wait = Signal()    # an empty command waits for the earlier ones to finish
        m.d.comb += rd_kill.eq(error | rd_kill_r)

        m.d.comb += self.rd_cmd.ready.eq(~agr.active & ~rd_empty_wait & ~rd_kill)
        with m.If(self.rd_cmd.valid & self.rd_cmd.ready):
            with m.If(_empty(self.rd_cmd.p)):
                m.d.sync += rd_empty_wait.eq(1)
            with m.Else():
                m.d.comb += [agr.start.eq(1), agr.desc.eq(self.rd_cmd.p)]

        # AR channel: one burst per cycle while the in-flight budget allows
        ar_load = Signal()
        m.d.comb += [
            ar_load.eq(agr.active & ~error & rinfo.w_rdy & (~bus.arvalid | bus.arready)),
            agr.next.eq(ar_load),
            agr.abort.eq(error),
            bus.arid.eq(0),
            bus.arsize.eq(lb),
            bus.arburst.eq(BURST_INCR),
        ]
        rinfo_in = Signal(rinfo_layout)
        m.d.comb += [
            rinfo_in.addr.eq(agr.addr), rinfo_in.sp.eq(agr.sp), rinfo_in.target.eq(agr.target),
            rinfo_in.last.eq(agr.last),
            rinfo.w_data.eq(rinfo_in.as_value()),
            rinfo.w_en.eq(ar_load),
        ]
        with m.If(ar_load):
            m.d.sync += [bus.arvalid.eq(1), bus.araddr.eq(agr.addr), bus.arlen.eq(agr.blen - 1)]
        with m.Elif(bus.arready):
            m.d.sync += bus.arvalid.eq(0)

        # R channel: always ready; one scratchpad write per beat, one cycle later
        rhead = data.View(rinfo_layout, rinfo.r_data)
        roff = Signal(range(max(cfg.max_burst, 2)))
        r_beat = Signal()
        r_bad = Signal()
        m.d.comb += [
            bus.rready.eq(1),
            r_beat.eq(bus.rvalid & rinfo.r_rdy),
            r_bad.eq(r_beat & bus.rresp[1]),
        ]
        with m.If(r_beat):
            with m.If(bus.rlast):
                m.d.sync += roff.eq(0)
                m.d.comb += rinfo.r_en.eq(1)
            with m.Else():
                m.d.sync += roff.eq(roff + 1)
        m.d.sync += [
            self.sp_we.eq(r_beat & ~r_bad & ~rd_kill),
            self.sp_waddr.eq(rhead.sp + roff),
            self.sp_wdata.eq(bus.rdata),
            self.sp_wtarget.eq(rhead.target),
            self.rd_beat.eq(bus.rvalid & bus.rready),
            self.rd_done.eq(r_beat & bus.rlast & rhead.last & ~r_bad & ~rd_kill),
        ]
        with m.If(rd_empty_wait & (error | ~rinfo.r_rdy)):
            m.d.sync += rd_empty_wait.eq(0)
            with m.If(~rd_kill):
                m.d.sync += self.rd_done.eq(1)
        with m.If(error):
            m.d.sync += rd_kill_r.eq(1)
        with m.Elif(~rinfo.r_rdy):
            m.d.sync += rd_kill_r.eq(0)
        rd_err_addr = Signal(ab)
        m.d.comb += rd_err_addr.eq(rhead.addr + (roff << lb))
        rd_busy = Signal()
        m.d.comb += rd_busy.eq(agr.active | bus.arvalid | rinfo.r_rdy | rd_empty_wait | self.sp_we
                              | self.rd_done)

        # =============================================================== write engine
        agw = m.submodules.wr_bursts = _BurstGen(cfg)
        # -- intake and window check (five cycles, overlapped with the running command)
        wdesc = Signal(desc_layout(cfg))
        ext1 = Signal(48)
        ext2 = Signal(48)
        ext1_lo = Signal(32); ext1_hi = Signal(32); ext2_lo = Signal(32); ext2_hi = Signal(32)
        rowbytes = Signal(16 + lb)
        w_empty = Signal()
        wr_kill = Signal()
        wr_kill_r = Signal()
        win_bad = Signal()
        m.d.comb += wr_kill.eq(error | wr_kill_r)
        wb_end = Signal(ab + 50)            # registered in SUM, compared in CMP (Fmax)
        bfifo_layout = data.StructLayout({"addr": unsigned(ab), "last": unsigned(1)})
        bfifo = m.submodules.wr_inflight = SyncFIFO(width=bfifo_layout.size, depth=self.max_wr_bursts)
        wb_layout = data.StructLayout({"sp": unsigned(16), "blen": range(cfg.max_burst + 1),
                                       "target": unsigned(2)})
        wbq = m.submodules.wr_bursts_q = SyncFIFO(width=wb_layout.size, depth=self.max_wr_bursts)
        wfifo = m.submodules.wr_data = SyncFIFOBuffered(width=cfg.bus_bits + 1, depth=self.w_buffer)
        pending = Signal(range(self.w_buffer + 1))
        w_idle = Signal()
        m.d.comb += w_idle.eq(~agw.active & ~bfifo.r_rdy & ~wbq.r_rdy & (pending == 0))
        win_err = Signal()
        w_empty_done = Signal()     # an empty command completes (nothing in flight)

        with m.FSM(name="wr_intake") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.wr_cmd.ready.eq(~wr_kill)
                with m.If(self.wr_cmd.valid & ~wr_kill):
                    p = self.wr_cmd.p
                    m.d.sync += [
                        wdesc.eq(p),
                        wdesc.addr.eq(Cat(Const(0, lb), p.addr[lb:])),
                        wdesc.stride1.eq(Cat(Const(0, lb), p.stride1[lb:])),
                        wdesc.stride2.eq(Cat(Const(0, lb), p.stride2[lb:])),
                    ]
                    m.next = "MUL"
            with m.State("MUL"):
                # 16 x 32 products as two registered 16 x 16 halves (one DSP each), summed in
                # the next state: keeps the window check off the critical path
                m.d.sync += [
                    ext1_lo.eq((wdesc.n1 - 1)[:16] * wdesc.stride1[:16]),
                    ext1_hi.eq((wdesc.n1 - 1)[:16] * wdesc.stride1[16:32]),
                    ext2_lo.eq((wdesc.n2 - 1)[:16] * wdesc.stride2[:16]),
                    ext2_hi.eq((wdesc.n2 - 1)[:16] * wdesc.stride2[16:32]),
                    rowbytes.eq(wdesc.len0 << lb),
                    w_empty.eq(_empty(wdesc)),
                ]
                m.next = "MUL2"
            with m.State("MUL2"):
                m.d.sync += [
                    ext1.eq(ext1_lo + (ext1_hi << 16)),
                    ext2.eq(ext2_lo + (ext2_hi << 16)),
                ]
                m.next = "SUM"
            with m.State("SUM"):
                m.d.sync += wb_end.eq(wdesc.addr + ext1 + ext2 + rowbytes)
                m.next = "CMP"
            with m.State("CMP"):
                m.d.sync += win_bad.eq((wdesc.addr < self.window_lo) | (wb_end > self.window_hi))
                m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(error):
                    m.next = "IDLE"
                with m.Elif(w_empty):
                    m.next = "EMPTY"
                with m.Elif(win_bad):
                    m.d.comb += win_err.eq(1)
                    m.next = "IDLE"
                with m.Elif(~agw.active):
                    m.d.comb += [agw.start.eq(1), agw.desc.eq(wdesc)]
                    m.next = "IDLE"
                with m.Else():
                    m.next = "START"
            with m.State("START"):
                with m.If(error):
                    m.next = "IDLE"
                with m.Elif(~agw.active):
                    m.d.comb += [agw.start.eq(1), agw.desc.eq(wdesc)]
                    m.next = "IDLE"
            with m.State("EMPTY"):
                with m.If(error):
                    m.next = "IDLE"
                with m.Elif(~agw.active & ~bfifo.r_rdy):
                    m.d.comb += w_empty_done.eq(1)
                    m.next = "IDLE"

        # -- AW channel
        aw_load = Signal()
        m.d.comb += [
            aw_load.eq(agw.active & ~error & bfifo.w_rdy & wbq.w_rdy & (~bus.awvalid | bus.awready)),
            agw.next.eq(aw_load),
            agw.abort.eq(error),
            bus.awid.eq(0),
            bus.awsize.eq(lb),
            bus.awburst.eq(BURST_INCR),
        ]
        bfifo_in = Signal(bfifo_layout)
        wb_in = Signal(wb_layout)
        m.d.comb += [
            bfifo_in.addr.eq(agw.addr), bfifo_in.last.eq(agw.last),
            bfifo.w_data.eq(bfifo_in.as_value()), bfifo.w_en.eq(aw_load),
            wb_in.sp.eq(agw.sp), wb_in.blen.eq(agw.blen), wb_in.target.eq(agw.target),
            wbq.w_data.eq(wb_in.as_value()), wbq.w_en.eq(aw_load),
        ]
        with m.If(aw_load):
            m.d.sync += [bus.awvalid.eq(1), bus.awaddr.eq(agw.addr), bus.awlen.eq(agw.blen - 1)]
        with m.Elif(bus.awready):
            m.d.sync += bus.awvalid.eq(0)

        # -- scratchpad reads with credits, into the W buffer
        whead = data.View(wb_layout, wbq.r_data)
        woff = Signal(range(max(cfg.max_burst, 2)))
        w_lastbeat = Signal()
        sp_issue = Signal()
        m.d.comb += [
            w_lastbeat.eq(woff == whead.blen - 1),
            sp_issue.eq(wbq.r_rdy & (pending < self.w_buffer)),
            self.sp_re.eq(sp_issue),
            self.sp_raddr.eq(whead.sp + woff),
            self.sp_rsrc.eq(whead.target),
        ]
        with m.If(sp_issue):
            with m.If(w_lastbeat):
                m.d.sync += woff.eq(0)
                m.d.comb += wbq.r_en.eq(1)
            with m.Else():
                m.d.sync += woff.eq(woff + 1)
        re_d = Signal()
        last_d = Signal()
        m.d.sync += [re_d.eq(sp_issue), last_d.eq(w_lastbeat)]
        w_beat = Signal()
        m.d.comb += [
            wfifo.w_en.eq(re_d),
            wfifo.w_data.eq(Cat(self.sp_rdata, last_d)),
            bus.wvalid.eq(wfifo.r_rdy),
            bus.wdata.eq(wfifo.r_data[:cfg.bus_bits]),
            bus.wlast.eq(wfifo.r_data[cfg.bus_bits]),
            bus.wstrb.eq(Const((1 << cfg.bus_bytes) - 1, cfg.bus_bytes)),
            wfifo.r_en.eq(bus.wready),
            w_beat.eq(bus.wvalid & bus.wready),
        ]
        m.d.sync += [pending.eq(pending + sp_issue - w_beat), self.wr_beat.eq(w_beat)]

        # -- B channel
        bhead = data.View(bfifo_layout, bfifo.r_data)
        b_beat = Signal()
        b_bad = Signal()
        m.d.comb += [
            bus.bready.eq(1),
            b_beat.eq(bus.bvalid & bfifo.r_rdy),
            b_bad.eq(b_beat & bus.bresp[1]),
            bfifo.r_en.eq(b_beat),
        ]
        m.d.sync += self.wr_done.eq((b_beat & bhead.last & ~b_bad & ~wr_kill) | w_empty_done)
        with m.If(error):
            m.d.sync += wr_kill_r.eq(1)
        with m.Elif(w_idle):
            m.d.sync += wr_kill_r.eq(0)
        wr_busy = Signal()
        m.d.comb += wr_busy.eq(~fsm.ongoing("IDLE") | ~w_idle | bus.awvalid | self.wr_done)

        # ===================================================================== errors
        ev = Signal()
        ev_code = Signal(4)
        ev_addr = Signal(ab)
        with m.If(r_bad):
            m.d.comb += [ev.eq(1), ev_code.eq(ERR_AXI_READ), ev_addr.eq(rd_err_addr)]
        with m.Elif(b_bad):
            m.d.comb += [ev.eq(1), ev_code.eq(ERR_AXI_WRITE), ev_addr.eq(bhead.addr)]
        with m.Elif(win_err):
            m.d.comb += [ev.eq(1), ev_code.eq(ERR_OUT_WINDOW), ev_addr.eq(wdesc.addr)]
        with m.If(ev & (~error | self.clear)):
            m.d.sync += [error.eq(1), self.error_code.eq(ev_code), self.error_addr.eq(ev_addr)]
        with m.Elif(self.clear):
            m.d.sync += [error.eq(0), self.error_code.eq(0), self.error_addr.eq(0)]

        m.d.comb += self.busy.eq(rd_busy | wr_busy)
        return m

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
  output window (four cycles when ``n1``, ``n2`` <= 1; the ``(n - 1) * stride`` extents are
  multiplied by shift-and-add, one cycle per bit of ``max(n1 - 1, n2 - 1)`` plus two;
  overlapped with the previous command's bursts); a command
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
A write command with ``n1``, ``n2`` <= 1 accepted in cycle 0 presents its first AW in cycle 6
(four cycles of window check, one to start the burst generator) and its first W beat in
cycle 9 (burst queue, beat issue register, scratchpad read, W buffer); a contiguous write of
N beats gets ``wr_done`` in cycle N + 15 against AxiRam. The next command of the same
engine is accepted once the burst generator has issued the previous command's last burst.

Fmax: the burst generators, FIFO flags, credit and error paths are built so that every
register is at most one carry chain and a few gates from other registers (see
:class:`_BurstGen`, :class:`RegFIFO`); the multiplications of the window check use no DSP.
"""

from dataclasses import dataclass

from amaranth.hdl import Signal, Module, Const, Cat, Mux, Elaboratable, unsigned, signed
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory

from .axi import axi4_signature, BURST_INCR
from .config import AcceleratorConfig
from .spec import (ERR_AXI_READ, ERR_AXI_WRITE, ERR_OUT_WINDOW, SP_READ_LATENCY, TARGET_ACT, TARGET_WGT,
                   TARGET_INSN, TARGET_AUX, TARGET_OUT)
from .pe import dreg
from ..errors import ConfigError

__all__ = ["DMA", "desc_layout", "Descriptor", "TARGET_ACT", "TARGET_WGT", "TARGET_INSN",
           "TARGET_AUX", "TARGET_OUT"]

# ``target`` of read descriptors (destination scratchpad) and of write descriptors
# (source buffer, TARGET_OUT): hw/spec.py

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


def thermometer(m, name, n, up, down):
    """A count of ``0..n`` as an ``n``-bit thermometer code (bit ``i``: count > ``i``),
    stepped by ``up`` and ``down`` (both: unchanged). Each bit's next value is one gate
    after the two; compares with constants are single bits (``t[k]``: count > ``k``).
    Proved equal to a saturating count: tests/hw/test_retimed.py::test_thermometer_exhaustive."""
    t = Signal(n, name=name)
    for i in range(n):
        below = t[i - 1] if i else Const(1)
        above = t[i + 1] if i + 1 < n else Const(0)
        m.d.sync += t[i].eq(Mux(up & ~down, below, Mux(down & ~up, above, t[i])))
    return t


class RegFIFO(Elaboratable):
    """First-word-fall-through FIFO whose ``r_rdy``/``w_rdy`` are registers (Fmax).

    The fill level is kept as a thermometer code (bit ``i``: more than ``i`` entries), so
    the flags are its end bits and each bit's update is one gate after ``w_en``/``r_en``.
    With ``late_write``, a write is stored one cycle after ``w_en`` (so a wide RAM write
    enable is a register): ``w_data`` must still hold the value in the cycle after ``w_en``,
    and the entry is readable (``r_rdy``) one cycle later than in a plain FIFO. The head
    (``r_data``) is an asynchronous read of distributed RAM. ``r_en`` / ``w_en`` only with
    ``r_rdy`` / ``w_rdy``. Proved equal to a plain FIFO on every reachable state:
    tests/hw/test_retimed.py::test_regfifo_exhaustive.
    """

    def __init__(self, width, depth, late_write=True):
        assert depth >= 2
        self.width, self.depth, self.late_write = width, depth, late_write
        self.w_en = Signal()
        self.w_data = Signal(width)
        self.w_rdy = Signal()
        self.r_en = Signal()
        self.r_data = Signal(width)
        self.r_rdy = Signal()
        self.we_d = Signal()                       # one entry being stored (late_write)

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        ab = (n - 1).bit_length()
        storage = m.submodules.storage = Memory(shape=self.width, depth=n, init=[])
        wp = storage.write_port()
        rp = storage.read_port(domain="comb")
        produce = Signal(ab)
        consume = Signal(ab)
        we_d = self.we_d
        m.d.comb += [
            wp.addr.eq(produce), wp.data.eq(self.w_data), wp.en.eq(we_d),
            rp.addr.eq(consume), self.r_data.eq(rp.data),
        ]

        def incr(v):
            return v + 1 if n & (n - 1) == 0 else Mux(v == n - 1, 0, v + 1)
        with m.If(we_d):
            m.d.sync += produce.eq(incr(produce))
        with m.If(self.r_en):
            m.d.sync += consume.eq(incr(consume))
        if self.late_write:
            m.d.sync += we_d.eq(self.w_en)
        else:
            m.d.comb += we_d.eq(self.w_en)

        stored = thermometer(m, "stored", n, we_d, self.r_en)
        m.d.comb += self.r_rdy.eq(stored[0])
        if self.late_write:
            # entries stored or being stored
            occupied = thermometer(m, "occupied", n, self.w_en, self.r_en)
        else:
            occupied = stored
        m.d.comb += self.w_rdy.eq(~occupied[n - 1])
        return m


class _BurstGen(Elaboratable):
    """Walks one descriptor and presents its bursts one by one (shared by both engines).

    ``start`` loads ``init`` (the state of the descriptor's first burst, from
    :meth:`initial`; the engine only starts it when ``active`` is low and the descriptor is
    non-empty). While ``active``, ``addr``/``blen``/``sp``/``target``/``last`` describe the
    current burst; ``next`` consumes it (only while ``active``). ``abort`` drops the rest
    (it wins over ``next``).

    Fmax: no comparison sits between the state and its next value. The current burst is
    ``blen = min(rem, max_burst, to4k)`` (``to4k``: beats to the next 4 KiB boundary); the
    three comparisons it needs are the signs of registered differences
    ``dm = rem - MB - 1``, ``hm = rem - to4k - 1``, ``em = to4k - MB - 1``, and every next
    value (within a row: minus ``MB`` or minus ``to4k``; at a new row: from the row's 4 KiB
    offset) is one addition from registers. The next row's address (``nrow``, in whichever
    plane) and the first row of the plane after it (``npn``) are kept ready, so a new row can
    start every cycle. (Each of these against its plain definition, every cycle, in the
    DMA: tests/hw/test_retimed_dma.py.)
    """

    def __init__(self, cfg: AcceleratorConfig):
        self.cfg = cfg
        self.lb = (cfg.bus_bytes - 1).bit_length()
        self.P = _BOUNDARY >> self.lb           # beats per 4 KiB page
        ab = cfg.addr_bits
        self.state_layout = data.StructLayout({
            "cur": unsigned(ab), "rem": unsigned(16), "to4k": range(self.P + 1),
            "dm": signed(18),           # rem - MB - 1
            "hm": signed(18),           # rem - to4k - 1
            "em": signed(12),           # to4k - MB - 1
            "kd": signed(18),           # len0 - MB - 1
            "kh": signed(18),           # len0 - 1 - P
            "len0": unsigned(16), "n1": unsigned(16), "n1_one": unsigned(1), "n1_two": unsigned(1),
            "stride1": unsigned(32), "stride2": unsigned(32),
            "nrow": unsigned(ab),       # the row after this one (in any plane)
            "npn": unsigned(ab),        # first row of the plane after nrow's
            "rows_left": unsigned(16),  # rows of this plane, the current one included
            "rows_last": unsigned(1),   # rows_left == 1
            "rows_two": unsigned(1),    # rows_left == 2
            "nrl": unsigned(1),         # the next row is its plane's last
            "planes_left": unsigned(16),
            "planes_last": unsigned(1),  # planes_left == 1
            "sp": unsigned(16), "target": unsigned(2),
        })
        self.start = Signal()
        self.init = dreg(self.state_layout)
        self.abort = Signal()
        self.next = Signal()
        self.active = Signal()
        self.addr = Signal(ab)
        self.blen = Signal(range(cfg.max_burst + 1))
        self.blen_m1 = Signal(range(cfg.max_burst))     # blen - 1
        self.blen_one = Signal()                        # blen == 1
        self.sp = Signal(16)
        self.target = Signal(2)
        self.last = Signal()

    def _off(self, a):                          # beat offset of an address in its page
        return a[self.lb:self.lb + self.P.bit_length() - 1]

    def initial(self, d, n1_one=None, n1_two=None, n2_one=None):
        """``[(field, value)]`` of the state for descriptor ``d``'s first burst (the flags
        ``d.n1 == 1``, ``d.n1 == 2``, ``d.n2 == 1`` may be given, computed earlier)."""
        cfg, lb, P, MB = self.cfg, self.lb, self.P, self.cfg.max_burst
        ab = cfg.addr_bits

        def align(v, width):
            return Cat(Const(0, lb), v[lb:width])
        a = align(d.addr, ab)
        s1 = align(d.stride1, 32)
        s2 = align(d.stride2, 32)
        o = self._off(a)
        n1_one = d.n1 == 1 if n1_one is None else n1_one
        n1_two = d.n1 == 2 if n1_two is None else n1_two
        n2_one = d.n2 == 1 if n2_one is None else n2_one
        return [
            ("cur", a), ("rem", d.len0), ("to4k", P - o),
            ("dm", d.len0 - (MB + 1)), ("hm", d.len0 + o - (P + 1)), ("em", (P - MB - 1) - o),
            ("kd", d.len0 - (MB + 1)), ("kh", d.len0 - (P + 1)),
            ("len0", d.len0), ("n1", d.n1), ("n1_one", n1_one), ("n1_two", n1_two),
            ("stride1", s1), ("stride2", s2),
            ("nrow", Mux(n1_one, a + s2, a + s1)), ("npn", Mux(n1_one, a + (s2 << 1), a + s2)),
            ("rows_left", d.n1), ("rows_last", n1_one), ("rows_two", n1_two),
            ("nrl", n1_one | n1_two),
            ("planes_left", d.n2), ("planes_last", n2_one),
            ("sp", d.sp_addr), ("target", d.target),
        ]

    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        lb, P, MB = self.lb, self.P, cfg.max_burst
        ab = cfg.addr_bits
        off = self._off

        class _State:       # one named register per field (readable netlists)
            pass
        st = _State()
        for name, field in self.state_layout:
            setattr(st, name, dreg(field.shape, name=name))   # (``active`` is the control bit)
        cur, rem, to4k, dm, hm, em = st.cur, st.rem, st.to4k, st.dm, st.hm, st.em
        kd, kh, len0, n1, n1_one, n1_two = st.kd, st.kh, st.len0, st.n1, st.n1_one, st.n1_two
        stride1, stride2, nrow, npn = st.stride1, st.stride2, st.nrow, st.npn
        rows_left, rows_last, rows_two, nrl = st.rows_left, st.rows_last, st.rows_two, st.nrl
        planes_left, planes_last = st.planes_left, st.planes_last

        # ``blen - 1`` and ``blen == 1`` candidates as registers (``blen_m1`` needs only
        # its low bits: a burst is at most MB beats): ``rem_m1`` = (rem - 1) mod 2^w,
        # ``rem_one`` = rem == 1, ``to4k_m1``, ``to4k_one`` likewise; each next value is a
        # registered difference above (``rem - MB - 1`` = ``dm``, ``rem - to4k - 1`` =
        # ``hm``, ``to4k - MB - 1`` = ``em``) or a row's constant. They fed the write
        # burst queue through a compare and two selects (6.97 ns at 150 MHz). Each is used
        # only when its value is the burst length (``rem`` when ``row_end``, ``to4k`` when
        # ``page_end``), i.e. at most MB <= 2^w: the low ``w`` bits decide, so the flags
        # compare ``w`` bits, not 16-18 (the wider compares were 6.93 ns on a placement).
        bw = len(self.blen_m1)
        rem_m1, to4k_m1, len0_m1 = Signal(bw), Signal(bw), Signal(bw)
        rem_one, to4k_one, len0_one = Signal(), Signal(), Signal()
        row_end = Signal()
        page_end = Signal()                     # not row_end: the burst runs to the 4 KiB boundary
        m.d.comb += [
            row_end.eq(dm[-1] & hm[-1]),
            page_end.eq(em[-1]),
            self.blen.eq(Mux(row_end, rem, Mux(page_end, to4k, MB))),
            # (registered candidates, selected by the flags: no carry chain or compare here)
            self.blen_m1.eq(Mux(row_end, rem_m1, Mux(page_end, to4k_m1, MB - 1))),
            self.blen_one.eq(Mux(row_end, rem_one, Mux(page_end, to4k_one, MB == 1))),
            self.addr.eq(cur),
            self.sp.eq(st.sp),
            self.target.eq(st.target),
            self.last.eq(row_end & rows_last & planes_last),
        ]

        # next state if the current burst is consumed: selected by registered flags only
        # the page offset of nrow, inverted, in registers of its own (the three chains of a
        # row start do not load nrow's bits, which also feed its own adder)
        nrow_offn = Signal(len(off(nrow)))
        no = ~nrow_offn
        n_cur, n_rem, n_to4k = Signal(ab), Signal(16), Signal(range(P + 1))
        n_dm, n_hm, n_em = Signal(signed(18)), Signal(signed(18)), Signal(signed(12))
        n_rem_m1, n_to4k_m1 = Signal(bw), Signal(bw)
        n_rem_one, n_to4k_one = Signal(), Signal()
        with m.If(~row_end & page_end):
            # to the 4 KiB boundary: the rest of the row starts a page
            m.d.comb += [
                n_cur.eq(Cat(Const(0, 12), cur[12:] + 1)),
                n_rem.eq(rem - to4k), n_to4k.eq(P),
                n_dm.eq(hm - MB), n_hm.eq(hm - P), n_em.eq(P - MB - 1),
                n_rem_m1.eq(hm[:bw]), n_rem_one.eq(hm[:bw] == 0),
                n_to4k_m1.eq((P - 1) % (1 << bw)), n_to4k_one.eq(P == 1),
            ]
        with m.Elif(~row_end):
            m.d.comb += [
                n_cur.eq(cur + (MB << lb)),
                n_rem.eq(rem - MB), n_to4k.eq(to4k - MB),
                n_dm.eq(dm - MB), n_hm.eq(hm), n_em.eq(em - MB),
                n_rem_m1.eq(dm[:bw]), n_rem_one.eq(dm[:bw] == 0),
                n_to4k_m1.eq(em[:bw]), n_to4k_one.eq(em[:bw] == 0),
            ]
        with m.Else():
            m.d.comb += [
                n_cur.eq(nrow), n_rem.eq(len0), n_to4k.eq(P - no),
                n_dm.eq(kd), n_hm.eq(kh + no), n_em.eq((P - MB - 1) - no),
                n_rem_m1.eq(len0_m1), n_rem_one.eq(len0_one),
                n_to4k_m1.eq(((P - 1) - no)[:bw]), n_to4k_one.eq(no == P - 1),
            ]
        # at a new row: the flags of the row it opens (``nrl`` is registered ahead)
        n_rows_two = Signal()
        m.d.comb += n_rows_two.eq(Mux(rows_last, n1_two, rows_left == 3))

        # While idle the initial state loads every cycle (kept with ``start``, which sets
        # ``active``): the enables do not wait for the command handshake, and the registered
        # ``active`` selects between the initial and the next values.
        act = self.active
        ini = self.init
        upd = Signal()
        new_row = Signal()                      # the burst after this one opens a row
        new_plane = Signal()                    # ... and a plane
        m.d.comb += [
            upd.eq(~act | self.next),
            new_row.eq(~act | row_end),
            new_plane.eq(~act | (row_end & rows_last)),
        ]
        n_nrow_v = Signal(ab)
        m.d.comb += n_nrow_v.eq(Mux(act, Mux(nrl, npn, nrow + stride1), ini.nrow))
        with m.If(upd):
            m.d.sync += [
                cur.eq(Mux(act, n_cur, ini.cur)),
                rem.eq(Mux(act, n_rem, ini.rem)),
                to4k.eq(Mux(act, n_to4k, ini.to4k)),
                dm.eq(Mux(act, n_dm, ini.dm)),
                hm.eq(Mux(act, n_hm, ini.hm)),
                em.eq(Mux(act, n_em, ini.em)),
                rem_m1.eq(Mux(act, n_rem_m1, (ini.rem - 1)[:bw])),
                rem_one.eq(Mux(act, n_rem_one, ini.rem[:bw] == 1)),
                to4k_m1.eq(Mux(act, n_to4k_m1, (ini.to4k - 1)[:bw])),
                to4k_one.eq(Mux(act, n_to4k_one, ini.to4k[:bw] == 1)),
                # (three adders, selected after: the flags do not wait for a carry chain)
                st.sp.eq(Mux(act, Mux(row_end, st.sp + rem,
                                      Mux(page_end, st.sp + to4k, st.sp + MB)), ini.sp)),
            ]
            with m.If(new_row):
                m.d.sync += [
                    # the row opened is its plane's last: the row after it opens the next plane
                    nrow.eq(n_nrow_v),
                    nrow_offn.eq(~off(n_nrow_v)),
                    npn.eq(Mux(act, Mux(nrl, npn + stride2, npn), ini.npn)),
                    rows_left.eq(Mux(act, Mux(rows_last, n1, rows_left - 1), ini.rows_left)),
                    rows_last.eq(Mux(act, nrl, ini.rows_last)),
                    rows_two.eq(Mux(act, n_rows_two, ini.rows_two)),
                    # the row after the one opened is its plane's last
                    nrl.eq(Mux(act, Mux(nrl, n1_one, n_rows_two), ini.nrl)),
                ]
            with m.If(new_plane):
                m.d.sync += [
                    planes_left.eq(Mux(act, planes_left - 1, ini.planes_left)),
                    planes_last.eq(Mux(act, planes_left == 2, ini.planes_last)),
                ]
        with m.If(~act):
            m.d.sync += [
                kd.eq(ini.kd), kh.eq(ini.kh), len0.eq(ini.len0), n1.eq(ini.n1),
                len0_m1.eq((ini.len0 - 1)[:bw]), len0_one.eq(ini.len0[:bw] == 1),
                n1_one.eq(ini.n1_one), n1_two.eq(ini.n1_two),
                stride1.eq(ini.stride1), stride2.eq(ini.stride2), st.target.eq(ini.target),
            ]
        with m.If(self.start):
            m.d.sync += act.eq(1)
        with m.Elif(self.abort | (self.next & self.last)):
            m.d.sync += act.eq(0)
        return m


def _desc_flags(desc):
    """``(n1 == 1, n1 == 2, n2 == 1, empty)`` of a descriptor: the flags an engine's intake
    registers, so the burst generator's initial state needs no compare."""
    return desc.n1 == 1, desc.n1 == 2, desc.n2 == 1, _empty(desc)


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
        ... whose data must be valid exactly ``SP_READ_LATENCY`` = 5 cycles after ``sp_re``
        (a :class:`~dnnfab.hw.scratchpad.Scratchpad`).
    rd_done : ``Out(1)``
        One-cycle pulse with the ``sp_we`` of a read command's last beat.
    wr_done : ``Out(1)``
        One-cycle pulse the cycle after a write command's last B response.
    window_lo, window_hi : ``In(addr_bits)``
        Writes must stay inside ``[window_lo, window_hi)``.
    error : ``Out(1)``
        Sticky error flag, with ``error_code : Out(4)`` and ``error_addr : Out(addr_bits)``.
    error_q, error_code_q, error_addr_q : ``Out``
        The three, registered (one cycle late): for readers across the die, which then
        start at a flip-flop (the address mux of the first error feeding the controller's
        copy was a 7.7 ns path).
    clear : ``In(1)``
        Clears ``error``/``error_code``/``error_addr``.
    busy : ``Out(1)``
        A command is queued, bursts are in flight, or a done pulse is being emitted
        (registered: one cycle late, and high the cycle after a command is taken).
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
            "error_q": Out(1), "error_code_q": Out(4), "error_addr_q": Out(cfg.addr_bits),
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
        # Two copies of the sticky flag, one per engine, each a register of its own (the
        # same rule as ``error``, fed back from itself, so yosys keeps them apart): the flag
        # gates both engines' issue and intake logic, which sit at opposite ends of the
        # DMA; one register for both put a 5.8 ns route into the write intake's enables.
        err_rd, err_wr = Signal(name="err_rd"), Signal(name="err_wr")

        # ================================================================ read engine
        agr = m.submodules.rd_bursts = _BurstGen(cfg)
        rinfo_layout = data.StructLayout({"addr": unsigned(ab), "sp": unsigned(16),
                                          "target": unsigned(2), "last": unsigned(1)})
        rinfo = m.submodules.rd_inflight = RegFIFO(rinfo_layout.size, max(self.max_rd_bursts, 2), late_write=False)
        rd_kill = Signal()          # draining after an error: suppress writes and done pulses
        rd_kill_r = Signal()
        rd_empty_wait = Signal()    # an empty command waits for the earlier ones to finish
        m.d.comb += rd_kill.eq(err_rd | rd_kill_r)

        # intake register: a command is held in ``rdesc`` (with its flags precomputed) and
        # starts from there, so no path runs from the controller's payload register (placed
        # elsewhere) through the burst generator's initial-state logic (Fmax). The next
        # command is taken in while the current one runs; an idle engine starts a command
        # two cycles after its handshake (see ``r_pend_d``).
        rdesc = dreg(desc_layout(cfg))
        r_pend = Signal()
        r_n1_one, r_n1_two, r_n2_one, r_empty = Signal(), Signal(), Signal(), Signal()
        p = self.rd_cmd.p
        m.d.comb += self.rd_cmd.ready.eq(~r_pend & ~rd_kill)
        with m.If(~r_pend):
            m.d.sync += rdesc.eq(p)
            m.d.sync += [f.eq(v) for f, v in zip((r_n1_one, r_n1_two, r_n2_one, r_empty), _desc_flags(p))]
        # the burst generator's initial state is registered too (as the write engine's):
        # its adds (address + strides) then start at flip-flops beside it, not at the
        # intake register (the read generator's next-row register was the worst path,
        # 7.1 ns). A command starts once it has been in ``rdesc`` for a cycle
        # (``r_pend_d``): for an idle engine, two cycles after its handshake.
        r_pend_d = Signal()
        m.d.sync += [getattr(agr.init, f).eq(v)
                     for f, v in agr.initial(rdesc, r_n1_one, r_n1_two, r_n2_one)]
        m.d.sync += r_pend_d.eq(r_pend)
        with m.If(self.rd_cmd.valid & self.rd_cmd.ready):
            m.d.sync += r_pend.eq(1)
        with m.If(r_pend & r_pend_d & ~agr.active & ~rd_empty_wait & ~rd_kill):
            m.d.sync += r_pend.eq(0)
            with m.If(r_empty):
                m.d.sync += rd_empty_wait.eq(1)
            with m.Else():
                m.d.comb += agr.start.eq(1)
        with m.If(rd_kill):
            m.d.sync += r_pend.eq(0)             # (dropped, like the aborted burst generator)

        # AR channel: one burst per cycle while the in-flight budget allows
        ar_load = Signal()
        m.d.comb += [
            # the burst generator advances regardless of an error (it is aborted then): the
            # error only gates the AR register and the in-flight FIFO
            agr.next.eq(agr.active & rinfo.w_rdy & (~bus.arvalid | bus.arready)),
            ar_load.eq(agr.next & ~err_rd),
            agr.abort.eq(err_rd),
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
            m.d.sync += [bus.arvalid.eq(1), bus.araddr.eq(agr.addr), bus.arlen.eq(agr.blen_m1)]
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
        with m.If(rd_empty_wait & (err_rd | ~rinfo.r_rdy)):
            m.d.sync += rd_empty_wait.eq(0)
            with m.If(~rd_kill):
                m.d.sync += self.rd_done.eq(1)
        with m.If(err_rd):
            m.d.sync += rd_kill_r.eq(1)
        with m.Elif(~rinfo.r_rdy):
            m.d.sync += rd_kill_r.eq(0)
        rd_err_addr = Signal(ab)
        m.d.comb += rd_err_addr.eq(rhead.addr + (roff << lb))
        rd_busy = Signal()
        m.d.comb += rd_busy.eq(r_pend | agr.active | bus.arvalid | rinfo.r_rdy | rd_empty_wait | self.sp_we
                              | self.rd_done)

        # =============================================================== write engine
        agw = m.submodules.wr_bursts = _BurstGen(cfg)
        # -- intake and window check (overlapped with the running command)
        wdesc = dreg(desc_layout(cfg))
        # the write burst generator's initial state is registered (wdesc is stable from the
        # cycle after the intake until the start, at least three cycles later)
        w_n1_one, w_n1_two, w_n2_one = Signal(), Signal(), Signal()
        m.d.sync += [getattr(agw.init, f).eq(v)
                     for f, v in agw.initial(wdesc, w_n1_one, w_n1_two, w_n2_one)]
        # (n1 - 1) * stride1 and (n2 - 1) * stride2 by shift-and-add, one multiplier bit per
        # cycle, LSB first, stopping when both multipliers are exhausted (no DSP: its
        # combinational delay alone is over 6 ns on ECP5)
        mul1 = Signal(16); mul2 = Signal(16)            # n - 1, shifted right each step
        sh1 = Signal(48); sh2 = Signal(48)              # stride, shifted left each step
        ext1 = Signal(48); ext2 = Signal(48)            # the accumulated products
        mul_done = Signal()                             # registered: mul1 == mul2 == 0
        w_go = Signal()                                 # in state START
        end0 = Signal(ab + 17)                          # addr + len0 * bus_bytes
        ext = Signal(49)                                # ext1 + ext2
        w_empty = Signal()
        wr_kill = Signal()
        wr_kill_r = Signal()
        win_bad = Signal()
        win_lo_bad, win_hi_bad, win_wrap = Signal(), Signal(), Signal()
        m.d.comb += win_bad.eq(win_lo_bad | win_hi_bad | win_wrap)
        m.d.comb += wr_kill.eq(err_wr | wr_kill_r)
        wb_end = Signal(ab + 50)            # registered in SUM, compared in CMP (Fmax)
        bfifo_layout = data.StructLayout({"addr": unsigned(ab), "last": unsigned(1)})
        bfifo = m.submodules.wr_inflight = RegFIFO(bfifo_layout.size, max(self.max_wr_bursts, 2), late_write=False)
        wb_layout = data.StructLayout({"sp": unsigned(16), "blen_m1": range(cfg.max_burst),
                                       "one": unsigned(1), "target": unsigned(2)})
        wbq = m.submodules.wr_bursts_q = RegFIFO(wb_layout.size, max(self.max_wr_bursts, 2), late_write=False)
        # (W data: the head is an asynchronous read, a W beat only moves pointers)
        wfifo = m.submodules.wr_data = RegFIFO(cfg.bus_bits + 1, self.w_buffer, late_write=False)
        pending = Signal(range(self.w_buffer + 1))
        wc_valid = Signal()         # a burst's beats are being read from the scratchpad
        w_idle = Signal()
        m.d.comb += w_idle.eq(~agw.active & ~bfifo.r_rdy & ~wbq.r_rdy & ~wc_valid & (pending == 0))
        win_err = Signal()
        w_empty_done = Signal()     # an empty command completes (nothing in flight)

        # the intake registers load every cycle while idle (the enables do not wait for the
        # handshake, and come from a flag of their own: ``in_idle``); only the state change
        # waits for it
        in_idle = Signal(init=1)
        in_mul = Signal()
        w_small = Signal()                              # n1 <= 1 and n2 <= 1
        w_summed = Signal()                             # the products are in ``ext``
        p = self.wr_cmd.p
        pa = Cat(Const(0, lb), p.addr[lb:])
        with m.If(in_idle):
            m.d.sync += [
                wdesc.eq(p),
                wdesc.addr.eq(pa),
                wdesc.stride1.eq(Cat(Const(0, lb), p.stride1[lb:])),
                wdesc.stride2.eq(Cat(Const(0, lb), p.stride2[lb:])),
                *[f.eq(v) for f, v in zip((w_n1_one, w_n1_two, w_n2_one, w_empty), _desc_flags(p))],
                w_small.eq((p.n1[1:] == 0) & (p.n2[1:] == 0)), w_summed.eq(0),
                end0.eq(pa + (p.len0 << lb)),
                mul1.eq(p.n1 - 1), mul2.eq(p.n2 - 1),
                sh1.eq(Cat(Const(0, lb), p.stride1[lb:])),
                sh2.eq(Cat(Const(0, lb), p.stride2[lb:])),
                ext1.eq(0), ext2.eq(0), ext.eq(0), mul_done.eq(0),
            ]
        with m.Elif(in_mul):
            m.d.sync += [
                ext1.eq(ext1 + Mux(mul1[0], sh1, 0)), ext2.eq(ext2 + Mux(mul2[0], sh2, 0)),
                sh1.eq(sh1 << 1), sh2.eq(sh2 << 1),
                mul1.eq(mul1 >> 1), mul2.eq(mul2 >> 1),
                mul_done.eq((mul1[1:] == 0) & (mul2[1:] == 0)),
            ]
        m.d.comb += self.wr_cmd.ready.eq(in_idle & ~wr_kill)
        with m.FSM(name="wr_intake") as fsm:
            with m.State("IDLE"):
                # (the handshake decides nothing from the payload: it comes from the
                # controller's register across the die; its compares are registered with
                # the intake, ``w_small``, and read in SUM2)
                with m.If(self.wr_cmd.valid & ~wr_kill):
                    m.d.sync += in_idle.eq(0)
                    m.next = "SUM2"
            with m.State("MUL"):
                with m.If(mul_done):
                    m.d.sync += in_mul.eq(0)
                    m.next = "SUM"
            with m.State("SUM"):
                m.d.sync += ext.eq(ext1 + ext2)
                m.next = "SUM2"
            with m.State("SUM2"):
                m.d.sync += wb_end.eq(end0 + ext)
                # n1, n2 <= 1: nothing to multiply (n == 0 is an empty command, unchecked);
                # otherwise multiply, then come back with the products summed
                with m.If(w_small | w_summed):
                    m.next = "CMP"
                with m.Else():
                    m.d.sync += [in_mul.eq(1), w_summed.eq(1)]
                    m.next = "MUL"
            with m.State("CMP"):
                m.d.sync += [win_lo_bad.eq(wdesc.addr < self.window_lo),
                             win_hi_bad.eq(wb_end[:ab] > self.window_hi),
                             win_wrap.eq(wb_end[ab:] != 0)]
                m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(err_wr):
                    m.d.sync += in_idle.eq(1)
                    m.next = "IDLE"
                with m.Elif(w_empty):
                    m.next = "EMPTY"
                with m.Elif(win_bad):
                    m.d.comb += win_err.eq(1)
                    m.d.sync += in_idle.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += w_go.eq(1)
                    m.next = "START"
            with m.State("START"):
                # (w_go: this state as a flag of its own, so the start is two gates deep)
                m.d.comb += agw.start.eq(w_go & ~err_wr & ~agw.active)
                with m.If(err_wr | ~agw.active):
                    m.d.sync += [w_go.eq(0), in_idle.eq(1)]
                    m.next = "IDLE"
            with m.State("EMPTY"):
                with m.If(err_wr):
                    m.d.sync += in_idle.eq(1)
                    m.next = "IDLE"
                with m.Elif(~agw.active & ~bfifo.r_rdy):
                    m.d.comb += w_empty_done.eq(1)
                    m.d.sync += in_idle.eq(1)
                    m.next = "IDLE"

        # -- AW channel
        aw_load = Signal()
        m.d.comb += [
            # (wbq holds no more entries than bfifo: a burst leaves wbq before its W data, and
            # its B comes after them, so bfifo's room implies wbq's)
            agw.next.eq(agw.active & bfifo.w_rdy & (~bus.awvalid | bus.awready)),
            aw_load.eq(agw.next & ~err_wr),
            agw.abort.eq(err_wr),
            bus.awid.eq(0),
            bus.awsize.eq(lb),
            bus.awburst.eq(BURST_INCR),
        ]
        bfifo_in = Signal(bfifo_layout)
        wb_in = Signal(wb_layout)
        m.d.comb += [
            bfifo_in.addr.eq(agw.addr), bfifo_in.last.eq(agw.last),
            bfifo.w_data.eq(bfifo_in.as_value()), bfifo.w_en.eq(aw_load),
            wb_in.sp.eq(agw.sp), wb_in.blen_m1.eq(agw.blen_m1), wb_in.one.eq(agw.blen_one),
            wb_in.target.eq(agw.target),
            wbq.w_data.eq(wb_in.as_value()), wbq.w_en.eq(aw_load),
        ]
        with m.If(aw_load):
            m.d.sync += [bus.awvalid.eq(1), bus.awaddr.eq(agw.addr), bus.awlen.eq(agw.blen_m1)]
        with m.Elif(bus.awready):
            m.d.sync += bus.awvalid.eq(0)

        # -- scratchpad reads with credits, into the W buffer
        # the head burst moves into registers (``wc_*``) that issue its beats; the last-beat
        # flag and the credit check are registers too (Fmax)
        whead = data.View(wb_layout, wbq.r_data)
        wc_sp = Signal(16)
        wc_left = Signal(range(max(cfg.max_burst, 2)))     # beats after the current one
        wc_lastbeat = Signal()
        wc_target = Signal(2)
        credit = Signal(init=1)                             # pending < w_buffer
        w_lastbeat = Signal()
        sp_issue = Signal()
        w_beat = Signal()
        m.d.comb += [
            w_lastbeat.eq(wc_lastbeat),
            sp_issue.eq(wc_valid & credit),
            self.sp_re.eq(sp_issue),
            self.sp_raddr.eq(wc_sp),
            self.sp_rsrc.eq(wc_target),
            wbq.r_en.eq(wbq.r_rdy & (~wc_valid | (sp_issue & wc_lastbeat))),
        ]
        with m.If(wbq.r_en):
            m.d.sync += [wc_valid.eq(1), wc_sp.eq(whead.sp), wc_left.eq(whead.blen_m1),
                         wc_lastbeat.eq(whead.one), wc_target.eq(whead.target)]
        with m.Elif(sp_issue):
            with m.If(wc_lastbeat):
                m.d.sync += wc_valid.eq(0)
            with m.Else():
                m.d.sync += [wc_sp.eq(wc_sp + 1), wc_left.eq(wc_left - 1), wc_lastbeat.eq(wc_left == 1)]
        # pending after this cycle < w_buffer (a W beat frees one; pending never exceeds it)
        m.d.sync += credit.eq(w_beat | (pending <= self.w_buffer - 2)
                              | ((pending == self.w_buffer - 1) & ~sp_issue))
        # the scratchpad's data comes SP_READ_LATENCY cycles after sp_re
        re_d = [Signal(name=f"re_d{i}") for i in range(SP_READ_LATENCY)]
        last_d = [Signal(name=f"last_d{i}") for i in range(SP_READ_LATENCY)]
        m.d.sync += [re_d[0].eq(sp_issue), last_d[0].eq(w_lastbeat)]
        m.d.sync += [re_d[i + 1].eq(re_d[i]) for i in range(SP_READ_LATENCY - 1)]
        m.d.sync += [last_d[i + 1].eq(last_d[i]) for i in range(SP_READ_LATENCY - 1)]
        m.d.comb += [
            wfifo.w_en.eq(re_d[-1]),
            wfifo.w_data.eq(Cat(self.sp_rdata, last_d[-1])),
            bus.wvalid.eq(wfifo.r_rdy),
            bus.wdata.eq(wfifo.r_data[:cfg.bus_bits]),
            bus.wlast.eq(wfifo.r_data[cfg.bus_bits]),
            bus.wstrb.eq(Const((1 << cfg.bus_bytes) - 1, cfg.bus_bytes)),
            wfifo.r_en.eq(bus.wready & wfifo.r_rdy),
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
        with m.If(err_wr):
            m.d.sync += wr_kill_r.eq(1)
        with m.Elif(w_idle):
            m.d.sync += wr_kill_r.eq(0)
        wr_busy = Signal()
        m.d.comb += wr_busy.eq(~in_idle | ~w_idle | bus.awvalid | self.wr_done)

        # ===================================================================== errors
        # The events, their addresses and ``clear`` are registered first (Fmax); code and
        # address are the same function of them one cycle later, so the outputs keep their
        # timing: ``error`` is 1 in the cycle after the event, the first error is kept until
        # ``clear`` (a read error wins over a write error over a window error).
        ev = Signal()
        m.d.comb += ev.eq(r_bad | b_bad | win_err)
        # the flag itself is a register: ev | (error & ~clear) is the old rule
        # "set on an event unless already set (or cleared in the same cycle)"
        m.d.sync += [e.eq(ev | (e & ~self.clear)) for e in (error, err_rd, err_wr)]
        r_bad_d, b_bad_d, win_err_d, clr_d = Signal(), Signal(), Signal(), Signal()
        r_addr_d, b_addr_d = Signal(ab), Signal(ab)
        m.d.sync += [r_bad_d.eq(r_bad), b_bad_d.eq(b_bad), win_err_d.eq(win_err), clr_d.eq(self.clear),
                     r_addr_d.eq(rd_err_addr), b_addr_d.eq(bhead.addr)]
        ev_d = Signal()
        ev_code_d, ev_addr_d = Signal(4), Signal(ab)
        m.d.comb += ev_d.eq(r_bad_d | b_bad_d | win_err_d)
        with m.If(r_bad_d):
            m.d.comb += [ev_code_d.eq(ERR_AXI_READ), ev_addr_d.eq(r_addr_d)]
        with m.Elif(b_bad_d):
            m.d.comb += [ev_code_d.eq(ERR_AXI_WRITE), ev_addr_d.eq(b_addr_d)]
        with m.Elif(win_err_d):
            m.d.comb += [ev_code_d.eq(ERR_OUT_WINDOW), ev_addr_d.eq(wdesc.addr)]
        e_prev, code_prev, addr_prev = Signal(), Signal(4), Signal(ab)    # outputs, last cycle
        m.d.sync += [e_prev.eq(error), code_prev.eq(self.error_code), addr_prev.eq(self.error_addr)]
        m.d.comb += [self.error_q.eq(e_prev), self.error_code_q.eq(code_prev),
                     self.error_addr_q.eq(addr_prev)]
        with m.If(ev_d & (~e_prev | clr_d)):
            m.d.comb += [self.error_code.eq(ev_code_d), self.error_addr.eq(ev_addr_d)]
        with m.Elif(~clr_d):
            m.d.comb += [self.error_code.eq(code_prev), self.error_addr.eq(addr_prev)]

        # registered (the controller's run control is far away: an OR of ~15 terms and the
        # route were its ``running``/``done`` paths, 7.6 ns); a command taken this cycle
        # counts as busy, so the one-cycle lag never shows idle with a command in flight
        m.d.sync += self.busy.eq(rd_busy | wr_busy | (self.rd_cmd.valid & self.rd_cmd.ready)
                                 | (self.wr_cmd.valid & self.wr_cmd.ready))
        return m

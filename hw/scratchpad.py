"""On-chip scratchpad with a write port and a read port of different unit widths.

The DMA moves whole bus beats; the datapath reads or writes *elements* (one array row of
R activations, C weights, C int8 results, ...). A scratchpad stores rows of
``max(write_bits, read_bits)`` bits in an :class:`amaranth.lib.memory.Memory` and maps
each side's addresses onto rows and lanes:

* the narrower side addresses lanes: ``row = addr >> log2(k)``, ``lane = addr & (k-1)``
  with ``k = row_bits // unit_bits``; narrow writes use the memory's write granularity,
  narrow reads select their lane one cycle later (reads are synchronous);
* an enabled access whose address is beyond the end raises ``oob`` for one cycle and is
  dropped (the controller turns it into error code 4).

Ping-pong (double) buffering is done by the compiler: it places consecutive tiles in the
two halves and orders them with dependency tokens.
"""

from amaranth.hdl import Signal, Module, Const, Instance, ClockSignal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from .pe import dreg
from .spec import SP_READ_LATENCY, RAM_READ_LATENCY

__all__ = ["Scratchpad", "SP_READ_LATENCY", "RegisteredRAM", "RAM_READ_LATENCY", "dp16kd_blocks"]


def _log2(x):
    assert x & (x - 1) == 0, x
    return x.bit_length() - 1


#: Read latency of :class:`Scratchpad`: ``r_en`` -> ``r_data``.


class Scratchpad(wiring.Component):
    """Memory with a ``w_unit``-bit write port and an ``r_unit``-bit read port.

    Both ports' requests are registered twice before they reach the block RAMs, and the
    RAM is a :class:`RegisteredRAM` (on ECP5 every read goes through the block's output
    register): the blocks of a 64 KiB scratchpad spread over much of the chip, and a
    request that crossed it in the same cycle as the logic computing it was the whole
    design's critical path (an activation address compare -> 32 block RAM clock enables:
    9.9 ns of routing). The read data is registered once more after the RAM (and the lane
    select): a block far from the reader otherwise put the whole cross-chip route into one
    cycle (7.5 ns from a corner block RAM's output register to the activation feeder);
    the extra register lets the placer split it. So read data shows ``SP_READ_LATENCY`` = 5
    cycles after ``r_en``,
    and a write lands two cycles after ``w_en`` (nothing reads a unit that soon after
    writing it: tokens order the engines, with decode and DMA command latencies of many
    cycles in between).

    Parameters
    ----------
    size_bytes : int
        Capacity.
    w_unit, r_unit : int
        Width of one write / read unit in bits (powers of two times each other).
    addr_bits : int
        Width of the address inputs.

    Members
    -------
    w_en, w_addr, w_data : ``In``
        Write ``w_data`` to unit ``w_addr`` when ``w_en``.
    r_en, r_addr : ``In``
        Read unit ``r_addr``; ...
    r_data : ``Out(r_unit)``
        ... valid ``SP_READ_LATENCY`` cycles after ``r_en``. Holds its value otherwise.
    oob : ``Out(1)``
        An enabled access a cycle ago was out of range (and was dropped).
    """

    def __init__(self, size_bytes, w_unit, r_unit, addr_bits=16):
        self.w_unit, self.r_unit = w_unit, r_unit
        self.row_bits = max(w_unit, r_unit)
        self.depth = (size_bytes * 8) // self.row_bits
        self.w_k = self.row_bits // w_unit
        self.r_k = self.row_bits // r_unit
        self.w_units = self.depth * self.w_k
        self.r_units = self.depth * self.r_k
        super().__init__({
            "w_en": In(1), "w_addr": In(addr_bits), "w_data": In(w_unit),
            "r_en": In(1), "r_addr": In(addr_bits), "r_data": Out(r_unit),
            "oob": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # Requests cross two registers on their way to the blocks: one here, next to the
        # requester (range check and lane decode included), then copies inside the RAM,
        # one per few blocks (on ECP5 :func:`dup_reg`). With only the RAM's copies, the
        # requester's logic (e.g. the activation padding compare) and the range check
        # shared a cycle with the route to them (102.9 MHz); with a single register, one
        # net reached 32 block RAMs spread over the chip.
        m.submodules.mem = mem = RegisteredRAM(self.row_bits, self.depth, granularity=self.w_unit,
                                               input_reg=True)
        assert mem.latency + 2 == SP_READ_LATENCY

        w_bad = Signal(); r_bad = Signal()
        m.d.sync += [
            w_bad.eq(self.w_en & (self.w_addr >= self.w_units)),
            r_bad.eq(self.r_en & (self.r_addr >= self.r_units)),
        ]
        m.d.comb += self.oob.eq(w_bad | r_bad)

        # write side
        w_sh = _log2(self.w_k)
        w_lanes = Signal(self.w_k); w_addr = dreg(len(mem.w_addr)); w_data = dreg(self.w_unit)
        ok = self.w_en & (self.w_addr < self.w_units)
        if self.w_k == 1:
            m.d.sync += w_lanes.eq(ok)
        else:
            for i in range(self.w_k):
                m.d.sync += w_lanes[i].eq(ok & (self.w_addr[:w_sh] == i))
        m.d.sync += [w_addr.eq(self.w_addr >> w_sh), w_data.eq(self.w_data)]
        m.d.comb += [mem.w_en.eq(w_lanes), mem.w_addr.eq(w_addr), mem.w_data.eq(w_data.replicate(self.w_k))]

        # read side
        r_sh = _log2(self.r_k)
        r_en = Signal(); r_addr = dreg(len(mem.r_addr))
        m.d.sync += [r_en.eq(self.r_en & (self.r_addr < self.r_units)), r_addr.eq(self.r_addr >> r_sh)]
        m.d.comb += [mem.r_en.eq(r_en), mem.r_addr.eq(r_addr)]
        # the read data registered once more after the RAM and the lane select
        r_data = dreg(self.r_unit, name="r_data_q")
        m.d.comb += self.r_data.eq(r_data)
        if self.r_k == 1:
            m.d.sync += r_data.eq(mem.r_data)
        else:
            # the lane follows the read through the RAM (and holds with it; every read
            # pattern: tests/hw/test_retimed.py::test_scratchpad_lanes_exhaustive)
            r_en_q = Signal()
            lane = [dreg(r_sh, name=f"lane{i}") for i in range(4)]
            m.d.sync += r_en_q.eq(r_en)
            with m.If(self.r_en):
                m.d.sync += lane[0].eq(self.r_addr[:r_sh])
            with m.If(r_en):
                m.d.sync += lane[1].eq(lane[0])
            with m.If(r_en_q):
                m.d.sync += lane[2].eq(lane[1])
            m.d.sync += lane[3].eq(lane[2])
            m.d.sync += r_data.eq(mem.r_data.word_select(lane[3], self.r_unit))
        return m


#: Read latency of :class:`RegisteredRAM`: address (with ``r_en``) -> ``r_data``.


class RegisteredRAM(wiring.Component):
    """Simple dual-port RAM whose read data is registered once more after the array.

    ``r_data`` shows the word at ``r_addr`` ``RAM_READ_LATENCY`` = 2 cycles after ``r_en``
    and holds it until the next read (a write in the same cycle as the read is not seen).
    With ``granularity``, ``w_en`` has one bit per ``granularity``-bit lane of the word.

    On ECP5 (``platform.dnnfab_mult == "ecp5"``, see :class:`dnnfab.hw.generate.SynthHints`)
    it is built from ``DP16KD`` blocks with the output register of the read port in use
    (``REGMODE = "OUTREG"``): yosys maps inferred memories without it, and the block RAM's
    clock-to-out without the register (5.8 ns on a -6 part) then leaves barely any of a
    150 MHz cycle for routing. Each lane gets the block shape that needs the fewest
    blocks for its depth (:func:`dp16kd_blocks`): x1..x18 true dual-port modes or, for
    <= 512 words, the 36-bit pseudo dual-port mode (write data on DIA/DIB, read data on
    DOA/DOB, ``ADA[3:0]`` the four 9-bit byte enables), exactly as yosys' own
    ``PDPW16KD`` mapping wires it. Elsewhere (or beyond 16 Ki words) it is a
    :class:`Memory` followed by a register.

    Members
    -------
    w_en : ``In(width // granularity)``
    w_addr, w_data : ``In``
    r_en, r_addr : ``In``
    r_data : ``Out(width)``
    """

    def __init__(self, width, depth, granularity=None, input_reg=False):
        granularity = granularity or width
        assert width % granularity == 0
        self.width, self.depth, self.granularity = width, depth, granularity
        self.input_reg = input_reg
        self.latency = RAM_READ_LATENCY + input_reg
        self.lanes = width // granularity
        self.abits = max(1, (depth - 1).bit_length())
        super().__init__({
            "w_en": In(self.lanes), "w_addr": In(self.abits), "w_data": In(width),
            "r_en": In(1), "r_addr": In(self.abits), "r_data": Out(width),
        })

    def elaborate(self, platform):
        m = Module()
        ecp5 = getattr(platform, "dnnfab_mult", None) == "ecp5"
        if ecp5 and self.depth <= 1 << 14:
            dw, nblk = dp16kd_shape(self.granularity, self.depth)
            ab = _DP16KD_ABITS[dw]
            lo = 14 - ab                              # AD[lo-1:0] are not address bits
            G = self.granularity
            w_data = self.w_data
            if self.input_reg:
                w_data = dreg(len(self.w_data), name="w_data_q")
                m.d.sync += w_data.eq(self.w_data)
            ctrl = {}

            def control(lane, b):
                """Address and enables of block ``b`` of ``lane``: the inputs, or with
                ``input_reg`` a registered copy shared by a group of up to FANOUT blocks."""
                if not self.input_reg:
                    return self.w_addr, self.w_en[lane], self.r_addr, self.r_en
                key = (lane, b // _FANOUT)
                if key not in ctrl:
                    ctrl[key] = [dup_reg(m, platform, v, f"{n}_l{lane}g{b // _FANOUT}") for n, v in
                                 (("w_addr", self.w_addr), ("w_en", self.w_en[lane]),
                                  ("r_addr", self.r_addr), ("r_en", self.r_en))]
                return ctrl[key]

            for lane in range(self.lanes):
                wdata = Signal(nblk * dw, name=f"wdata{lane}")
                rdata = Signal(nblk * dw, name=f"rdata{lane}")
                m.d.comb += [wdata.eq(w_data[lane * G:(lane + 1) * G]),
                             self.r_data[lane * G:(lane + 1) * G].eq(rdata[:G])]
                for b in range(nblk):
                    w_addr, w_en, r_addr, r_en = control(lane, b)
                    ports = {}
                    for i in range(14):
                        if i >= lo:
                            ports[f"i_ADA{i}"] = w_addr[i - lo] if i - lo < self.abits else Const(0)
                            ports[f"i_ADB{i}"] = r_addr[i - lo] if i - lo < self.abits else Const(0)
                        else:
                            # x18: ADA[1:0], x36: ADA[3:0] are the 9-bit write byte enables
                            be = {18: 2, 36: 4}.get(dw, 0)
                            ports[f"i_ADA{i}"] = Const(1 if i < be else 0)
                            ports[f"i_ADB{i}"] = Const(0)
                    # (unused data pins stay unconnected, as in yosys' own mapping: tying
                    # them to constants loads the router with hundreds of constant sinks)
                    word = slice(b * dw, (b + 1) * dw)
                    if dw == 36:
                        for i in range(18):
                            ports[f"i_DIA{i}"] = wdata[word][i]
                            ports[f"i_DIB{i}"] = wdata[word][18 + i]
                            ports[f"o_DOA{i}"] = rdata[word][i]
                            ports[f"o_DOB{i}"] = rdata[word][18 + i]
                    else:
                        for i in range(dw):
                            ports[f"i_DIA{i}"] = wdata[word][i]
                            ports[f"o_DOB{i}"] = rdata[word][i]
                    for i in range(3):
                        ports[f"i_CSA{i}"] = Const(0)
                        ports[f"i_CSB{i}"] = Const(0)
                    m.submodules[f"bram{lane}_{b}" if self.lanes > 1 else f"bram{b}"] = Instance(
                        "DP16KD",
                        p_DATA_WIDTH_A=dw, p_DATA_WIDTH_B=dw,
                        p_REGMODE_A="OUTREG" if dw == 36 else "NOREG", p_REGMODE_B="OUTREG",
                        p_RESETMODE="SYNC", p_ASYNC_RESET_RELEASE="SYNC",
                        p_CSDECODE_A="0b000", p_CSDECODE_B="0b000",
                        p_WRITEMODE_A="NORMAL", p_WRITEMODE_B="NORMAL", p_GSR="DISABLED",
                        i_CLKA=ClockSignal(), i_CEA=Const(1), i_OCEA=Const(1), i_WEA=w_en,
                        i_RSTA=Const(0),
                        i_CLKB=ClockSignal(), i_CEB=r_en, i_OCEB=Const(1), i_WEB=Const(0),
                        i_RSTB=Const(0),
                        **ports)
        else:
            mem = Memory(shape=unsigned(self.width), depth=self.depth, init=[])
            m.submodules.mem = mem
            wp = mem.write_port(granularity=self.granularity if self.lanes > 1 else None)
            rp = mem.read_port()
            ins = [(wp.addr, self.w_addr), (wp.data, self.w_data), (wp.en, self.w_en),
                   (rp.addr, self.r_addr), (rp.en, self.r_en)]
            domain = m.d.sync if self.input_reg else m.d.comb
            domain += [port.eq(v) for port, v in ins]
            m.d.sync += self.r_data.eq(rp.data)
        return m


#: Block RAMs sharing one copy of the registered address / enables (``input_reg``).
_FANOUT = 8


def dup_reg(m, platform, value, name):
    """``value`` registered; on ECP5 as ``TRELLIS_FF`` instances of its own.

    yosys merges flip-flops with the same input into one (even with ``keep`` on their
    wires), which would undo a duplication made to cut the fan-out of a net that crosses
    the chip; instantiated primitives are left alone. No reset (the copies feed block RAM
    address and enable pins, where a stale value after a soft reset is harmless).
    """
    q = Signal(len(value), name=name)
    if getattr(platform, "dnnfab_mult", None) == "ecp5":
        for i in range(len(value)):
            m.submodules[f"{name}_ff{i}"] = Instance(
                # (wired as yosys' own cells_map_trellis.v maps a plain $_DFF_P_)
                "TRELLIS_FF", p_GSR="DISABLED", p_CEMUX="1", p_CLKMUX="CLK", p_LSRMUX="LSR",
                p_REGSET="RESET",
                i_CLK=ClockSignal(), i_DI=value[i], i_LSR=Const(0), o_Q=q[i])
    else:
        m.d.sync += q.eq(value)
    return q


#: DP16KD data width -> address bits (16 Kib per block; x36 is the pseudo dual-port mode)
_DP16KD_ABITS = {36: 9, 18: 10, 9: 11, 4: 12, 2: 13, 1: 14}


def dp16kd_shape(lane_bits, depth):
    """Block shape of a :class:`RegisteredRAM` lane on ECP5: ``(data width, blocks)``.

    The width whose depth holds ``depth`` words with the fewest blocks (the widest on a
    tie, for the fewest read-data wires)."""
    best = None
    for dw, ab in _DP16KD_ABITS.items():
        if depth <= 1 << ab:
            n = -(-lane_bits // dw)
            if best is None or n < best[1]:
                best = (dw, n)
    assert best is not None, depth
    return best


def dp16kd_blocks(width, depth, granularity=None):
    """DP16KD count of a :class:`RegisteredRAM` on ECP5 (the fit model uses it)."""
    g = granularity or width
    return (width // g) * dp16kd_shape(g, depth)[1]

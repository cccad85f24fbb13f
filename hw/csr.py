"""Register descriptions and an AXI4-Lite register bank generated from them.

The description (:class:`Register`, :class:`Field`, :class:`RegisterMap`) is plain Python:
the same object builds the hardware (:class:`CSRBank`), the JSON in the manifest
(:meth:`RegisterMap.to_json`) and the C header (:func:`c_header`), so the driver and the
hardware cannot disagree on an offset or a bit.

Access kinds
------------
``"rw"``
    Read/write storage. Hardware sees the value on the ``Out`` port ``<name>``.
``"ro"``
    Read-only, driven by hardware on the ``In`` port ``<name>``.
``"const"``
    Read-only constant (the register's ``reset`` value); no port. Used for ID, VERSION and
    the CONFIG words.
``"w1c"``
    Event bits: hardware sets bits with the ``In`` port ``<name>_set`` (a bit high for one
    cycle sets it), software writes 1 to clear. A set and a clear of the same bit in the
    same cycle leave it set (no event is lost). The value is on the ``Out`` port ``<name>``.
``"pulse"``
    Write-only strobes: a write drives the written bits on the ``Out`` port ``<name>`` for
    exactly one cycle; reading returns 0.

64-bit counters are two ``"ro"`` registers ``X_LO`` and ``X_HI``; ``X_LO`` carries
``latch="X_HI"``: reading ``X_LO`` captures ``X_HI``'s input in a shadow register and
reading ``X_HI`` returns that shadow. Read LO first, then HI, for a consistent 64-bit value
(a lone HI read returns the value captured at the last LO read).

Port names are the register names in lower case (``CTRL`` -> ``bank.ctrl``); use
:meth:`CSRBank.port` to look one up by register name.
"""

from dataclasses import dataclass
import json
import re

from amaranth.hdl import Signal, Module, Const
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import axi4lite_signature, RESP_OKAY
from .regdesc import Field, Register, RegisterMap, c_header, ACCESS_KINDS  # noqa: F401
from ..errors import ConfigError

__all__ = ["Field", "Register", "RegisterMap", "CSRBank", "c_header", "ACCESS_KINDS"]

class CSRBank(wiring.Component):
    """AXI4-Lite slave register bank built from a :class:`RegisterMap`.

    One transaction at a time per direction; a read and a write may proceed together.
    Write: ``awready``/``wready`` are high while the bank has room for the address / the
    data; the two may arrive in either order or the same cycle; once both are held
    ``bvalid`` rises the next cycle, and the write (respecting ``wstrb``) lands the cycle
    after that: before any read the master issues after the B handshake.
    Read: ``arready`` is high while no read response is pending; ``rvalid`` rises the
    cycle after the address handshake, with the data captured at the handshake.
    Responses are always OKAY. An unmapped address reads as 0 and ignores writes (OKAY):
    drivers check ``ID`` once rather than every access. Bits ``[1:0]`` of the address are
    ignored; decoding uses ``addr_bits``, so the map aliases every ``2**addr_bits`` bytes.

    Parameters
    ----------
    regmap : RegisterMap
    addr_bits : int
        Width of ``awaddr``/``araddr`` (default 12: a 4 KiB window).

    Members
    -------
    bus : ``In(axi4lite_signature(addr_bits, 32))``
        The AXI4-Lite slave port.
    <name> : ``Out(width)`` for "rw", "w1c", "pulse"; ``In(width)`` for "ro"
        One port per register (lower-case name); none for "const". See the module
        docstring for the behaviour of each kind.
    <name>_set : ``In(width)``
        Hardware set bits of each "w1c" register.
    """

    def __init__(self, regmap: RegisterMap, addr_bits=12):
        if regmap.size > (1 << addr_bits):
            raise ConfigError(f"register map {regmap.name} spans {regmap.size} bytes; "
                              f"addr_bits={addr_bits} only decodes {1 << addr_bits}")
        self.regmap = regmap
        self.addr_bits = addr_bits
        members = {"bus": In(axi4lite_signature(addr_bits, 32))}
        for r in regmap:
            if r.access in ("rw", "w1c", "pulse"):
                members[r.port_name] = Out(r.width, init=r.reset if r.access != "pulse" else 0)
            elif r.access == "ro":
                members[r.port_name] = In(r.width)
            if r.access == "w1c":
                members[r.port_name + "_set"] = In(r.width)
        for name in members:
            if name != "bus" and name in {"signature", "elaborate", "port", "regmap", "addr_bits"}:
                raise ConfigError(f"register name {name.upper()} clashes with a CSRBank attribute")
        super().__init__(members)

    def port(self, name):
        """The port of register ``name`` (any case)."""
        return getattr(self, name.lower())

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        word = lambda addr: addr[2:self.addr_bits]  # noqa: E731

        # -- write channel ------------------------------------------------------------
        aw_full = Signal()
        aw_addr = Signal(self.addr_bits)
        w_full = Signal()
        w_data = Signal(32)
        w_strb = Signal(4)
        m.d.comb += [
            bus.awready.eq(~aw_full),
            bus.wready.eq(~w_full),
            bus.bresp.eq(RESP_OKAY),
            bus.rresp.eq(RESP_OKAY),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(bus.awaddr)]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]
        do_write = Signal()
        m.d.comb += do_write.eq(aw_full & w_full & ~bus.bvalid)
        with m.If(do_write):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), bus.bvalid.eq(1)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        bytemask = Signal(32)
        m.d.comb += bytemask.eq(Const(0, 32))
        for i in range(4):
            m.d.comb += bytemask[8 * i:8 * i + 8].eq(w_strb[i].replicate(8))

        # -- read channel -------------------------------------------------------------
        m.d.comb += bus.arready.eq(~bus.rvalid)
        do_read = Signal()
        m.d.comb += do_read.eq(bus.arvalid & bus.arready)
        with m.If(do_read):
            m.d.sync += bus.rvalid.eq(1)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)

        shadows = {}
        for r in self.regmap:
            if r.latch:
                shadows[r.latch] = Signal(self.regmap[r.latch].width, name=f"{r.latch.lower()}_shadow")

        # The read data as an OR of one-hot gated values, in a balanced tree: a select per
        # register from the address alone, ANDed with its value. As a case statement,
        # synthesis made a chain of wide multiplexers in which register values drove
        # other multiplexers' selects: eleven cells deep from a counter to ``rdata``, a late
        # path on several placements (6.7-7.35 ns at 150 MHz).
        terms = []
        for r in self.regmap:
            if r.access == "pulse":
                continue                                # (reads as 0)
            if r.access == "const":
                v = Const(r.reset, 32)
            elif r.name in shadows:
                v = shadows[r.name]
            else:
                v = self.port(r.name)
            sel = Signal(name=f"rsel_{r.port_name}")
            m.d.comb += sel.eq(word(bus.araddr) == (r.offset >> 2))
            terms.append(sel.replicate(32) & v)
        while len(terms) > 1:
            terms = [terms[i] | terms[i + 1] if i + 1 < len(terms) else terms[i]
                     for i in range(0, len(terms), 2)]
        rd_val = Signal(32)
        m.d.comb += rd_val.eq(terms[0] if terms else 0)
        with m.If(do_read):
            m.d.sync += bus.rdata.eq(rd_val)
            for r in self.regmap:
                if r.latch:
                    with m.If(word(bus.araddr) == (r.offset >> 2)):
                        m.d.sync += shadows[r.latch].eq(self.port(r.latch))

        # -- register storage -------------------------------------------------------
        # The address decode is registered (one hit flag per register) together with the
        # data and byte mask, and applied a cycle later (as ``bvalid`` is seen): the
        # registers sit next to their users all over the die (the DMA window next to the
        # DMA, ...), and decode + clock enable + the route to 32 flip-flops far away was
        # 8.8 ns. A read issued after the B handshake still sees the new value
        # (tests/hw/test_retimed.py::test_csr_write_decode).
        hit = {}
        w_data_q = Signal(32)
        mask_q = Signal(32)
        m.d.sync += [w_data_q.eq(w_data), mask_q.eq(bytemask)]
        for r in self.regmap:
            h = Signal(name=f"wr_{r.port_name}")
            m.d.sync += h.eq(do_write & (word(aw_addr) == (r.offset >> 2)))
            hit[r.name] = h
            mask = mask_q[:r.width]
            wdat = w_data_q[:r.width]
            if r.access == "rw":
                reg = self.port(r.name)
                with m.If(h):
                    m.d.sync += reg.eq((reg & ~mask) | (wdat & mask))
            elif r.access == "w1c":
                reg = self.port(r.name)
                setp = getattr(self, r.port_name + "_set")
                clr = Signal(r.width, name=f"{r.port_name}_clr")
                m.d.comb += clr.eq(Const(0, r.width))
                with m.If(h):
                    m.d.comb += clr.eq(wdat & mask)
                m.d.sync += reg.eq((reg & ~clr) | setp)
            elif r.access == "pulse":
                reg = self.port(r.name)
                m.d.sync += reg.eq(0)
                with m.If(h):
                    m.d.sync += reg.eq(wdat & mask)
        return m

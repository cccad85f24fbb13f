"""AXI4 and AXI4-Lite bus signatures (seen from the master).

Member names are the AMBA signal names in lower case, so that Amaranth's Verilog names a
port member ``m_axi`` sub-signal ``awaddr`` as ``m_axi__awaddr`` and a cocotb bench binds
the whole bus with ``AxiBus.from_prefix(dut, "m_axi_")`` (cocotbext-axi adds one ``_``).

Master-driven signals are ``Out``, slave-driven ones ``In``; a slave port uses
``axi4_signature(...).flip()`` / ``axi4lite_signature(...).flip()``.

Only the signals our blocks use are present. Optional AXI signals (``awlock``,
``awcache``, ``awprot``, ``awqos``, ``awregion``, user signals) are absent from the AXI4
signature: interconnects and cocotbext-axi default them (normal, non-secure, non-cacheable
bufferable does not matter for a DMA into DRAM). The ID signals ARE present: cocotbext-axi
0.1.28 under cocotb 2.1 cannot build ``AxiRam``/``AxiMaster`` on a bus without them.
The DMA always drives ID 0 (one ID: reads and writes complete in order).
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["axi4_signature", "axi4lite_signature", "BURST_INCR", "RESP_OKAY", "RESP_EXOKAY",
           "RESP_SLVERR", "RESP_DECERR"]

#: AxBURST encodings.
BURST_FIXED, BURST_INCR, BURST_WRAP = 0, 1, 2
#: xRESP encodings. Bit 1 set means an error (SLVERR or DECERR).
RESP_OKAY, RESP_EXOKAY, RESP_SLVERR, RESP_DECERR = 0, 1, 2, 3


def axi4_signature(addr_bits, data_bits, id_bits):
    """AXI4 full master signature (INCR bursts, IDs, byte strobes).

    ``data_bits`` must be a multiple of 8; ``wstrb`` has ``data_bits // 8`` bits.
    """
    if data_bits % 8 or data_bits < 8:
        raise ValueError(f"AXI data width {data_bits} is not a whole number of bytes")
    return wiring.Signature({
        # write address
        "awid": Out(id_bits),
        "awaddr": Out(addr_bits),
        "awlen": Out(8),
        "awsize": Out(3),
        "awburst": Out(2),
        "awvalid": Out(1),
        "awready": In(1),
        # write data
        "wdata": Out(data_bits),
        "wstrb": Out(data_bits // 8),
        "wlast": Out(1),
        "wvalid": Out(1),
        "wready": In(1),
        # write response
        "bid": In(id_bits),
        "bresp": In(2),
        "bvalid": In(1),
        "bready": Out(1),
        # read address
        "arid": Out(id_bits),
        "araddr": Out(addr_bits),
        "arlen": Out(8),
        "arsize": Out(3),
        "arburst": Out(2),
        "arvalid": Out(1),
        "arready": In(1),
        # read data
        "rid": In(id_bits),
        "rdata": In(data_bits),
        "rresp": In(2),
        "rlast": In(1),
        "rvalid": In(1),
        "rready": Out(1),
    })


def axi4lite_signature(addr_bits, data_bits=32):
    """AXI4-Lite master signature (``awprot``/``arprot`` included, ignored by our slaves)."""
    if data_bits not in (32, 64):
        raise ValueError(f"AXI4-Lite data width must be 32 or 64, not {data_bits}")
    return wiring.Signature({
        "awaddr": Out(addr_bits),
        "awprot": Out(3),
        "awvalid": Out(1),
        "awready": In(1),
        "wdata": Out(data_bits),
        "wstrb": Out(data_bits // 8),
        "wvalid": Out(1),
        "wready": In(1),
        "bresp": In(2),
        "bvalid": In(1),
        "bready": Out(1),
        "araddr": Out(addr_bits),
        "arprot": Out(3),
        "arvalid": Out(1),
        "arready": In(1),
        "rdata": In(data_bits),
        "rresp": In(2),
        "rvalid": In(1),
        "rready": Out(1),
    })

"""dnnfab.cosim: cocotb 2.x co-simulation of the generated Verilog.

:mod:`dnnfab.cosim.runner` builds (cached) and runs tests with Verilator or Icarus;
``tb_*.py`` modules are the cocotb testbenches; :func:`params` reads the JSON parameters
the runner hands to a testbench. :mod:`dnnfab.cosim.dram` is the Verilog AXI4 DRAM of the
accelerator testbench; :mod:`dnnfab.cosim.rtl_backend` the host driver's ``rtl`` backend
(one simulator process serving :mod:`dnnfab.cosim.tb_rtl`); :mod:`dnnfab.cosim.network`
``dnnfab cosim MODEL`` (docs/cosim_network.md).
"""

import json
import os

__all__ = ["params", "pack", "unpack"]


def params():
    """The ``params`` dict given to :func:`dnnfab.cosim.runner.run` (inside a cocotb test)."""
    return json.loads(os.environ.get("DNNFAB_PARAMS", "{}"))


def pack(values, bits):
    """Pack signed/unsigned integers into one int, element 0 in the least significant bits."""
    mask = (1 << bits) - 1
    word = 0
    for i, v in enumerate(values):
        word |= (int(v) & mask) << (i * bits)
    return word


def unpack(word, bits, count, signed=True):
    """Inverse of :func:`pack`."""
    mask = (1 << bits) - 1
    out = []
    for i in range(count):
        v = (word >> (i * bits)) & mask
        if signed and v >> (bits - 1):
            v -= 1 << bits
        out.append(v)
    return out

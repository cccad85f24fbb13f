"""cocotb testbench of the harness itself: runs a design for ``cycles`` clock cycles with
random values on the input ports named in ``drive`` (``[[name, width], ...]``), then fails
on purpose (tests that a failure's waveform re-run records only
the window before the failure, see :mod:`dnnfab.cosim.runner`)."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from dnnfab.cosim import params


@cocotb.test()
async def fail_after(dut):
    n = int(params()["cycles"])
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    rng = random.Random(1)
    ports = [(getattr(dut, name), width) for name, width in params().get("drive", [])]
    for _ in range(n):
        for h, width in ports:
            h.value = rng.getrandbits(width)
        await RisingEdge(dut.clk)
    await RisingEdge(dut.clk)
    assert False, f"deliberate failure after {n} cycles (harness self-test)"

"""The DMA's generated Verilog under cocotb + cocotbext-axi AxiRam, Verilator and Icarus.

Each (simulator, bus width) pair builds the harness once (cached) and runs the three
cocotb tests of :mod:`dnnfab.cosim.tb_dma`: random round trips, throughput, errors.
"""

import json

import pytest

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.cosim import runner
from dnnfab.cosim.harness import dma_harness_verilog

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]

#: Cycles a contiguous read may take beyond its beat count, from command acceptance to
#: rd_done: 1 (AG start) + 1 (AR register) + AXI RAM model latency (AR sink + R source,
#: 3 cycles with cocotbext-axi) + 1 (sp_we register), rounded up. See docs/dma_csr.md.
READ_SLACK = 8

#: bus width -> (max_burst, groups of random round trips, contiguous beats timed)
SETUPS = {64: (16, 40, 1024), 128: (32, 30, 768)}


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
@pytest.mark.parametrize("bus_bits", list(SETUPS), ids=lambda b: f"bus{b}")
def test_dma(sim, bus_bits, tmp_path):
    max_burst, groups, stream_beats = SETUPS[bus_bits]
    cfg = AcceleratorConfig(bus_bits=bus_bits, max_burst=max_burst)
    vfile, module = dma_harness_verilog(cfg, sp_depth=1024)
    report = tmp_path / "dma"
    params = dict(bus_bits=bus_bits, addr_bits=cfg.addr_bits, max_burst=max_burst, sp_depth=1024,
                  seed=bus_bits, groups=groups, stream_beats=stream_beats, slack=READ_SLACK,
                  report=str(report))
    result = runner.run([vfile], module, "dnnfab.cosim.tb_dma", sim=sim, params=params)
    assert result.tests == 5 and result.failed == 0
    tp = json.loads((tmp_path / "dma.throughput.json").read_text())
    rd = tp["read_1d"]
    # the figure the benchmark relies on: the read path streams at ~1 beat per cycle
    assert rd["cycles"] <= rd["beats"] + READ_SLACK
    rt = json.loads((tmp_path / "dma.roundtrip.json").read_text())
    print(f"\n{sim} bus{bus_bits}: round trips {rt}; " + ", ".join(
        f"{k} {v['beats']} beats / {v['cycles']} cycles = {v['beats_per_cycle']:.3f}" for k, v in tp.items()))

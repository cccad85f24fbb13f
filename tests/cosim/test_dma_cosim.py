"""The DMA's generated Verilog under cocotb + cocotbext-axi AxiRam, Verilator and Icarus.

Each (simulator, bus width) pair builds the harness once (cached) and runs the three
cocotb tests of :mod:`dnnfab.cosim.tb_dma`: random round trips, throughput, errors.
"""

import json

import pytest

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.cosim import runner
from dnnfab.cosim.harness import dma_harness_verilog

#: Cycles a contiguous read takes beyond its beat count, from the cycle the command is
#: accepted to the cycle of rd_done: 4 in the DMA (intake register -> initial-state register
#: -> burst generator -> AR register) + 2 in cocotbext-axi's AxiRam (first rvalid 2 cycles after arvalid); the
#: R -> sp_we register and the rd_done pulse share the last cycle. See docs/dma_csr.md.
READ_SLACK = 6
#: The same for a contiguous write, to wr_done: 4 (window check, n1 = n2 = 1) + 1 (burst
#: generator) + 1 (burst queue) + 1 (beat issue register) + 5 (scratchpad read: two request
#: registers, block RAM, its output register, the read-data register) + 1 (W buffer)
#: before the first W beat, then the AxiRam's B latency and the wr_done register (measured
#: 15, deterministic).
WRITE_SLACK = 15

#: bus width -> (max_burst, groups of random round trips, contiguous beats timed)
SETUPS = {64: (16, 40, 1024), 128: (32, 30, 768), 256: (64, 20, 512)}

#: 256-bit runs on Icarus only (a third Verilator build would cost ~40 s of the budget).
CASES = [pytest.param(sim, bb, id=f"bus{bb}-{sim}",
                      marks=pytest.mark.skipif(not runner.available(sim), reason=f"{sim} not installed"))
         for bb in SETUPS for sim in runner.SIMULATORS if not (bb == 256 and sim == "verilator")]


@pytest.mark.cosim
@pytest.mark.parametrize("sim,bus_bits", CASES)
def test_dma(sim, bus_bits, tmp_path):
    max_burst, groups, stream_beats = SETUPS[bus_bits]
    cfg = AcceleratorConfig(bus_bits=bus_bits, max_burst=max_burst)
    vfile, module = dma_harness_verilog(cfg, sp_depth=1024)
    report = tmp_path / "dma"
    params = dict(bus_bits=bus_bits, addr_bits=cfg.addr_bits, max_burst=max_burst, sp_depth=1024,
                  seed=bus_bits, groups=groups, stream_beats=stream_beats, slack=READ_SLACK,
                  write_slack=WRITE_SLACK,
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

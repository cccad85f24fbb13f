"""The generated systolic-array Verilog under cocotb, on Verilator and Icarus, vs numpy."""

import pytest

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.cosim.designs import generated
from dnnfab.cosim import runner

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]

# (rows, cols) -> GEMM cases; K and N are deliberately not multiples of the array.
CASES = {
    (2, 2): [{"n": 7, "k": 5, "m": 3, "seed": 1}, {"n": 30, "k": 9, "m": 4, "seed": 2, "stall": 0.3}],
    (4, 4): [{"n": 13, "k": 11, "m": 6, "seed": 3}, {"n": 9, "k": 8, "m": 4, "seed": 4, "fill": "min"},
             {"n": 5, "k": 4, "m": 4, "seed": 5, "fill": "zero"}, {"n": 40, "k": 17, "m": 9, "seed": 6, "stall": 0.25}],
    (8, 8): [{"n": 64, "k": 256, "m": 8, "seed": 7}, {"n": 33, "k": 20, "m": 11, "seed": 8},
             {"n": 3, "k": 8, "m": 8, "seed": 9, "fill": "max"}, {"n": 40, "k": 24, "m": 8, "seed": 10, "stall": 0.3}],
    (4, 8): [{"n": 21, "k": 10, "m": 13, "seed": 11}, {"n": 30, "k": 6, "m": 8, "seed": 12, "stall": 0.2}],
}


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
@pytest.mark.parametrize("shape", list(CASES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_systolic_gemm(sim, shape, tmp_path):
    rows, cols = shape
    cfg = AcceleratorConfig(rows=rows, cols=cols)
    vfile, module, manifest = generated(cfg, "array")
    params = dict(rows=rows, cols=cols, input_bits=cfg.input_bits, weight_bits=cfg.weight_bits,
                  acc_bits=cfg.acc_bits, tag_bits=manifest["array"]["tag_bits"], cases=CASES[shape],
                  report=str(tmp_path / "report.json"))
    result = runner.run([vfile], module, "dnnfab.cosim.tb_systolic", sim=sim, params=params)
    assert result.tests == 1 and result.failed == 0


@pytest.mark.cosim
@pytest.mark.skipif(not runner.available("icarus"), reason="icarus not installed")
def test_failing_run_reports_waveform():
    """A failing co-simulation is re-run with waves and the error names the file."""
    cfg = AcceleratorConfig(rows=2, cols=2)
    vfile, module, manifest = generated(cfg, "array")
    # the testbench unpacks results with the wrong accumulator width: must fail
    params = dict(rows=2, cols=2, input_bits=8, weight_bits=8, acc_bits=16,
                  tag_bits=manifest["array"]["tag_bits"], cases=[{"n": 4, "k": 2, "m": 2, "seed": 1}])
    with pytest.raises(runner.CosimFailure) as info:
        runner.run([vfile], module, "dnnfab.cosim.tb_systolic", sim="icarus", params=params)
    msg = str(info.value)
    assert "waveform:" in msg
    from pathlib import Path
    wave = Path(msg.split("waveform:")[1].split(" (")[0].strip())
    assert wave.exists() and wave.stat().st_size > 0
    assert " MB, from " in msg

"""The ECP5 variant of the PE (products registered inside MULT18X18D, chosen by synthesis
for ECP5 boards) streams GEMMs bit-exact and cycle-exact, like the behavioural array."""

from pathlib import Path

import pytest

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.generate import verilog_text, SynthHints
from dnnfab.hw.systolic import SystolicArray
from dnnfab.cosim import runner
from dnnfab.cosim.designs import hw_source_hash

MODEL = Path(runner.__file__).parent / "models" / "mult18x18d.v"


@pytest.mark.cosim
@pytest.mark.skipif(not runner.available("icarus"), reason="icarus not installed")
@pytest.mark.parametrize("shape", [(4, 4), (8, 2)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_ecp5_pe_array(shape):
    rows, cols = shape
    cfg = AcceleratorConfig(rows=rows, cols=cols)
    arr = SystolicArray(cfg, tag_bits=8)
    out = runner.cache_root() / "verilog" / f"array-ecp5-{cfg.config_hash()}-{hw_source_hash()}"
    out.mkdir(parents=True, exist_ok=True)
    vfile = out / "dnnfab_systolic.v"
    text = verilog_text(arr, "dnnfab_systolic", platform=SynthHints(dnnfab_mult="ecp5"))
    assert text.count("MULT18X18D") == rows * cols
    vfile.write_text(text)
    cases = [{"n": 30, "k": 3 * rows + 1, "m": cols + 1, "seed": 1},
             {"n": 5, "k": rows, "m": cols, "seed": 2, "fill": "min"},
             {"n": 20, "k": 2 * rows, "m": cols, "seed": 3, "stall": 0.3}]
    params = dict(rows=rows, cols=cols, input_bits=8, weight_bits=8, acc_bits=32, tag_bits=8, cases=cases)
    res = runner.run([vfile, MODEL], "dnnfab_systolic", "dnnfab.cosim.tb_systolic", sim="icarus", params=params)
    assert res.failed == 0

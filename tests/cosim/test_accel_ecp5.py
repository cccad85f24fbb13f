"""The accelerator as synthesized for ECP5 (DSP multipliers and block RAMs instantiated as
MULT18X18D / DP16KD primitives with their registers, see hw/pe.py and hw/scratchpad.py)
runs whole layers bit-exact, like the behavioural build, with simulation models of the
primitives."""

import json
from pathlib import Path

import pytest

from presets import CFG_SMALL
from dnnfab.hw.generate import verilog_text, SynthHints
from dnnfab.hw.top import Accelerator
from dnnfab.cosim import runner
from dnnfab.cosim.designs import hw_source_hash
from dnnfab.cosim.dram import run_accel

MULT_MODEL = Path(runner.__file__).parent / "models" / "mult18x18d.v"
BRAM_MODEL = Path(__file__).parent / "models" / "dp16kd.v"
FF_MODEL = Path(__file__).parent / "models" / "trellis_ff.v"

CFG = CFG_SMALL
LAYERS = [
    dict(cin=3, cout=10, k=3, stride=1, pad=1, hw=[6, 5], seed=1),
    dict(cin=5, cout=7, k=5, stride=1, pad=2, hw=[7, 6], seed=3),
    dict(cin=37, cout=11, k=1, stride=1, pad=0, hw=[1, 3], seed=7, name="gemm"),
]


@pytest.mark.cosim
@pytest.mark.skipif(not runner.available("verilator"), reason="verilator not installed")
def test_accel_ecp5_primitives(tmp_path):
    out = runner.cache_root() / "verilog" / f"accel-ecp5-{CFG.config_hash()}-{hw_source_hash()}"
    out.mkdir(parents=True, exist_ok=True)
    vfile = out / "dnnfab_accel.v"
    text = verilog_text(Accelerator(CFG), "dnnfab_accel", platform=SynthHints(dnnfab_mult="ecp5"))
    assert text.count("MULT18X18D ") > CFG.rows * CFG.cols      # PEs, requantizer, decode
    assert "DP16KD " in text                                    # accumulator, scratchpads
    assert "TRELLIS_FF " in text                                # scratchpad request copies
    vfile.write_text(text)
    rep = tmp_path / "r.json"
    run_accel(CFG, "layers", {"layers": LAYERS, "report": str(rep)}, sim="verilator",
              accel=([vfile, MULT_MODEL, BRAM_MODEL, FF_MODEL], "dnnfab_accel"))
    report = json.loads(rep.read_text())
    assert len(report) == len(LAYERS) and all(r["bit_exact"] for r in report)

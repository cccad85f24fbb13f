"""Whole conv/GEMM layers through the generated accelerator (cocotb + the Verilog DRAM of
cosim/dram.py), bit-exact, plus fault injection. Every layer also checks the perf counters
and that DRAM outside the output region is untouched (see cosim/tb_accel.py); the DRAM
models' agreement with cocotbext-axi's AxiRam is tests/cosim/test_cosim_dram.py."""

import json

import pytest

from dnnfab.hw.config import AcceleratorConfig
from presets import CFG_SMALL
from dnnfab.cosim import runner
from dnnfab.cosim.dram import DEFAULT_DRAM, run_accel
from dnnfab.sw.compiler.layer import random_layer
from dnnfab.sw.compiler.program import compile_layer
from dnnfab.sw.compiler.fastmodel import estimate_cycles

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]
VERILATOR = pytest.param("verilator", marks=pytest.mark.skipif(not runner.available("verilator"),
                                                                reason="verilator not installed"))

CFG_8 = AcceleratorConfig(rows=8, cols=8, bus_bits=128, act_kib=16, wgt_kib=16, acc_kib=16, out_kib=8, aux_kib=1)

# cin, cout, k, stride, pad, hw: 1x1, 3x3 padded, 5x5, 7x7 stride 2, C_in=3, C_out=10,
# K not a multiple of the array, 1x1 spatial, dilation, a GEMM (1x1 conv over 1 x N), a
# one-pixel-wide image
LAYERS_SMALL = [
    dict(cin=3, cout=10, k=3, stride=1, pad=1, hw=[6, 5], seed=1),
    dict(cin=16, cout=16, k=1, stride=1, pad=0, hw=[4, 4], seed=2),
    dict(cin=5, cout=7, k=5, stride=1, pad=2, hw=[7, 6], seed=3),
    dict(cin=3, cout=8, k=7, stride=2, pad=3, hw=[9, 9], seed=4),
    dict(cin=9, cout=6, k=1, stride=1, pad=0, hw=[1, 1], seed=5),
    dict(cin=6, cout=5, k=3, stride=1, pad=2, hw=[6, 6], dilation=2, seed=6),
    dict(cin=37, cout=11, k=1, stride=1, pad=0, hw=[1, 3], seed=7, name="gemm"),
    dict(cin=21, cout=6, k=1, stride=1, pad=0, hw=[1, 2], seed=8, name="gemm2"),
    # one pixel wide: every pixel starts a new output row (consecutive row jumps)
    dict(cin=5, cout=6, k=3, stride=1, pad=1, hw=[5, 1], seed=9, name="column"),
    # one pixel, 3x3 padded kernel, two channel blocks: every issue is a K-tile jump, through
    # cb, kw and kh in turn, mostly into the padding
    dict(cin=6, cout=5, k=3, stride=1, pad=1, hw=[1, 1], seed=10, name="pixel3x3"),
    # jobs of 256, 256, 256, 256, 1, 1 pixels with one K tile each: a one-beat job right
    # behind a long one (two back-end job ends one cycle apart), then another one-beat job
    # (the back end's next-job register refills a cycle after each take)
    dict(cin=3, cout=8, k=1, stride=1, pad=0, hw=[513, 1], seed=17, name="tail1"),
]
LAYERS_8 = [
    dict(cin=3, cout=10, k=3, stride=1, pad=1, hw=[12, 10], seed=11),
    dict(cin=20, cout=24, k=5, stride=1, pad=2, hw=[9, 9], seed=12),
    dict(cin=3, cout=16, k=7, stride=2, pad=3, hw=[17, 15], seed=13),
    dict(cin=70, cout=33, k=3, stride=2, pad=0, hw=[11, 11], seed=14),
    dict(cin=100, cout=10, k=1, stride=1, pad=0, hw=[1, 1], seed=15, name="fc"),
    dict(cin=64, cout=64, k=3, stride=1, pad=1, hw=[24, 24], seed=16, name="banded"),
]


def _run(cfg, layers, sim, tmp_path, test="layers", dram=DEFAULT_DRAM):
    rep = tmp_path / "r.json"
    run_accel(cfg, test, {"layers": layers, "report": str(rep)}, sim=sim, dram=dram)
    return json.loads(rep.read_text())


#: the fault cases of tb_accel.errors
FAULTS = {"axi_read_slverr", "axi_read_slverr_beat", "axi_write_slverr", "axi_write_slverr_burst",
          "illegal_opcode", "outside_window", "hang", "clean"}


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
def test_accel_layers_small(sim, tmp_path):
    report = _run(CFG_SMALL, LAYERS_SMALL, sim, tmp_path)
    assert len(report) == len(LAYERS_SMALL) and all(r["bit_exact"] for r in report)


@pytest.mark.cosim
@pytest.mark.parametrize("sim", [VERILATOR])
def test_accel_layers_8x8(sim, tmp_path):
    report = _run(CFG_8, LAYERS_8, sim, tmp_path)
    assert len(report) == len(LAYERS_8)
    # the analytical model of the fast backend tracks the RTL (FINN-style check)
    for spec, r in zip(LAYERS_8, report):
        rng = __import__("numpy").random.default_rng(spec["seed"])
        layer = random_layer(rng, spec["cin"], spec["cout"], k=spec["k"], stride=spec["stride"],
                             pad=spec["pad"], in_hw=tuple(spec["hw"]), dilation=spec.get("dilation", 1))
        est = estimate_cycles(compile_layer(layer, CFG_8)).cycles
        assert abs(est - r["cycles"]) <= max(64, 0.05 * r["cycles"]), (spec, est, r["cycles"])


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
def test_accel_fault_injection(sim, tmp_path):
    """SLVERR on a read beat (by address and by beat number) and on a write (by address and
    by burst number), an illegal instruction, a store outside the window, a program that
    never finishes (watchdog), then a clean bit-exact run after soft resets."""
    figures = _run(CFG_SMALL, [], sim, tmp_path, test="errors")
    assert set(figures) == FAULTS
    assert figures["hang"]["watchdog_limit"] == 2000 and figures["hang"]["status"] & 1

"""The Verilog DRAM of the co-simulation (cosim/models/axi_dram.v, cosim/dram.py) is a
faithful stand-in for cocotbext-axi's AxiRam:

* on random AXI4 traffic (every burst size and length, W before AW, strobes, RREADY /
  BREADY stalls, reads racing writes, injected faults) its ready / valid / payload
  signals equal AxiRam's in every cycle, and the memories agree (cosim/tb_dram.py);
* under the accelerator, every AXI handshake of whole layers happens in the same cycle
  with the same payload, the perf counters are equal, and the fault cases give the same
  figures (error codes, ERROR_INFO, cycles to the interrupt);
* each AXI rule it checks is flagged (and answered SLVERR), and the bulk host access
  round-trips at unaligned addresses.
"""

import json
from pathlib import Path

import pytest

from presets import CFG_SMALL
from dnnfab.cosim import runner
from dnnfab.cosim.dram import MODEL, run_accel

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]
PAIR = Path(__file__).parent / "models" / "dram_pair.v"

pytestmark = pytest.mark.cosim


def _pair(sim, test, tmp_path, **params):
    rep = tmp_path / f"{test}.json"
    runner.run([MODEL, PAIR], "dnnfab_dram_pair", "dnnfab.cosim.tb_dram", sim=sim, testcase=test,
               params={"report": str(rep), **params})
    return json.loads(rep.read_text())


@pytest.mark.parametrize("sim", SIMS)
def test_dram_equals_axiram_on_random_traffic(sim, tmp_path):
    stats = _pair(sim, "equivalence", tmp_path, seed=3, cycles=2500)
    # the traffic reached what it is meant to: errors answered, W ahead of AW
    assert stats["r"] > 1000 and stats["b"] > 100, stats
    assert stats["r_err"] > 0 and stats["b_err"] > 0 and stats["w_before_aw"] > 0, stats


@pytest.mark.parametrize("sim", SIMS)
def test_dram_checks_axi_rules(sim, tmp_path):
    found = _pair(sim, "rules", tmp_path, max_burst=64)
    assert len(found) == 12


@pytest.mark.parametrize("sim", SIMS)
def test_dram_bulk_host_access(sim, tmp_path):
    figures = _pair(sim, "host_access", tmp_path)
    assert figures["words"] == 1 << 16


LAYERS = [
    dict(cin=3, cout=10, k=3, stride=1, pad=1, hw=[6, 5], seed=1),
    dict(cin=5, cout=7, k=5, stride=1, pad=2, hw=[7, 6], seed=3),
    dict(cin=37, cout=11, k=1, stride=1, pad=0, hw=[1, 3], seed=7, name="gemm"),
    # several row bands: loads and stores overlapping computes
    dict(cin=3, cout=8, k=1, stride=1, pad=0, hw=[513, 1], seed=17, name="tail1"),
]


def _accel(sim, dram, test, tmp_path, **params):
    rep = tmp_path / f"{dram}-{test}.json"
    run_accel(CFG_SMALL, test, {"report": str(rep), **params}, sim=sim, dram=dram)
    return json.loads(rep.read_text())


@pytest.mark.parametrize("sim", SIMS)
def test_accelerator_sees_the_same_dram(sim, tmp_path):
    """Every AXI handshake of whole layers in the same cycle with the same payload."""
    layers = LAYERS if sim == "verilator" else LAYERS[:2]
    got = {d: _accel(sim, d, "layers", tmp_path, layers=layers, axi_trace=True) for d in ("axiram", "verilog")}
    for a, v in zip(got["axiram"], got["verilog"]):
        assert a["bit_exact"] and v["bit_exact"]
        assert a["cycles"] == v["cycles"] and a["counters"] == v["counters"] and a["tb_cycles"] == v["tb_cycles"]
        assert len(a["axi"]) > 100
        first = next((i for i, (x, y) in enumerate(zip(a["axi"], v["axi"])) if x != y), None)
        assert first is None and len(a["axi"]) == len(v["axi"]), \
            (a["layer"], first, a["axi"][first] if first is not None else None,
             v["axi"][first] if first is not None else None)


def test_fault_figures_equal_on_both_drams(tmp_path):
    if not runner.available("verilator"):
        pytest.skip("verilator not installed")
    a = _accel("verilator", "axiram", "errors", tmp_path)
    v = _accel("verilator", "verilog", "errors", tmp_path)
    assert a == v

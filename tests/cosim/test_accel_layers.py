"""Whole conv/GEMM layers through the generated accelerator (cocotb + AXI RAM), bit-exact."""

import json

import pytest

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.cosim.designs import generated
from dnnfab.cosim import runner

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]

CFG_SMALL = AcceleratorConfig(rows=4, cols=4, bus_bits=64, act_kib=8, wgt_kib=8, acc_kib=8, out_kib=4, aux_kib=1)

LAYERS_QUICK = [
    dict(cin=3, cout=10, k=3, stride=1, pad=1, hw=[6, 5], seed=1),
    dict(cin=16, cout=16, k=1, stride=1, pad=0, hw=[4, 4], seed=2),
]


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
def test_accel_quick(sim, tmp_path):
    vfile, module, _ = generated(CFG_SMALL, "accelerator")
    rep = tmp_path / "r.json"
    runner.run([vfile], module, "dnnfab.cosim.tb_accel", sim=sim,
               params={"config": CFG_SMALL.to_dict(), "layers": LAYERS_QUICK, "report": str(rep)})
    assert len(json.loads(rep.read_text())) == len(LAYERS_QUICK)

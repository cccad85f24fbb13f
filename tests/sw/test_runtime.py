"""Network runtime: conv/GEMM on the fabric model, the rest on the CPU, bit-exact; faults fall back."""

import json

import numpy as np
import pytest

import dnnfab
from dnnfab.cli import main
from dnnfab.errors import FabricError
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.models import datasets
from dnnfab.sw.runtime import run_network


@pytest.fixture(scope="module")
def eeg():
    g = dnnfab.load("eeg-seizure")
    xtr, _, xte, yte = datasets.eeg_split(n_train=16, n_test=4)
    name = g.inputs[0].name
    q = dnnfab.quantize(g, calibration=[{name: xtr[i:i + 1]} for i in range(16)])
    return q, name, xte


@pytest.mark.parametrize("cfg", [AcceleratorConfig(), AcceleratorConfig(rows=4, cols=8, bus_bits=64, act_kib=4,
                                                                       wgt_kib=4, acc_kib=4, out_kib=4, aux_kib=1)],
                         ids=["default", "small"])
def test_network_on_fabric_is_bit_exact(eeg, cfg):
    q, name, xte = eeg
    res = run_network(q, {name: xte[:1]}, cfg, check=True)
    assert res.bit_exact
    fabric = [r for r in res.layers if r.where == "fabric"]
    assert {r.op for r in fabric} == {"conv", "gemm"}
    assert res.fabric_cycles > sum(r.macs for r in fabric) / (cfg.rows * cfg.cols)


def test_fabric_fault_falls_back_to_cpu(eeg):
    q, name, xte = eeg
    res = run_network(q, {name: xte[:1]}, check=True, inject_fault="conv2")
    assert res.bit_exact
    assert res.faults and res.faults[0]["layer"] == "conv2"
    assert [r.where for r in res.layers if r.name == "conv2"] == ["cpu (fallback)"]
    with pytest.raises(FabricError):
        run_network(q, {name: xte[:1]}, fallback=False, inject_fault="conv2")


def test_cli_run_json(capsys):
    assert main(["run", "eeg-seizure", "--samples", "2", "--calib", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bit_exact_vs_reference"] is True
    assert out["fabric_cycles_per_inference"] > 0


def test_cli_run_bad_model(capsys):
    assert main(["run", "no-such-model", "--samples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0]

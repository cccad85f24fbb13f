"""Network runtime: conv/GEMM on the fabric model, the rest on the CPU, bit-exact; faults fall back."""

import json

import numpy as np
import pytest

import dnnfab
from dnnfab.cli import main
from dnnfab.errors import FabricError
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.models import datasets
from dnnfab.sw.runtime import InferenceSession
from dnnfab.sw.cpu.reference import run_reference


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
    sess = InferenceSession(q, config=cfg, cache_dir=False)
    feed = {name: xte[:1]}
    out = sess.run_int(feed)
    ref = run_reference(q, q.quantize_inputs(feed))
    assert all(np.array_equal(out[k], ref[k]) for k in ref)
    fabric = [r for r in sess.profile() if r["target"] == "fabric"]
    assert {r["op"] for r in fabric} == {"conv", "gemm"}
    assert sum(r["cycles"] for r in fabric) > sum(r["macs"] for r in fabric) / (cfg.rows * cfg.cols)


def test_cli_run_json(capsys):
    assert main(["run", "eeg-seizure", "--samples", "2", "--calib", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bit_exact_vs_reference"] is True
    assert out["fabric_cycles_per_inference"] > 0


def test_cli_run_bad_model(capsys):
    assert main(["run", "no-such-model", "--samples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0]


# ------------------------------------------------------------------ placement: one decision
from dnnfab.sw.runtime import place_layer, plan_network  # noqa: E402
from . import models_helper as mh  # noqa: E402

PLACEMENT_CASES = ["conv_bn_relu", "conv_stride_pads", "conv_dilated_relu6", "conv_depthwise",
                   "conv_grouped", "conv1d", "gemm", "matmul_add_softmax", "matmul_3d", "maxpool",
                   "global_avgpool", "residual_bn_concat", "layout_ops"]


@pytest.mark.parametrize("case", PLACEMENT_CASES)
def test_float_and_quantized_placement_agree(case):
    """``dnnfab inspect`` places the float graph, ``dnnfab run`` the quantized one: the
    same function, the same answer, and a reason for every CPU layer only."""
    g = dnnfab.load(mh.case(case))
    q = dnnfab.quantize(g, calibration=mh.input_feed(g, n=2))
    for cfg in (AcceleratorConfig(), AcceleratorConfig(rows=4, cols=4, bus_bits=64, act_kib=4, wgt_kib=4,
                                                       acc_kib=4, out_kib=4, aux_kib=1)):
        pf, pq = plan_network(g, cfg), plan_network(q, cfg)
        assert [(k, p.where, p.reason) for k, p in pf.items()] == [(k, p.where, p.reason) for k, p in pq.items()]
        for L in q.layers:
            p = pq[L.name]
            assert (p.where == "fabric") == (p.program is not None) == (p.reason == "")
            assert p.where == "cpu" or L.op in ("conv", "gemm")


def test_placement_reasons_name_the_limit():
    g = dnnfab.load(mh.case("conv_depthwise"))
    (conv,) = [L for L in g.layers if L.op == "conv"]
    p = place_layer(conv, g.shape(conv.inputs[0]))
    assert p.where == "cpu" and p.reason.startswith("depthwise conv (groups=8): left to the CPU")
    g = dnnfab.load(mh.case("conv_grouped"))
    (conv,) = [L for L in g.layers if L.op == "conv"]
    assert place_layer(conv, g.shape(conv.inputs[0])).reason.startswith("grouped conv (groups=4)")
    g = dnnfab.load("vgg19")
    fc6 = next(L for L in g.layers if L.op == "gemm")
    p = place_layer(fc6, g.shape(fc6.inputs[0]))
    assert p.reason == "25088 input channels exceed the 1023 R-blocks an instruction can address"


def test_session_compiles_once(eeg):
    q, name, xte = eeg
    sess = InferenceSession(q, cache_dir=False)
    a = sess.run_int({name: xte[:1]})
    net = sess.net
    pa = sess.profile()
    b = sess.run_int({name: xte[1:2]})
    assert sess.net is net                                   # compiled on first use only
    c = sess.run_int({name: xte[:1]})
    assert all(np.array_equal(a[k], c[k]) for k in a)
    assert [(r["target"], r["cycles"], r["reason"]) for r in pa] == \
        [(r["target"], r["cycles"], r["reason"]) for r in sess.profile()]
    assert all(r["reason"] for r in pa if r["target"] != "fabric")


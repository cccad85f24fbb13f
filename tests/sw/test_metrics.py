"""The metric model (sw/metrics/model.py): options, bounds, monotone energies, sources,
and the small form of scripts/validate_metrics.py."""

import importlib.util
from pathlib import Path

import pytest

from dnnfab.boards import get_board
from dnnfab.sw.compiler.placement import place_layer
from dnnfab.sw.metrics import MetricModel, NetworkCost, ResourceModel, layer_macs, split_channels
from dnnfab.sw.metrics.costs import Option

BOARDS = ("ulx3s-85f", "pynq-z2")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qg():
    import dnnfab
    return dnnfab.InferenceSession("digits-cnn").qg


@pytest.fixture(scope="module", params=BOARDS)
def board_cost(request, qg):
    mm = MetricModel(request.param)
    return mm, mm.network(qg, workers=2)


def test_options_present_and_positive(board_cost, qg):
    mm, nc = board_cost
    assert isinstance(nc, NetworkCost) and nc.workers == 2
    assert [L.name for L in nc.layers] == [L.name for L in qg.layers]
    for L in nc.layers:
        assert "cpu" in L.options
        for o in L.options.values():
            assert isinstance(o, Option)
            assert o.latency_s > 0 and o.energy_j > 0
            for r in o.uses:
                assert (o.fabric_s if r == "fabric" else o.cpu_s) > 0
        assert L.out_bytes > 0


def test_layer_graph_fields(board_cost, qg):
    _, nc = board_cost
    by = {L.name: L for L in nc.layers}
    assert by["conv1"].inputs == [] and by["conv1"].graph_input_bytes == 64
    assert by["pool1"].inputs == ["conv1"] and by["pool1"].graph_input_bytes == 0
    assert by["fc2"].is_output and not by["fc1"].is_output
    assert by["conv1"].out_bytes == 16 * 8 * 8
    assert by["conv2"].macs == 32 * 4 * 4 * 16 * 9


def test_fabric_option_iff_placement_maps(board_cost, qg):
    mm, nc = board_cost
    for L, C in zip(qg.layers, nc.layers):
        shp = tuple(qg.shape(L.inputs[0]))
        maps = place_layer(L, shp, mm.cfg).where == "fabric"
        assert ("fabric" in C.options) == maps, L.name
        assert bool(C.reason) == (not maps)


def test_split_between_bounds(board_cost):
    mm, nc = board_cost
    res = mm.resources(2)
    n = 0
    for L in nc.layers:
        for k, o in L.options.items():
            if not k.startswith("split:"):
                continue
            n += 1
            c = int(k.split(":")[1])
            fab, cpu = L.options["fabric"], L.options["cpu"]
            assert 0 < c < o.detail["cout"] and o.fabric_channels == c
            d = o.detail
            # its parts never exceed the pure options (plus the move back and the join)
            assert d["fabric_part_s"] <= fab.fabric_s + res.transfer_s(L.out_bytes) + 1e-12
            assert d["cpu_part_s"] <= cpu.cpu_s + 1e-3
            assert max(d["fabric_part_s"], d["cpu_part_s"]) <= o.latency_s
            assert o.latency_s <= max(fab.latency_s + res.transfer_s(L.out_bytes),
                                      cpu.latency_s + 1e-3) + d["join_s"] + 1e-12
    assert n > 0


def test_split_channels_rounding():
    assert split_channels(64, 0.5, 8) == 32
    assert split_channels(64, 0.25, 8) == 16
    assert split_channels(10, 0.25, 8) == 2          # no multiple of 8 inside (0, 10) at 0.25
    assert split_channels(1, 0.5, 8) is None


def test_energies_monotone_in_work(qg):
    from dnnfab.sw.compiler.network import LayerInfo
    for b in BOARDS:
        mm = MetricModel(b)
        lo = mm.fabric_option(LayerInfo("a", "conv", "fabric", cycles=1000, dram_rd_bytes=1000))
        hi = mm.fabric_option(LayerInfo("b", "conv", "fabric", cycles=4000, dram_rd_bytes=4000))
        assert hi.energy_j > lo.energy_j and hi.latency_s > lo.latency_s
        # cpu: conv2 has 8x the MACs of conv1
        by = {L.name: L for L in qg.layers}
        c1 = mm.cpu_option(qg, by["conv1"], 1)
        c2 = mm.cpu_option(qg, by["conv2"], 1)
        assert layer_macs(qg, by["conv2"]) > layer_macs(qg, by["conv1"])
        assert c2.energy_j > c1.energy_j and c2.latency_s > c1.latency_s
        # more workers: faster, not cheaper in energy per MAC than ideal scaling
        c2w = mm.cpu_option(qg, by["conv2"], 2)
        assert c2w.latency_s < c2.latency_s


def test_every_constant_has_a_source(board_cost):
    mm, _ = board_cost
    res = mm.resources(2)
    assert isinstance(res, ResourceModel)
    used = mm.sources()
    assert len(used) >= 15
    for k, v in used.items():
        assert v["source"].strip(), f"{k} has no source"
    assert res.idle_w["board"] > 0 and res.transfer_bytes_per_s > 0
    # the figures the issue names
    b = get_board(mm.board.id)
    if b.id == "ulx3s-85f":
        assert b.power["board_idle_w"] == pytest.approx(0.20, abs=0.01)
        assert b.power["ff_toggle_pj"] == pytest.approx(0.25, abs=0.01)
    else:
        assert 1.2 < res.idle_w_total <= 1.58 + 1e-9       # below the MLPerf Tiny loaded 1.58 W


def test_estimates_are_marked():
    for b in BOARDS:
        bd = get_board(b)
        n_est = sum("estimate" in str(v) for sec in ("power", "cpu_model", "launch", "transfer",
                                                      "local_host")
                    for k, v in bd.section(sec).items() if k.endswith("_source"))
        assert n_est >= 5


def test_clock_override(qg):
    a = MetricModel("ulx3s-85f").network(qg, 1, splits=())
    b = MetricModel("ulx3s-85f", clock_mhz=50).network(qg, 1, splits=())
    fa = a.layer("conv2").options["fabric"].detail
    fb = b.layer("conv2").options["fabric"].detail
    assert fb["compute_s"] == pytest.approx(2 * fa["compute_s"])


def test_validation_small_form(tmp_path):
    spec = importlib.util.spec_from_file_location("validate_metrics",
                                                  ROOT / "scripts" / "validate_metrics.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rep = mod.validate(["digits-cnn"], board="ulx3s-85f", workers=1, repeats=3,
                       profile_path=tmp_path / "prof.json")
    m = rep["models"]["digits-cnn"]
    assert m["fabric"]["layers"] and m["cpu"]["layers"]
    for r in m["fabric"]["layers"]:
        assert r["driver_cycles"] == r["model_cycles"]       # same fast model, per launch
    assert m["cpu"]["median_abs_err"] >= 0
    # the model is the profile's median, compared with a fresh median of the same kind of
    # runs; the fastest runs beside them
    for r in m["cpu"]["layers"]:
        assert 0 < r["measured_min_ms"] <= r["measured_ms"] + 1e-4
        assert 0 < r["model_min_ms"] <= r["model_ms"] + 1e-4
    assert rep["cpu_summary_min"]["n"] == rep["cpu_summary"]["n"] == len(m["cpu"]["layers"])
    chk = mod.board_cpu_check("ulx3s-85f")          # the ESP32 model vs a published time
    assert chk["model_ms"] > 0 and chk["measured_ms"] == 380.0 and chk["source"]


def test_local_host_floors_fabric_at_the_measured_emulation(qg, tmp_path):
    """Host local: a fabric layer lasts max(board time, the model backend's measured launch
    time here) plus the runtime's cost per layer; the launch profile is measured once,
    cached on disk per machine, network and model-code version, and read back."""
    import json
    from dnnfab.sw.driver.emulation import LaunchProfile, code_key
    path = tmp_path / "launch.json"
    emu = LaunchProfile(path, repeats=3)
    mm = MetricModel("pynq-z2", host="local", emulation=emu)
    net = mm.compiled(qg)
    meas = emu.launch_s(net)
    fab = [n for n, i in net.layers.items() if i.target == "fabric"]
    assert fab and set(fab) <= set(meas) and all(meas[n] > 0 for n in fab)
    raw = json.loads(path.read_text())
    assert f"{net.key}:{code_key()}" in raw["machines"][emu.machine]
    assert LaunchProfile(path).launch_s(net) == meas           # read back, not measured
    nc = mm.network(qg, workers=1, splits=())
    rt = mm.runtime_layer_s()
    assert rt > 0
    for L in nc.layers:
        o = L.options.get("fabric")
        if o is None:
            continue
        d = o.detail
        assert d["emulation_s"] == meas[L.name]
        assert o.latency_s == pytest.approx(max(d["board_s"], meas[L.name]) + rt)
        assert d["bound_by_emulation"] == (meas[L.name] > d["board_s"])
        assert L.options["cpu"].latency_s == pytest.approx(L.options["cpu"].detail["ms"] / 1e3 + rt)
    # a board's own timeline: no emulation, no runtime cost
    mb = MetricModel("pynq-z2", host="board", emulation=emu)
    assert mb.emulation is None and mb.runtime_layer_s() == 0.0

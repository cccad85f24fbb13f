"""The benchmark and fuzzing scripts run in CI in a small form, through their own command
lines (a figure whose script silently stops working is the worst kind of bug)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dnnfab.cosim import runner

REPO = Path(__file__).resolve().parent.parent
VERILATOR = pytest.mark.skipif(not runner.available("verilator"), reason="verilator not installed")


def _run(*args, timeout=900):
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_bench_gemm_small():
    """The exact engine is exact; the u8 x s8 kernel it replaced is reported as it is."""
    out = json.loads(_run("scripts/bench_gemm.py", "--shapes", "32x64x16", "--repeat", "1", "--json"))
    (res,) = out["results"]
    engines = {e["engine"]: e for e in res["engines"]}
    assert engines["ort u8u8"]["wrong"] == 0 and engines["ort u8u8"]["outputs"] == 32 * 16
    assert engines["f32 BLAS"]["wrong"] == 0
    assert all(e["gops"] > 0 for e in res["engines"])


@pytest.mark.wallclock                 # deadlines in wall-clock time: run alone
@pytest.mark.xdist_group("realtime")   # real-time runs never side by side
def test_bench_runtime_small(tmp_path):
    """The real-mode benchmark in small: a plan for this machine run for real, digits-cnn
    at 25 fps with eeg-seizure, 150 frames; no miss, bit-exact, the plan's bound inside
    the deadline less its margin."""
    out_file = tmp_path / "r.json"
    _run("scripts/bench_runtime.py", "--frames", "150", "--fps", "25", "--json", str(out_file),
         timeout=900)
    out = json.loads(out_file.read_text())
    assert out["feasible"] and out["deadline_misses"] == 0 and out["bit_exact"] is True
    d = out["networks"]["digits-cnn"]
    assert d["frames"] > 100 and d["plan_bound_ms"] <= 0.7 * d["deadline_ms"] + 1e-9
    assert out["runtime_layer_s"] > 0


@pytest.mark.wallclock                 # deadlines in wall-clock time: run alone
@pytest.mark.xdist_group("realtime")   # real-time runs never side by side
def test_bench_runtime_zoo_small(tmp_path):
    """The benchmark's zoo case in small: squeezenet with eeg-seizure, planned for this
    machine and run for real at 2 fps (the plan's bound, about 220 ms of the 500 ms
    deadline, leaves a loaded CI machine headroom); some layers on the fabric, no miss,
    bit-exact."""
    out_file = tmp_path / "z.json"
    _run("scripts/bench_runtime.py", "--model", "squeezenet", "--fps", "2", "--frames", "20",
         "--json", str(out_file), timeout=900)
    out = json.loads(out_file.read_text())
    assert out["feasible"] and out["deadline_misses"] == 0 and out["bit_exact"] is True
    assert out["networks"]["squeezenet"]["frames"] >= 8 and out["fabric_launches"] > 0


@pytest.mark.cosim
@VERILATOR
def test_fuzz_rtl_script_small(tmp_path):
    out = json.loads(_run("scripts/fuzz_rtl.py", "--count", "3", "--seed", "5", "--config", "small", "--json",
                          "--records", str(tmp_path / "r.jsonl")))
    assert out["cases"] == 3 and out["passed"] == 3 and out["failures"] == []
    recs = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["ok"] and r["rtl_cycles"] > 0 for r in recs)


@pytest.mark.cosim
@VERILATOR
def test_bench_layer_script_small():
    """bench_layer's command line on a small layer of the default 8x8 accelerator (the
    headline layer itself runs in tests/cosim/test_fuzz_rtl.py)."""
    out = json.loads(_run("scripts/bench_layer.py", "--h", "8", "--w", "7", "--cin", "20", "--cout", "12",
                          "--k", "3", "--pad", "1", "--json"))
    assert out["bit_exact"] is True
    assert out["physical_limit_cycles"] <= out["cycles"]
    assert abs(out["model_cycles"] - out["cycles"]) <= max(16, 0.02 * out["cycles"])


def test_bench_session_small(tmp_path):
    """The session benchmark: bit-exact on a bundled and a zoo model, the efficiency and
    compile figures are filled in (speed itself is the benchmark's business)."""
    out_file = tmp_path / "s.json"
    _run("scripts/bench_session.py", "--models", "digits-cnn", "squeezenet", "--repeats", "1",
         "--compile-model", "digits-cnn", "--json", str(out_file), timeout=1500)
    out = json.loads(out_file.read_text())
    assert out["all_bit_exact"] and [m["model"] for m in out["models"]] == ["digits-cnn", "squeezenet"]
    for m in out["models"]:
        assert m["session_ms"] > 0 and m["reference_ms"] > 0 and m["fabric_layers"] > 0
        assert 0 < m["efficiency_unchained"] <= m["efficiency"] * 1.01 <= 1.01
        assert m["runs"] <= m["runs_unchained"] and m["plan_launches"] == m["launches"]
    c = out["compile"]
    assert c["compile_cold_s"] > 0 and c["first_run_cached_s"] > 0


def test_bench_sched_small(tmp_path):
    """The scheduler benchmark: solve time on a DenseNet-sized case is replaced by
    shufflenet (124 layers) here, the savings table and the two-network case run on both
    board profiles; every feasible plan's modelled replay misses nothing."""
    out_file = tmp_path / "s.json"
    _run("scripts/bench_sched.py", "--models", "digits-cnn", "eeg-seizure", "--pair", "digits-cnn",
         "--solve-model", "shufflenet", "--frames", "5", "--json", str(out_file),
         "--plot", str(tmp_path / "s.png"), timeout=1500)
    out = json.loads(out_file.read_text())
    assert {s["board"] for s in out["solve"]} == {"ulx3s-85f", "pynq-z2"}
    for s in out["solve"]:
        assert s["solver"]["status"] in ("optimal", "infeasible")
    cases = {(r["case"], r["board"]) for r in out["savings"]}
    assert ("digits-cnn", "pynq-z2") in cases and ("eeg-seizure", "ulx3s-85f") in cases
    for r in out["savings"]:
        if r["feasible"]:
            assert r["deadline_misses"] == 0 and r["frames"] > 0
            assert r["energy_saving_vs_best_single"] is None or r["energy_saving_vs_best_single"] >= -1e-9
    assert len(out["tight"]) == 4
    assert (tmp_path / "s.png").stat().st_size > 10_000


@pytest.mark.cosim
@VERILATOR
def test_bench_cosim_script_small(tmp_path):
    """bench_cosim (dnnfab cosim MODEL --json, timed) on digits-cnn and the first fabric
    layer of eeg-seizure, one timed run each."""
    out_file = tmp_path / "c.json"
    _run("scripts/bench_cosim.py", "--models", "digits-cnn,eeg-seizure:1", "--repeat", "1",
         "--out", str(out_file), "--json")
    out = json.loads(out_file.read_text())
    assert out["all_bit_exact"] and [r["model"] for r in out["results"]] == ["digits-cnn", "eeg-seizure"]
    digits, eeg = out["results"]
    assert not digits["partial"] and eeg["partial"] and eeg["launches"] == 1
    assert digits["sim_cycles"] >= digits["total_cycles"] > 0 and digits["sim_cycles_per_s"] > 0
    assert digits["max_model_error"] <= 0.02
    assert isinstance(out["digits_cnn_target_met"], bool)

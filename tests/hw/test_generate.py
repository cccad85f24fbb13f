"""`dnnfab generate`: files, manifest, lint-clean Verilog, clear errors."""

import json
import subprocess

import pytest

from dnnfab.cli import main
from dnnfab.cosim import runner


@pytest.mark.parametrize("argv", [["--top", "array", "--rows", "8", "--cols", "8"],
                                  ["--rows", "4", "--cols", "8", "--bus-bits", "64"],
                                  []], ids=["array8x8", "accel4x8", "accel-default"])
def test_generate_lint_clean(tmp_path, argv, capsys):
    assert main(["generate", *argv, "-o", str(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    vfile = tmp_path / manifest["verilog"]
    assert vfile.exists()
    names = {p["name"] for p in manifest["ports"]}
    assert {"clk", "rst"} <= names
    if manifest["top"] == "accelerator":
        assert (tmp_path / "regs.h").exists() and "regmap" in manifest
        assert any(n.startswith("m_axi__") for n in names) and any(n.startswith("s_axil__") for n in names)
    if not runner.available("verilator"):
        pytest.skip("verilator not installed")
    env = dict(__import__("os").environ, **runner.simulator_env("verilator"))
    res = subprocess.run(["verilator", "--lint-only", str(vfile)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("argv,needle", [
    (["--rows", "0"], "rows=0"),
    (["--rows", "8", "--acc-bits", "16"], "acc_bits=16"),
    (["--dataflow", "os"], "output-stationary"),
    (["--dataflow", "xyz"], "unknown dataflow"),
    (["--rows", "6"], "power of two"),
    (["--bus-bits", "100"], "bus_bits=100"),
    (["--rows", "auto"], "--board"),
])
def test_generate_bad_config(tmp_path, argv, needle, capsys):
    assert main(["generate", *argv, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err

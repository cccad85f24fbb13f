"""A failing co-simulation's waveform re-run records only a window before the failure
(a hung 3M-cycle run once wrote a 7.4 GB VCD), and the error names the file and its size."""

import re
from pathlib import Path

import pytest

from dnnfab.hw.config import AcceleratorConfig
from dnnfab.cosim.designs import generated
from dnnfab.cosim import runner

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]
CYCLES = 30000          # 300 us at 10 ns
WINDOW_NS = 20000       # the last 2000 cycles


def _fail(sim, window_ns, monkeypatch):
    monkeypatch.setenv("DNNFAB_WAVE_WINDOW_NS", str(window_ns))
    vfile, module, manifest = generated(AcceleratorConfig(rows=2, cols=2), "array")
    drive = [[p["name"], p["width"]] for p in manifest["ports"] if p["dir"] == "in" and p["name"] not in ("clk", "rst")]
    with pytest.raises(runner.CosimFailure) as info:
        runner.run([vfile], module, "dnnfab.cosim.tb_selftest", sim=sim, params={"cycles": CYCLES, "drive": drive})
    msg = str(info.value)
    m = re.search(r"waveform: (\S+) \(([0-9.]+) MB, from (\d+) ns on\)", msg)
    assert m, msg
    wave = Path(m.group(1))
    assert wave.exists()
    return wave, float(m.group(2)), int(m.group(3))


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
def test_failure_waveform_is_a_window(sim, monkeypatch):
    wave, mb, start = _fail(sim, WINDOW_NS, monkeypatch)
    end = CYCLES * 10
    assert end - WINDOW_NS - 100 <= start <= end - WINDOW_NS + 100, start
    assert abs(mb - wave.stat().st_size / 1e6) < 0.1
    if wave.suffix == ".vcd":
        # every timestamp lies in the window (VCD times in the 1 ps precision)
        times = [int(line[1:]) for line in wave.read_text().splitlines() if line.startswith("#")]
        assert times and min(times) >= start * 1000 and max(times) <= (end + 100) * 1000
        assert len(times) <= 2 * (WINDOW_NS // 10) + 10
    else:
        # FST is binary: compare with the full-length dump of the same run (same file)
        window_size = wave.stat().st_size
        full, _, full_start = _fail(sim, 10 ** 12, monkeypatch)
        assert full_start == 0
        assert full.stat().st_size > 5 * window_size, (full.stat().st_size, window_size)

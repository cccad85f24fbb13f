"""RTL fuzzing in CI: random layers (fixed seeds) and the headline benchmark layer through
the generated accelerator, each bit-exact with the reference, finished within a watchdog
set from the fast model, and within 2 % of the fast model's cycles
(:mod:`dnnfab.cosim.fuzz`; ``scripts/fuzz_rtl.py`` runs the same check at any count)."""

import json

import numpy as np
import pytest

from presets import CFG_8, CFG_SMALL
from dnnfab.cosim import runner
from dnnfab.cosim.fuzz import (BENCH_LAYER, KINDS, draw_cases, estimate, fuzz, layer_from_spec,
                               scalesim_ws_cycles, with_limit)

pytestmark = [pytest.mark.cosim,
              pytest.mark.skipif(not runner.available("verilator"), reason="verilator not installed")]

CFG_DEFAULT = CFG_8      # 64 KiB scratchpads, 128-bit bus


def _report(out):
    return "\n".join(json.dumps({k: v for k, v in f.items() if k != "config"}) for f in out["failures"])


def test_fuzz_default_config_and_benchmark_layer():
    """40 random layers on the default 8x8 accelerator plus the benchmark layer
    (18x18x64 -> 64, 3x3: the layer that deadlocked at count 3 of the l2c token)."""
    cases, _ = draw_cases(CFG_DEFAULT, 40, seed=20261201)
    assert {s["name"] for s, _ in cases} == set(KINDS)
    bench_est = estimate(CFG_DEFAULT, BENCH_LAYER)
    cases.append((with_limit(BENCH_LAYER, bench_est), bench_est))
    out = fuzz(CFG_DEFAULT, cases, progress=False)
    assert not out["failures"], _report(out)
    assert out["passed"] == 41
    bench = out["results"][-1]
    assert bench["layer"]["hw"] == [18, 18] and bench["ok"]
    scalesim, physical = scalesim_ws_cycles(layer_from_spec(BENCH_LAYER)[0], CFG_DEFAULT)
    # the benchmark's figures (benchmarks/bench_layer_8x8.json: 150,185 cycles)
    assert physical <= bench["rtl_cycles"] <= 0.97 * scalesim, (bench["rtl_cycles"], scalesim)


def test_fuzz_small_config():
    """15 random layers on small scratchpads (several bands, K chunks, slot rings)."""
    cases, _ = draw_cases(CFG_SMALL, 15, seed=20261202)
    out = fuzz(CFG_SMALL, cases, progress=False)
    assert not out["failures"], _report(out)
    assert out["passed"] == 15

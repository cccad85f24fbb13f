"""The accelerator's CSR bank (generated Verilog) under cocotb's AxiLiteMaster, and the C header."""

import shutil
import subprocess

import pytest

from dnnfab.hw.config import AcceleratorConfig, PRESETS
from dnnfab.hw.csr import c_header
from dnnfab.hw.regmap import accelerator_regmap
from dnnfab.cosim import runner
from dnnfab.cosim.harness import csr_bank_verilog

SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]


@pytest.mark.cosim
@pytest.mark.parametrize("sim", SIMS)
@pytest.mark.parametrize("stalls", [False, True], ids=["nostall", "stall"])
def test_csr_bank(sim, stalls):
    cfg = AcceleratorConfig()
    regmap = accelerator_regmap(cfg)
    vfile, module = csr_bank_verilog(regmap)
    params = {"regmap": regmap.to_json(), "stalls": stalls, "seed": 7 + stalls}
    result = runner.run([vfile], module, "dnnfab.cosim.tb_csr", sim=sim, params=params)
    assert result.tests == 1 and result.failed == 0


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
@pytest.mark.parametrize("preset", list(PRESETS))
def test_c_header_compiles(preset, tmp_path):
    cfg = PRESETS[preset]
    regmap = accelerator_regmap(cfg)
    (tmp_path / "regs.h").write_text(c_header(regmap, cfg))
    c = tmp_path / "use.c"
    c.write_text(
        '#include <stdint.h>\n#include "regs.h"\n#include "regs.h"  /* include guard */\n'
        "_Static_assert(DNNFAB_ID_RESET == 0x444E4E46u, \"magic\");\n"
        f"_Static_assert(DNNFAB_CFG_ROWS == {cfg.rows}u, \"rows\");\n"
        f"_Static_assert(DNNFAB_CFG_BUS_BYTES == {cfg.bus_bytes}u, \"bus\");\n"
        f"_Static_assert(DNNFAB_STATUS_OFFSET == {regmap['STATUS'].offset}u, \"status\");\n"
        "_Static_assert((DNNFAB_STATUS_ERROR_CODE_MASK >> DNNFAB_STATUS_ERROR_CODE_SHIFT) == 0xFFu, \"field\");\n"
        "_Static_assert(DNNFAB_ERR_OUT_WINDOW == 5u, \"err\");\n"
        "static const char *df = DNNFAB_CFG_DATAFLOW;\n"
        "static const double mhz = DNNFAB_CFG_CLOCK_MHZ;\n"
        "uint32_t cycles_lo(volatile uint32_t *r) { (void)df; (void)mhz;\n"
        "  return r[DNNFAB_CYCLES_LO_OFFSET / 4] + r[DNNFAB_CTRL_OFFSET / 4]; }\n")
    proc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", str(c)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_regmap_json_and_checks():
    cfg = AcceleratorConfig()
    rm = accelerator_regmap(cfg)
    js = rm.to_json()
    names = [r["name"] for r in js["registers"]]
    for need in ("ID", "VERSION", "CONFIG0", "CONFIG1", "CTRL", "STATUS", "ERROR_INFO", "IRQ_ENABLE",
                 "IRQ_STATUS", "PROG_BASE", "PROG_LEN", "OUT_LO", "OUT_HI", "CYCLES_LO", "CYCLES_HI",
                 "BUSY_CYCLES_LO", "MACS_LO", "DMA_RD_BYTES_LO", "DMA_WR_BYTES_LO", "STALL_CYCLES_LO",
                 "INSNS_HI"):
        assert need in names, need
    assert js["constants"]["ERR"]["PROG_FETCH"] == 6
    offsets = [r["offset"] for r in js["registers"]]
    assert len(set(offsets)) == len(offsets) and all(o % 4 == 0 for o in offsets)
    c0 = rm["CONFIG0"].reset
    assert c0 & 0xFF == cfg.rows and (c0 >> 8) & 0xFF == cfg.cols and (c0 >> 16) & 0xFF == cfg.bus_bytes

"""Board descriptions: completeness, sources, agreement with amaranth-boards, CLI."""

import json

import pytest

from dnnfab import cli
from dnnfab.boards import list_boards, get_board, RESOURCE_NAMES
from dnnfab.errors import ConfigError

REQUIRED = ("ulx3s-85f", "orangecrab-25f", "icebreaker", "pynq-z2", "arty-z7-20")


def test_required_boards_present():
    ids = [b.id for b in list_boards()]
    for name in REQUIRED:
        assert name in ids


@pytest.mark.parametrize("board", REQUIRED)
def test_every_section_has_numbers_and_a_source(board):
    b = get_board(board)
    for k in ("lut", "ff", "dsp", "bram"):
        assert isinstance(b.resources[k], int) and b.resources[k] > 0, k
    assert set(b.resources) - {"bram_kbits", "spram_kbits", "lutram_kbits"} <= set(RESOURCE_NAMES)
    assert b.clock_mhz > 0 and b.clock_basis
    assert b.fpga.source and b.resources_source
    for section in (b.dram, b.host, b.power):
        assert section.get("source"), section
    for k in ("width_bits", "peak_mb_s"):
        assert k in b.dram
    for k in ("cores", "clock_mhz"):
        assert k in b.host
    for k in ("fpga_static_w", "pj_per_mac", "pj_per_sram_byte", "dram_pj_per_byte",
              "host_active_w_per_core", "board_idle_w"):
        assert b.power[k] >= 0
    if b.power.get("model") == "dnnfab-metrics-1":
        # the metric model's figures: every number carries its own source
        for sec in ("power", "cpu_model", "launch", "transfer", "local_host"):
            for k, v in b.section(sec).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    assert b.section(sec).get(f"{k}_source"), f"[{sec}] {k} has no source"
    else:
        assert "estimate" in b.power["basis"]      # power figures say they are estimates


def test_facts_from_the_brief():
    assert get_board("ulx3s-85f").fpga.full_part == "LFE5U-85F-6CABGA381"
    assert get_board("orangecrab-25f").fpga.full_part.startswith("LFE5U-25F-8")
    ice = get_board("icebreaker")
    assert (ice.fpga.part, ice.resources["dsp"]) == ("iCE40UP5K", 8)
    for z in ("pynq-z2", "arty-z7-20"):
        b = get_board(z)
        assert b.fpga.part == "XC7Z020" and b.host["cores"] == 2 and "Cortex-A9" in b.host["cpu"]
        assert not b.has_open_pnr


def test_aliases_and_case():
    assert get_board("ULX3S").id == "ulx3s-85f"
    assert get_board("pynq").id == "pynq-z2"


def test_unknown_board_lists_known_ones():
    with pytest.raises(ConfigError) as exc:
        get_board("de10-nano")
    for name in REQUIRED:
        assert name in str(exc.value)


#: amaranth-boards spells packages by ordering code; nextpnr by package name.
_PKG = {"BG381": "CABGA381", "MG285": "CSFBGA285", "SG48": "SG48", "CLG400": "CLG400"}


@pytest.mark.parametrize("board", REQUIRED)
def test_agrees_with_amaranth_boards(board):
    import importlib
    import amaranth_boards  # noqa: F401 - a test dependency (pyproject [test])
    b = get_board(board)
    assert b.amaranth_board, f"{board} names no amaranth-boards platform to check against"
    mod, cls = b.amaranth_board.split(":")
    plat = getattr(importlib.import_module(mod), cls)()
    assert plat.device.upper() == b.fpga.part.upper()
    assert _PKG[plat.package.upper()] == b.fpga.package.upper()
    assert str(getattr(plat, "speed", "") or "") == b.fpga.speed
    assert plat.default_clk_frequency / 1e6 == pytest.approx(b.oscillator_mhz)


def test_cli_boards_table_and_json(capsys):
    assert cli.main(["boards"]) == 0
    out = capsys.readouterr().out
    for name in REQUIRED:
        assert name in out
    assert cli.main(["boards", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d["id"] for d in data} >= set(REQUIRED)
    assert all(d["resources"]["dsp"] > 0 for d in data)


def test_cli_unknown_board_one_line(capsys):
    assert cli.main(["synth", "--board", "nope", "--rows", "2", "--cols", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "unknown board" in err[0] and "ulx3s-85f" in err[0]

